// Spans of time summed over the ranks of a communicator: the earliest begin, the latest end, the total
// length and the number of spans, in one MPI_Iallreduce (a user-defined operation over the four figures),
// waited for as every wait of the control plane is (comm/operation.hpp). What a group of workers tells
// about the intervals its members spent on one thing (the adapters: the stalls of one update), without
// gathering every interval.
#pragma once

#include <mpi.h>

#include <limits>
#include <string>

#include "comm/operation.hpp"

namespace wb::comm {

struct SpanSummary {
  double earliest_begin = std::numeric_limits<double>::infinity();
  double latest_end = -std::numeric_limits<double>::infinity();
  double total_seconds = 0;  // the sum of the spans' lengths
  double spans = 0;          // how many (a double: it travels and adds up with the others)

  bool empty() const { return spans == 0; }
  void add(double begin, double end);
  void merge(const SpanSummary& other);
  /// latest_end - earliest_begin (0 when empty).
  double extent() const { return empty() ? 0 : latest_end - earliest_begin; }
};

/// Every rank's `summary` merged, on every rank of `comm` (update path: a Status, never a throw). Fails with
/// kTimeout at the waiter's deadline, or with the failure its service returns (a peer that gave up).
Status reduce_spans(SpanSummary& summary, MPI_Comm comm, const Waiter& waiter, const std::string& what);

}  // namespace wb::comm
