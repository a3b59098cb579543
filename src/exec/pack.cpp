// The CPU copy program (see pack.hpp): each compiled copy (exec/copy_compiler.hpp) becomes an op,
//   - a transpose when its run is one 1/2/4/8-byte element and some outer axis is contiguous in the
//     parameter (stride == run) while the innermost outer axis is contiguous in the buffer: the pair is
//     copied by the blocked transpose (exec/cpu_transpose.cpp), the remaining axes loop around it;
//   - otherwise runs (exec/cpu_runs.cpp).
// For assemble a transpose changes the order of the writes, so it is used only when the op cannot write
// an element twice (checked on the op's strides); otherwise the runs keep the row-major order of the
// definition.
//
// Digesting (CopyProgramOptions::digest_segments), each op gets spans: its buffer range cut where segments
// begin and end, each naming the segment its bytes are digested into, or none where an op that runs
// earlier reads the same bytes (an assemble that installs a segment in two places digests it once).
#include "exec/pack.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <string>

#include "exec/cpu_copy_kernels.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

using i64 = std::int64_t;

// The parts of [begin, end) not in `claimed` (disjoint intervals: begin -> end), in order; then claims it.
std::vector<std::pair<i64, i64>> claim(std::map<i64, i64>& claimed, i64 begin, i64 end) {
  std::vector<std::pair<i64, i64>> free;
  auto it = claimed.upper_bound(begin);
  if (it != claimed.begin() && std::prev(it)->second > begin) --it;
  i64 at = begin, lo = begin, hi = end;
  while (it != claimed.end() && it->first < end) {
    if (it->first > at) free.emplace_back(at, it->first);
    at = std::max(at, it->second);
    lo = std::min(lo, it->first);
    hi = std::max(hi, it->second);
    it = claimed.erase(it);
  }
  if (at < end) free.emplace_back(at, end);
  claimed[lo] = hi;
  return free;
}

}  // namespace

CopyProgram::CopyProgram(CopyDirection direction, std::span<const BufferCopy> copies,
                         std::span<const std::int64_t> parameter_bytes, std::int64_t buffer_bytes,
                         CopyProgramOptions options)
    : CopyProgram(compile_copies(direction, copies, parameter_bytes, buffer_bytes), options) {}

CopyProgram::CopyProgram(const CompiledCopies& compiled, CopyProgramOptions options) : direction_(compiled.direction) {
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
  if (!options.digest_segments.empty()) add_digest_spans(compiled, options.digest_segments);
}

void CopyProgram::add_digest_spans(const CompiledCopies& compiled, std::span<const BufferRange> segments) {
  for (std::size_t i = 0; i < segments.size(); ++i)
    if (segments[i].offset < 0 || segments[i].bytes < 0 || (i > 0 && segments[i].offset < segments[i - 1].offset + segments[i - 1].bytes))
      throw Error(ErrorCode::kInvalidArgument, std::string(direction_name(direction_)) + " digest segment " + std::to_string(i) +
                                                   " (buffer offset " + std::to_string(segments[i].offset) + ", " +
                                                   std::to_string(segments[i].bytes) + " bytes) is not after the one before");
  // A pack whose destinations overlap: a later copy may overwrite bytes an earlier one wrote (and would have
  // digested), so its digests come from the buffer once every copy is done.
  if (direction_ == CopyDirection::kPack && compiled.destinations != Destinations::kDisjoint) {
    after_segments_.assign(segments.begin(), segments.end());
    return;
  }
  std::map<i64, i64> claimed;
  for (std::size_t o = 0; o < ops_.size(); ++o) {
    Op& op = ops_[o];
    const i64 begin = op.buffer_offset, end = begin + compiled.copies[o].bytes();
    op.span_begin = static_cast<std::uint32_t>(spans_.size());
    bool digests = false;
    const auto emit = [&](i64 from, i64 to, std::int32_t segment, i64 segment_offset) {
      if (from >= to) return;
      DigestSpan* last = spans_.size() > op.span_begin ? &spans_.back() : nullptr;
      if (last != nullptr && segment < 0 && last->segment < 0 && last->end == from) {
        last->end = to;
        return;
      }
      spans_.push_back({from, to, segment_offset, segment});
      digests = digests || segment >= 0;
    };
    i64 at = begin;
    for (const auto& [from, to] : claim(claimed, begin, end)) {
      emit(at, from, -1, 0);  // read by an earlier op, which digests it
      // The first segment that ends after `from`, and those after it that start before `to`.
      auto seg = std::upper_bound(segments.begin(), segments.end(), from,
                                  [](i64 x, const BufferRange& r) { return x < r.offset + r.bytes; });
      at = from;
      for (; seg != segments.end() && seg->offset < to; ++seg) {
        const i64 lo = std::max(at, seg->offset), hi = std::min(to, seg->offset + seg->bytes);
        emit(at, lo, -1, 0);  // between segments: no digest holds it
        emit(lo, hi, static_cast<std::int32_t>(seg - segments.begin()), seg->offset);
        at = hi;
      }
      emit(at, to, -1, 0);
      at = to;
    }
    emit(at, end, -1, 0);
    if (!digests) {  // nothing to digest here: the op runs as without digests
      spans_.resize(op.span_begin);
      continue;
    }
    op.span_count = static_cast<std::uint32_t>(spans_.size() - op.span_begin);
  }
}

void CopyProgram::execute(std::span<std::byte* const> parameters, std::byte* buffer, DigestSums* digests) const noexcept {
  const bool pack = direction_ == CopyDirection::kPack;
  for (const Op& op : ops_) {
    std::byte* param = parameters[op.parameter] + op.param_offset;
    std::byte* buf = buffer + op.buffer_offset;
    const std::byte* src = pack ? param : buf;
    std::byte* dst = pack ? buf : param;
    const Axis* axes = axes_.data() + op.axis_begin;
    cpu::DigestTarget target;
    const cpu::DigestTarget* digest = nullptr;
    if (digests != nullptr && op.span_count > 0) {
      target = {buffer, spans_.data() + op.span_begin, op.span_count, digests, pack};
      digest = &target;
    }
    if (op.kind == Kind::kRuns)
      cpu::execute_runs(op, axes, src, dst, digest);
    else
      cpu::execute_transpose(op, axes, src, dst, digest);
  }
  if (stats_.streaming) cpu::fence_streaming_stores();
  if (digests != nullptr)
    for (std::size_t i = 0; i < after_segments_.size(); ++i)
      digests[i].add(0, buffer + after_segments_[i].offset, static_cast<std::size_t>(after_segments_[i].bytes));
}

}  // namespace wb::exec
