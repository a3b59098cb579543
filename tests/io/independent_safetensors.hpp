// An independent safetensors writer for the reader tests, written from the format's description and not
// from src/io: files laid out as the reference implementation lays them out (tensors ordered by
// alignment, largest element first, then by name; the header JSON written by hand, padded with spaces to
// a multiple of 8; "__metadata__" first when there is any), and the multi-file index as
// transformers' save_pretrained writes it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wb::testing {

struct ForeignTensor {
  std::string name;
  std::string dtype;  // as the format spells it: "BF16", "F32", "F8_E4M3", ...
  std::vector<std::int64_t> shape;
  std::string bytes;  // little-endian, row-major
};

/// Element size of a format dtype name (the ones the tests use).
inline std::size_t foreign_element_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  return 1;
}

/// A JSON string literal (quotes, backslashes and control characters escaped).
inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xF];
      out += hex[c & 0xF];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// The bytes of a .safetensors file holding `tensors`.
inline std::string safetensors_file(std::vector<ForeignTensor> tensors,
                                    const std::map<std::string, std::string>& metadata = {}) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const ForeignTensor& a, const ForeignTensor& b) {
    const std::size_t sa = foreign_element_size(a.dtype), sb = foreign_element_size(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      header += (first ? "" : ",") + json_string(key) + ":" + json_string(value);
      first = false;
    }
    header += "}";
  }
  std::string data;
  for (const ForeignTensor& tensor : tensors) {
    if (header.size() > 1) header += ",";
    header += json_string(tensor.name) + ":{\"dtype\":" + json_string(tensor.dtype) + ",\"shape\":[";
    for (std::size_t a = 0; a < tensor.shape.size(); ++a) header += (a ? "," : "") + std::to_string(tensor.shape[a]);
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + tensor.bytes.size()) + "]}";
    data += tensor.bytes;
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string file(8, '\0');
  for (int b = 0; b < 8; ++b) file[b] = static_cast<char>((static_cast<std::uint64_t>(header.size()) >> (8 * b)) & 0xFF);
  return file + header + data;
}

/// A model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {tensor: shard}}.
inline std::string safetensors_index(const std::map<std::string, std::string>& weight_map, std::uint64_t total_size) {
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size) +
                    "\n  },\n  \"weight_map\": {";
  bool first = true;
  for (const auto& [tensor, shard] : weight_map) {
    out += std::string(first ? "" : ",") + "\n    " + json_string(tensor) + ": " + json_string(shard);
    first = false;
  }
  return out + "\n  }\n}\n";
}

}  // namespace wb::testing
