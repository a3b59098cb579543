// Test support: copy lists for the copy compiler's back ends (tests/unit/test_copy_work.cpp on the host,
// tests/gpu/test_copy_kernel.cpp on a device): random and named lists over stored tensors (transposed,
// permuted, fused layouts; 1/2/4/8-byte elements; unaligned buffer offsets), memory to run them on, and the
// element-by-element definition to compare with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "exec/copy_compiler.hpp"
#include "plan/round_schedule.hpp"
#include "schedule_replay.hpp"

namespace wb::testing_support {

using exec::CopyDirection;

// --- copy lists ------------------------------------------------------------------------------------------

// A parameter: a tensor of `shape` (checkpoint axis order) stored with its axes in `order` (outermost
// first: a permutation is a transposed layout) and `ways` tensors interleaved along the innermost stored
// axis (a fused layout); `element` bytes per element.
struct StoredTensor {
  Shape shape;
  std::vector<int> order;
  std::int64_t ways = 1;
  int element = 2;

  std::int64_t bytes() const { return shape_numel(shape) * ways * element; }
  // Strides of the checkpoint axes in parameter elements, for the tensor interleaved at position 0.
  Shape strides() const {
    Shape strides(shape.size());
    std::int64_t stride = ways;
    for (std::size_t k = order.size(); k-- > 0;) {
      strides[static_cast<std::size_t>(order[k])] = stride;
      stride *= shape[static_cast<std::size_t>(order[k])];
    }
    return strides;
  }
  // Box `box` of interleaved tensor `way`, as a copy (buffer offset set later).
  BufferCopy copy_of(std::uint32_t parameter, const Box& box, std::int64_t way) const {
    BufferCopy c;
    c.copy.parameter = parameter;
    c.copy.box = box;
    c.copy.strides = strides();
    c.copy.offset = way;
    for (std::size_t a = 0; a < shape.size(); ++a) c.copy.offset += box.offset[a] * c.copy.strides[a];
    c.element_bytes = static_cast<std::uint8_t>(element);
    return c;
  }
};

struct CopyList {
  std::string name;
  std::vector<std::int64_t> parameter_bytes;
  std::vector<BufferCopy> copies;
  std::int64_t buffer_bytes = 0;
};

// Cuts `shape` into boxes along every axis (at most `pieces` per axis) and keeps each with probability
// `keep`: boxes of one tensor never share an element.
inline std::vector<Box> random_boxes(const Shape& shape, int pieces, double keep, std::mt19937_64& random) {
  std::vector<std::vector<std::int64_t>> cuts(shape.size());
  for (std::size_t a = 0; a < shape.size(); ++a) {
    cuts[a] = {0, shape[a]};
    const int extra = static_cast<int>(random() % static_cast<unsigned>(pieces));
    for (int i = 0; i < extra && shape[a] > 1; ++i)
      cuts[a].push_back(1 + static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(shape[a] - 1)));
    std::sort(cuts[a].begin(), cuts[a].end());
    cuts[a].erase(std::unique(cuts[a].begin(), cuts[a].end()), cuts[a].end());
  }
  std::vector<Box> boxes;
  std::vector<std::size_t> at(shape.size(), 0);
  std::uniform_real_distribution<double> coin(0, 1);
  for (;;) {
    Box box;
    for (std::size_t a = 0; a < shape.size(); ++a) {
      box.offset.push_back(cuts[a][at[a]]);
      box.extent.push_back(cuts[a][at[a] + 1] - cuts[a][at[a]]);
    }
    if (coin(random) < keep) boxes.push_back(box);
    std::size_t a = shape.size();
    while (a-- > 0) {
      if (++at[a] + 1 < cuts[a].size()) break;
      at[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) break;
  }
  return boxes;
}

// Lays the copies out in the buffer in a random order, with gaps of 0..max_gap bytes (unaligned offsets).
inline void place_in_buffer(CopyList& list, int max_gap, std::mt19937_64& random) {
  std::vector<std::size_t> order(list.copies.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), random);
  std::int64_t at = 0;
  for (std::size_t i : order) {
    at += max_gap > 0 ? static_cast<std::int64_t>(random() % static_cast<unsigned>(max_gap + 1)) : 0;
    list.copies[i].buffer_offset = at;
    at += list.copies[i].bytes();
  }
  list.buffer_bytes = at + 29;
}

inline CopyList from_tensors(std::string name, const std::vector<StoredTensor>& tensors, int pieces, double keep, int max_gap,
                      std::uint64_t seed) {
  std::mt19937_64 random(seed);
  CopyList list;
  list.name = std::move(name);
  for (std::size_t p = 0; p < tensors.size(); ++p) {
    list.parameter_bytes.push_back(tensors[p].bytes());
    for (std::int64_t way = 0; way < tensors[p].ways; ++way)
      for (const Box& box : random_boxes(tensors[p].shape, pieces, keep, random))
        list.copies.push_back(tensors[p].copy_of(static_cast<std::uint32_t>(p), box, way));
  }
  place_in_buffer(list, max_gap, random);
  return list;
}

inline StoredTensor random_tensor(std::mt19937_64& random, std::int64_t max_extent) {
  StoredTensor t;
  const int ndim = 1 + static_cast<int>(random() % 3);
  for (int a = 0; a < ndim; ++a) t.shape.push_back(1 + static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(max_extent)));
  while (shape_numel(t.shape) > (std::int64_t{1} << 20)) *std::max_element(t.shape.begin(), t.shape.end()) /= 2;
  t.order.resize(static_cast<std::size_t>(ndim));
  std::iota(t.order.begin(), t.order.end(), 0);
  if (random() % 2) std::shuffle(t.order.begin(), t.order.end(), random);
  t.ways = random() % 3 == 0 ? 2 : 1;
  const int elements[] = {1, 2, 4, 8};
  t.element = elements[random() % 4];
  return t;
}

inline std::vector<CopyList> random_lists(int count, std::uint64_t seed) {
  std::vector<CopyList> lists;
  std::mt19937_64 random(seed);
  for (int i = 0; i < count; ++i) {
    std::vector<StoredTensor> tensors(1 + random() % 4);
    const std::int64_t max_extent = i % 3 == 0 ? 7 : i % 3 == 1 ? 70 : 300;
    for (StoredTensor& t : tensors) t = random_tensor(random, max_extent);
    lists.push_back(from_tensors("random_" + std::to_string(i), tensors, 4, 0.85, i % 2 ? 19 : 0, seed + 97 * i));
  }
  return lists;
}

inline StoredTensor tensor(Shape shape, std::vector<int> order, int element, std::int64_t ways = 1) {
  return {std::move(shape), std::move(order), ways, element};
}

// Cases that decide the decomposition, small and multi-MiB.
inline std::vector<CopyList> named_lists() {
  std::vector<CopyList> lists;
  lists.push_back(from_tensors("contiguous_4mib", {tensor({4 << 20}, {0}, 1)}, 3, 1.0, 0, 1));
  lists.push_back(from_tensors("contiguous_unaligned", {tensor({(3 << 20) + 5}, {0}, 1)}, 4, 1.0, 13, 2));
  lists.push_back(from_tensors("rows_bf16", {tensor({512, 1024}, {0, 1}, 2)}, 3, 1.0, 0, 3));
  lists.push_back(from_tensors("column_boxes_bf16", {tensor({256, 4096}, {0, 1}, 2)}, 6, 0.7, 6, 4));
  lists.push_back(from_tensors("transposed_bf16_3mib", {tensor({1024, 1536}, {1, 0}, 2)}, 1, 1.0, 0, 5));
  lists.push_back(from_tensors("transposed_boxes_bf16", {tensor({128, 4096}, {1, 0}, 2)}, 4, 1.0, 2, 6));
  lists.push_back(from_tensors("transposed_u8", {tensor({333, 517}, {1, 0}, 1)}, 3, 1.0, 5, 7));
  lists.push_back(from_tensors("transposed_f32_unaligned", {tensor({130, 200}, {1, 0}, 4)}, 3, 1.0, 3, 8));
  lists.push_back(from_tensors("transposed_f64", {tensor({300, 700}, {1, 0}, 8)}, 2, 1.0, 0, 9));
  lists.push_back(from_tensors("transposed_f64_odd_offsets", {tensor({65, 47}, {1, 0}, 8)}, 3, 1.0, 7, 10));
  lists.push_back(from_tensors("permuted_3d_f32_4mib", {tensor({8, 256, 520}, {2, 0, 1}, 4)}, 3, 1.0, 0, 11));
  lists.push_back(from_tensors("permuted_3d_bf16", {tensor({12, 33, 70}, {1, 2, 0}, 2)}, 3, 1.0, 4, 12));
  lists.push_back(from_tensors("fused_interleaved", {tensor({64, 96}, {0, 1}, 2, 2), tensor({40, 48}, {1, 0}, 4, 2)}, 3, 1.0, 0, 13));
  lists.push_back(from_tensors("mixed_parameters",
                               {tensor({3}, {0}, 8), tensor({1000, 3}, {0, 1}, 1), tensor({77, 5, 9}, {2, 1, 0}, 2),
                                tensor({1, 1}, {0, 1}, 4), tensor({2048, 1}, {1, 0}, 2)},
                               3, 0.9, 11, 14));
  return lists;
}

// --- references ------------------------------------------------------------------------------------------

inline Bytes random_bytes(std::size_t size, std::uint64_t seed) {
  Bytes bytes(size);
  std::mt19937_64 random(seed);
  for (auto& b : bytes) b = static_cast<std::byte>(random());
  return bytes;
}

inline std::vector<std::byte*> addresses(std::vector<Bytes>& parameters) {
  std::vector<std::byte*> out;
  for (Bytes& p : parameters) out.push_back(p.data());
  return out;
}

// The element-by-element definition: copies in list order, element by element.
inline void reference(CopyDirection direction, const std::vector<BufferCopy>& copies, std::vector<Bytes>& parameters, Bytes& buffer) {
  for (const BufferCopy& c : copies)
    for_each_element(c.copy.box, [&](std::span<const std::int64_t> index, std::int64_t ordinal) {
      std::byte* param = parameters[c.copy.parameter].data() + element_position(c.copy, index) * c.element_bytes;
      std::byte* buf = buffer.data() + c.buffer_offset + ordinal * c.element_bytes;
      if (direction == CopyDirection::kPack)
        std::memcpy(buf, param, c.element_bytes);
      else
        std::memcpy(param, buf, c.element_bytes);
    });
}

inline ::testing::AssertionResult same_bytes(const Bytes& expected, const Bytes& actual, const std::string& what) {
  if (expected.size() != actual.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  const auto [e, a] = std::mismatch(expected.begin(), expected.end(), actual.begin());
  if (e == expected.end()) return ::testing::AssertionSuccess();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) wrong += expected[i] != actual[i];
  return ::testing::AssertionFailure() << what << ": " << wrong << " of " << expected.size() << " bytes differ, first at byte "
                                       << (e - expected.begin()) << " (expected " << int(*e) << ", got " << int(*a) << ")";
}

// The state before a copy: random sources, a fill pattern in the destinations (it must survive in gaps).
struct Memory {
  std::vector<Bytes> parameters;
  Bytes buffer;
  Memory(const CopyList& list, CopyDirection direction, std::uint64_t seed) {
    const bool pack = direction == CopyDirection::kPack;
    for (std::size_t p = 0; p < list.parameter_bytes.size(); ++p)
      parameters.push_back(pack ? random_bytes(static_cast<std::size_t>(list.parameter_bytes[p]), seed + p)
                                : Bytes(static_cast<std::size_t>(list.parameter_bytes[p]), std::byte{0xEE}));
    buffer = pack ? Bytes(static_cast<std::size_t>(list.buffer_bytes), std::byte{0xCD})
                  : random_bytes(static_cast<std::size_t>(list.buffer_bytes), seed + 1000);
  }
};

inline ::testing::AssertionResult same_memory(const Memory& expected, const Memory& actual, const std::string& what) {
  for (std::size_t p = 0; p < expected.parameters.size(); ++p)
    if (auto r = same_bytes(expected.parameters[p], actual.parameters[p], what + ", parameter " + std::to_string(p)); !r)
      return r;
  return same_bytes(expected.buffer, actual.buffer, what + ", buffer");
}

inline const char* name_of(CopyDirection direction) { return direction == CopyDirection::kPack ? "pack" : "assemble"; }

}  // namespace wb::testing_support
