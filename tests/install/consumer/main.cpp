// Uses the installed headers and library: a strided copy through tensor views and a dtype lookup.
#include <weightbridge/dtype.hpp>
#include <weightbridge/tensor.hpp>

#include <cstdio>
#include <cstdint>
#include <vector>

int main() {
  std::vector<std::uint16_t> source = {1, 2, 3, 4, 5, 6}, target(6);
  auto src = wb::TensorView::contiguous(source.data(), wb::DType::kBF16, {2, 3});
  auto dst = wb::TensorView::contiguous(target.data(), wb::DType::kBF16, {3, 2});
  wb::copy_tensor(dst.transpose(0, 1), src);
  const bool ok = target == std::vector<std::uint16_t>{1, 4, 2, 5, 3, 6} && wb::dtype_size(*wb::parse_dtype("bf16")) == 2;
  std::printf("consumer: %s\n", ok ? "ok" : "wrong result");
  return ok ? 0 : 1;
}
