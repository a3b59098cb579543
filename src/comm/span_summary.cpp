#include "comm/span_summary.hpp"

#include <algorithm>
#include <cstring>

#include "core/checks.hpp"

namespace wb::comm {

void SpanSummary::add(double begin, double end) {
  earliest_begin = std::min(earliest_begin, begin);
  latest_end = std::max(latest_end, end);
  total_seconds += end - begin;
  spans += 1;
}

void SpanSummary::merge(const SpanSummary& other) {
  earliest_begin = std::min(earliest_begin, other.earliest_begin);
  latest_end = std::max(latest_end, other.latest_end);
  total_seconds += other.total_seconds;
  spans += other.spans;
}

namespace {

constexpr int kFigures = 4;  // SpanSummary's fields, in order

void merge_records(void* in, void* inout, int* count, MPI_Datatype*) {
  auto* a = static_cast<const double*>(in);
  auto* b = static_cast<double*>(inout);
  for (int i = 0; i < *count; ++i, a += kFigures, b += kFigures) {
    SpanSummary x{a[0], a[1], a[2], a[3]}, y{b[0], b[1], b[2], b[3]};
    y.merge(x);
    b[0] = y.earliest_begin, b[1] = y.latest_end, b[2] = y.total_seconds, b[3] = y.spans;
  }
}

// One record is one indivisible datatype, so that MPI never hands the operation part of a summary.
struct Reduction {
  MPI_Datatype record = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  int rc = MPI_SUCCESS;
  Reduction() {
    rc = MPI_Type_contiguous(kFigures, MPI_DOUBLE, &record);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&record);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(&merge_records, 1, &op);
  }
};

}  // namespace

Status reduce_spans(SpanSummary& summary, MPI_Comm comm, const Waiter& waiter, const std::string& what) {
  // Made once, after MPI_Init (the first update), and kept for the process: MPI frees both at finalize.
  static const Reduction reduction;
  if (reduction.rc != MPI_SUCCESS)
    return make_call_error(ErrorCode::kMpi, "MPI_Op_create", what + ": " + detail::mpi_error_string(reduction.rc), __FILE__, __LINE__);
  const double mine[kFigures] = {summary.earliest_begin, summary.latest_end, summary.total_seconds, summary.spans};
  OperationPtr op = make_operation(sizeof mine, sizeof mine);
  std::memcpy(op->out.data(), mine, sizeof mine);
  const int rc = MPI_Iallreduce(op->out.data(), op->in.data(), 1, reduction.record, reduction.op, comm, &op->request);
  if (rc != MPI_SUCCESS) return make_call_error(ErrorCode::kMpi, "MPI_Iallreduce", what + ": " + detail::mpi_error_string(rc), __FILE__, __LINE__);
  WB_RETURN_IF_ERROR(wait_for(op, waiter, true, what));
  double all[kFigures];
  std::memcpy(all, op->in.data(), sizeof all);
  summary = {all[0], all[1], all[2], all[3]};
  return Status::ok();
}

}  // namespace wb::comm
