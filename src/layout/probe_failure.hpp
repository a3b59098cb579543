// The probe's one error: which parameter element, and that load_weights did not copy a checkpoint element
// there; the probe's own finding follows in parentheses, for whoever debugs the loader.
#pragma once

#include <cstdint>
#include <string>

#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::layout {

inline std::string index_text(const Shape& shape, std::int64_t flat) {
  Shape index(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    index[a] = shape[a] == 0 ? 0 : flat % shape[a];
    flat = shape[a] == 0 ? 0 : flat / shape[a];
  }
  return shape_to_string(index);
}

// What the user reads when load_weights computed a value instead of copying it.
inline constexpr const char* kComputed =
    "the value load_weights wrote there is not a checkpoint value: it was computed (scaled, converted, combined "
    "or made up), not copied";

/// Throws wb::Error (kInvalidArgument) naming the parameter and element `flat` of it.
[[noreturn]] inline void not_a_copy(const Parameter& param, std::int64_t flat, const std::string& what,
                                    const std::string& detail) {
  throw Error(ErrorCode::kInvalidArgument, "load_weights is not a pure copy: parameter " + param.name + ", element " +
                                               index_text(param.view.shape, flat) + ": " + what + " (probe: " + detail + ")");
}

}  // namespace wb::layout
