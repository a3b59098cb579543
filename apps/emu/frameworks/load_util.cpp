#include "emu/frameworks/load_util.hpp"

#include <cstddef>
#include <memory>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::emu {

void load_box(const CheckpointReader& checkpoint, std::string_view tensor, const Box& box,
              const TensorView& destination) {
  const TensorInfo& info = checkpoint.info(tensor);
  if (info.dtype != destination.dtype)
    throw Error(ErrorCode::kInvalidArgument, "load of " + std::string(tensor) + ": checkpoint dtype " +
                                                 std::string(dtype_name(info.dtype)) + " but parameter dtype " +
                                                 std::string(dtype_name(destination.dtype)));
  if (box.extent != destination.shape)
    throw Error(ErrorCode::kInvalidArgument, "load of " + std::string(tensor) + ": box " + box.to_string() +
                                                 " does not match destination shape " +
                                                 shape_to_string(destination.shape));
  if (destination.is_contiguous()) {
    checkpoint.read_box(tensor, box, destination.data);
    return;
  }
  const std::size_t bytes = static_cast<std::size_t>(box.numel()) * dtype_size(info.dtype);
  std::unique_ptr<std::byte[]> scratch(new std::byte[bytes]);
  checkpoint.read_box(tensor, box, scratch.get());
  copy_tensor(destination, TensorView::contiguous(scratch.get(), info.dtype, box.extent));
}

void load_tensor(const CheckpointReader& checkpoint, std::string_view tensor, const TensorView& destination) {
  load_box(checkpoint, tensor, Box::whole(checkpoint.info(tensor).shape), destination);
}

Box row_box(const Shape& shape, std::int64_t row_start, std::int64_t rows) {
  Box box = Box::whole(shape);
  box.offset[0] = row_start;
  box.extent[0] = rows;
  return box;
}

Box column_box(const Shape& shape, std::int64_t col_start, std::int64_t cols) {
  Box box = Box::whole(shape);
  box.offset[1] = col_start;
  box.extent[1] = cols;
  return box;
}

}  // namespace wb::emu
