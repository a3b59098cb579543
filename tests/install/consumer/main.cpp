// Uses the installed headers and library: a strided copy through tensor views, one expert of a stacked
// tensor, a dtype lookup, and the adapters' header (with MPI's), as an integrator's trainer would.
#include <weightbridge/adapter.hpp>
#include <weightbridge/dtype.hpp>
#include <weightbridge/tensor.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  std::vector<std::uint16_t> source = {1, 2, 3, 4, 5, 6}, target(6);
  auto src = wb::TensorView::contiguous(source.data(), wb::DType::kBF16, {2, 3});
  auto dst = wb::TensorView::contiguous(target.data(), wb::DType::kBF16, {3, 2});
  wb::copy_tensor(dst.transpose(0, 1), src);
  std::vector<std::uint16_t> expert(3);
  wb::copy_tensor(wb::TensorView::contiguous(expert.data(), wb::DType::kBF16, {3}), src.select(0, 1));
  wb::AdapterOptions options;  // compiles against <mpi.h> through the package's MPI dependency
  options.timeout_seconds = 0;
  int mpi_initialized = 1;
  MPI_Initialized(&mpi_initialized);  // links MPI (callable before MPI_Init)
  const bool ok = target == std::vector<std::uint16_t>{1, 4, 2, 5, 3, 6} &&
                  expert == std::vector<std::uint16_t>{4, 5, 6} && wb::dtype_size(*wb::parse_dtype("bf16")) == 2 &&
                  mpi_initialized == 0 && options.timeout_seconds == 0.0;
  std::printf("consumer: %s\n", ok ? "ok" : "wrong result");
  return ok ? 0 : 1;
}
