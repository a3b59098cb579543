// connect, the set-up half of the coordinator: everything an update needs is computed and allocated here
// ("plan once, post many"). Collective over the world: the trainers call it from SenderAdapter::connect,
// the rollouts from the poll_requests step that received the connect request.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coord/control.hpp"
#include "exec/round_executor.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::coord {

/// AdapterOptions with every unset field taken from its setting.
struct ResolvedOptions {
  bool sender_staging = false;
  bool receiver_staging = false;
  bool verify = false;
  std::int64_t buffer_bytes = 0;
  int pipeline_depth = 2;
  double timeout_seconds = 120;  // kNoDeadline for none
  int node = -1;
  std::string transport;  // empty: WB_TRANSPORT
};
/// Throws on values out of range.
ResolvedOptions resolve_options(const AdapterOptions& options);

/// Byte ranges [first, second) of one parameter.
using ByteRanges = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// The bytes of their parameters that `copies` touch, per parameter: sorted, disjoint, adjacent ranges merged.
std::vector<ByteRanges> touched_ranges(const std::vector<BufferCopy>& copies, std::size_t parameters);

/// Host copies of what one side stages, allocated once at connect: per parameter, the bytes the schedule
/// reads (sender) or writes (receiver), at their own offsets inside a reservation of the parameter's size.
/// The pages of that reservation the plan never touches are never touched at all, so host memory grows with
/// what is staged, not with the parameters (page granularity).
class Staging {
 public:
  Staging() = default;
  Staging(const ParameterSet& params, std::vector<ByteRanges> ranges);
  ~Staging();
  Staging(Staging&& other) noexcept;
  Staging& operator=(Staging&& other) noexcept;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  /// Parameters -> staging (sender) and staging -> parameters (receiver), for the staged ranges only.
  void copy_from(const ParameterSet& params) const;
  void copy_to(const ParameterSet& params) const;
  /// What the executor reads or writes: the staging copy where there is one, the parameter elsewhere.
  ParameterMemory memory(const ParameterSet& params) const;
  /// The staged bytes (the ranges), what the plan needs.
  std::int64_t bytes() const { return bytes_; }

 private:
  void release();
  struct Copy {
    std::byte* data = nullptr;  // mapping of `mapped` bytes, null when the parameter is not staged
    std::size_t mapped = 0;
    ByteRanges ranges;
  };
  std::vector<Copy> copies_;
  std::int64_t bytes_ = 0;
};

struct Connection {
  std::unique_ptr<RoundExecutor> executor;
  Staging staging;              // empty when this side does not stage
  TransferSummary summary;
  bool rollouts_stage = false;  // the engines use receiver staging (they all agree)
};

struct ConnectInput {
  MPI_Comm world = MPI_COMM_NULL;       // the adapters' duplicate of the world communicator
  const Roles* roles = nullptr;
  FaultChannel* faults = nullptr;
  Waiter waiter;
  const ParameterSet* params = nullptr;
  const LoadWeightsFn* load_weights = nullptr;
  const std::vector<TensorInfo>* checkpoint_tensors = nullptr;  // read on the trainer leader only
  ResolvedOptions options;
};

/// Probe, all-gather, plan on world rank 0, scatter, stage, register and connect. Every failure throws
/// the same wb::Error on every rank (the failing rank named), so that no rank is left waiting.
Connection establish_connection(const ConnectInput& input);

}  // namespace wb::coord
