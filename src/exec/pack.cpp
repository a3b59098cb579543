// The CPU copy program (see pack.hpp): each compiled copy (exec/copy_compiler.hpp) becomes an op,
//   - a transpose when its run is one 1/2/4/8-byte element and some outer axis is contiguous in the
//     parameter (stride == run) while the innermost outer axis is contiguous in the buffer: the pair is
//     copied by the blocked transpose (exec/cpu_transpose.cpp), the remaining axes loop around it;
//   - otherwise runs (exec/cpu_runs.cpp).
// For assemble a transpose changes the order of the writes, so it is used only when the op cannot write
// an element twice (checked on the op's strides); otherwise the runs keep the row-major order of the
// definition.
#include "exec/pack.hpp"

#include <algorithm>

#include "exec/cpu_copy_kernels.hpp"

namespace wb::exec {

CopyProgram::CopyProgram(CopyDirection direction, std::span<const BufferCopy> copies,
                         std::span<const std::int64_t> parameter_bytes, std::int64_t buffer_bytes,
                         CopyProgramOptions options)
    : CopyProgram(compile_copies(direction, copies, parameter_bytes, buffer_bytes), options) {}

CopyProgram::CopyProgram(const CompiledCopies& compiled, CopyProgramOptions options) : direction_(compiled.direction) {
  using i64 = std::int64_t;
  const bool pack = direction_ == CopyDirection::kPack;
  stats_.copies = compiled.input_copies;
  stats_.bytes = compiled.bytes;
  stats_.reordered = compiled.destinations == Destinations::kDisjoint;
  const bool streaming = options.stores == StoreHint::kStreaming ||
                         (options.stores == StoreHint::kAuto && stats_.bytes >= CopyProgramOptions::kStreamingProgramBytes);
  auto oriented = [pack](const ByteAxis& a) {
    return pack ? Axis{a.extent, a.param_stride, a.buffer_stride} : Axis{a.extent, a.buffer_stride, a.param_stride};
  };
  ops_.reserve(compiled.copies.size());
  for (const ByteCopy& n : compiled.copies) {
    Op op;
    op.parameter = n.parameter;
    op.param_offset = n.param_offset;
    op.buffer_offset = n.buffer_offset;
    op.run = n.run;
    op.axis_begin = static_cast<std::uint32_t>(axes_.size());
    // A transpose: one-element runs, the innermost axis (buffer-contiguous) strided in the parameter, and
    // another axis contiguous in the parameter.
    std::size_t k = n.axes.size();
    if ((n.run == 1 || n.run == 2 || n.run == 4 || n.run == 8) && n.axes.size() >= 2 &&
        (pack || n.writes_each_parameter_byte_once())) {
      for (std::size_t a = 0; a + 1 < n.axes.size(); ++a)
        if (n.axes[a].param_stride == n.run) k = a;
    }
    if (k < n.axes.size()) {
      const ByteAxis& ax = n.axes[k];      // contiguous in the parameter
      const ByteAxis& aj = n.axes.back();  // contiguous in the buffer
      op.kind = Kind::kTranspose;
      if (pack) {  // source: the parameter, rows along j
        op.rows = aj.extent, op.cols = ax.extent;
        op.src_row_stride = aj.param_stride, op.dst_row_stride = ax.buffer_stride;
      } else {  // source: the buffer, rows along k
        op.rows = ax.extent, op.cols = aj.extent;
        op.src_row_stride = ax.buffer_stride, op.dst_row_stride = aj.param_stride;
      }
      for (std::size_t a = 0; a + 1 < n.axes.size(); ++a)
        if (a != k) axes_.push_back(oriented(n.axes[a]));
      op.streaming = streaming;
      stats_.streaming = stats_.streaming || op.streaming;
      ++stats_.transpose_ops;
      stats_.transpose_elements += n.bytes() / n.run;
    } else {
      op.kind = Kind::kRuns;
      for (const ByteAxis& a : n.axes) axes_.push_back(oriented(a));
      op.streaming = streaming && n.run >= CopyProgramOptions::kStreamingMinRunBytes;
      // Prefetch ~4 KiB ahead when the innermost loop jumps in the source (pack of a column box).
      if (!n.axes.empty() && n.run > 64 && n.run <= 4096) {
        const Axis& inner = axes_.back();
        if (inner.src_stride != n.run && inner.extent > 1)
          op.prefetch_runs = static_cast<std::int32_t>(std::max<i64>(1, 4096 / n.run));
      }
      stats_.streaming = stats_.streaming || op.streaming;
      ++stats_.run_ops;
      stats_.runs += n.bytes() / n.run;
    }
    op.axis_count = static_cast<std::uint16_t>(axes_.size() - op.axis_begin);
    ops_.push_back(op);
  }
  stats_.ops = static_cast<std::int64_t>(ops_.size());
}

void CopyProgram::execute(std::span<std::byte* const> parameters, std::byte* buffer) const noexcept {
  const bool pack = direction_ == CopyDirection::kPack;
  for (const Op& op : ops_) {
    std::byte* param = parameters[op.parameter] + op.param_offset;
    std::byte* buf = buffer + op.buffer_offset;
    const std::byte* src = pack ? param : buf;
    std::byte* dst = pack ? buf : param;
    const Axis* axes = axes_.data() + op.axis_begin;
    if (op.kind == Kind::kRuns)
      cpu::execute_runs(op, axes, src, dst);
    else
      cpu::execute_transpose(op, axes, src, dst);
  }
  if (stats_.streaming) cpu::fence_streaming_stores();
}

}  // namespace wb::exec
