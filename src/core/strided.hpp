// Internal helpers for strided copies of tensor views (src/core/tensor.cpp). Not part of the public API.
#pragma once

#include <cstddef>
#include <utility>

#include "weightbridge/tensor.hpp"

namespace wb::detail {

/// Merges adjacent axes that are contiguous in both views (outer stride == inner stride * inner
/// extent on both sides), so that long contiguous runs become one row. Axes of extent 1 are dropped;
/// the result has at least one axis ({1} with strides {1} for a single element).
inline void coalesce(Shape& shape, Shape& a, Shape& b) {
  Shape s, sa, sb;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!s.empty() && sa.back() == a[i] * shape[i] && sb.back() == b[i] * shape[i]) {
      s.back() *= shape[i];
      sa.back() = a[i];
      sb.back() = b[i];
    } else {
      s.push_back(shape[i]);
      sa.push_back(a[i]);
      sb.push_back(b[i]);
    }
  }
  if (s.empty()) {
    s = {1};
    sa = {1};
    sb = {1};
  }
  shape = std::move(s);
  a = std::move(sa);
  b = std::move(sb);
}

}  // namespace wb::detail
