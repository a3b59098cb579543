// connect, the set-up half of the coordinator: everything an update needs is computed and allocated here
// ("plan once, post many"). Collective over the world: the trainers call it from SenderAdapter::connect,
// the rollouts from the poll_requests step that received the connect request.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coord/control.hpp"
#include "exec/round_executor.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::coord {

/// AdapterOptions with every unset field taken from its setting.
struct ResolvedOptions {
  bool sender_staging = false;
  bool receiver_staging = false;
  std::int64_t buffer_bytes = 0;
  int pipeline_depth = 2;
  double timeout_seconds = 120;
  int node = -1;
  std::string transport;  // empty: WB_TRANSPORT
};
/// Throws on values out of range.
ResolvedOptions resolve_options(const AdapterOptions& options);

/// "12.5 s"
std::string seconds_text(double seconds);

/// Host copies of the parameters one side stages, allocated once at connect (64-byte aligned).
class Staging {
 public:
  Staging() = default;
  /// Copies of the parameters with used[p], filled with their current contents.
  Staging(const ParameterSet& params, const std::vector<bool>& used);
  /// Parameters -> staging (sender) and staging -> parameters (receiver), for the staged parameters.
  void copy_from(const ParameterSet& params) const;
  void copy_to(const ParameterSet& params) const;
  /// What the executor reads or writes: the staging copy where there is one, the parameter elsewhere.
  ParameterMemory memory(const ParameterSet& params) const;
  std::int64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::vector<std::unique_ptr<std::byte[], Free>> copies_;  // one per parameter, null when not staged
  std::int64_t bytes_ = 0;
};

struct Connection {
  std::unique_ptr<RoundExecutor> executor;
  Staging staging;             // empty when this side does not stage
  TransferSummary summary;
  bool rollouts_stage = false;  // the engines use receiver staging (they all agree)
};

struct ConnectInput {
  MPI_Comm world = MPI_COMM_NULL;       // the adapters' duplicate of the world communicator
  const Roles* roles = nullptr;
  const ParameterSet* params = nullptr;
  const LoadWeightsFn* load_weights = nullptr;
  const std::vector<TensorInfo>* checkpoint_tensors = nullptr;  // read on the trainer leader only
  ResolvedOptions options;
};

/// Probe, all-gather, plan on world rank 0, scatter, stage, register and connect. Every failure throws
/// the same wb::Error on every rank (the failing rank named), so that no rank is left waiting.
Connection establish_connection(const ConnectInput& input);

/// "trainer rank 3 (world rank 3)" or "rollout engine 1 rank 0 (world rank 12)".
std::string describe_worker(const Roles& roles, int world_rank);

}  // namespace wb::coord
