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

#include "comm/operation.hpp"
#include "coord/fault_channel.hpp"
#include "coord/roles.hpp"
#include "coord/staging.hpp"
#include "exec/quantized_pack.hpp"
#include "exec/round_executor.hpp"
#include "layout/fp8_form.hpp"
#include "weightbridge/source_map.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::coord {

/// AdapterOptions with every unset field taken from its setting.
struct ResolvedOptions {
  bool sender_staging = false;
  bool receiver_staging = false;  // the mode's: every engine agrees on it
  // An engine that is the fleet link's replica (receiver side, set before its connect): it receives into
  // staging whatever the mode, so that its parameters hold a whole version while the next one arrives.
  bool replica_stages = false;
  bool verify = false;
  bool trace = false;
  std::int64_t buffer_bytes = 0;
  int pipeline_depth = setting_defaults::pipeline_depth();
  double timeout_seconds = comm::default_timeout_seconds();  // comm::kNoDeadline for none
  int node = -1;
  std::string transport;  // empty: WB_TRANSPORT
  std::vector<std::string> not_loaded;
  std::string join_address;  // empty: no joins by address
  std::optional<layout::QuantizationConfig> fp8;  // rollouts: the form this engine loads
};
/// Throws on values out of range.
ResolvedOptions resolve_options(const AdapterOptions& options);
/// Whether this side's executor reads or writes staging (a trainer's sender staging; an engine's receiver
/// staging, the mode's or the replica's).
inline bool stages(const ResolvedOptions& o, bool trainer) { return trainer ? o.sender_staging : o.receiver_staging || o.replica_stages; }

struct Connection {
  std::unique_ptr<RoundExecutor> executor;  // null for a trainer job with no engine (nothing to send)
  Staging staging;              // empty when this side does not stage
  TransferSummary summary;
  bool rollouts_stage = false;  // the engines use receiver staging (they all agree)
  /// Trainers, when the engines load the FP8 form: the quantizing pack, run before every update's rounds.
  std::unique_ptr<exec::QuantizedPack> quantized;
  /// This worker's load_weights as probed, in the form it loads (a trainer and a BF16 engine the
  /// checkpoint's, an FP8 engine its FP8 form), kept for the links of engines that join later: they are
  /// connected with it instead of probing again (a trainer's joined links; a replica's and a joiner's
  /// catch-up link). Empty when the probe failed.
  SourceMap probed;
  /// The tensor list of that form: the checkpoint's (from the trainer leader), or an FP8 engine's form of
  /// it. A replica engine plans a joiner's catch-up with it.
  std::vector<TensorInfo> tensors;
};

struct ConnectInput {
  MPI_Comm world = MPI_COMM_NULL;       // the adapters' duplicate of the world communicator
  const Roles* roles = nullptr;
  FaultChannel* faults = nullptr;
  comm::Waiter waiter;
  const ParameterSet* params = nullptr;
  const LoadWeightsFn* load_weights = nullptr;
  const std::vector<TensorInfo>* checkpoint_tensors = nullptr;  // read on the trainer leader only
  /// This worker's load_weights probed at an earlier connect (a trainer connecting a joined engine's link):
  /// taken as it is, not probed again. Null: probed now.
  const SourceMap* probed = nullptr;
  ResolvedOptions options;
  /// Some rank of the job watches its parameters (coord/binding_checks.hpp): every rank enters each update
  /// together (ExecutorOptions::enter_together).
  bool enter_together = false;
  /// Transports opened ahead of need (a join's links), or null.
  SpareTransports* spares = nullptr;
  /// A trainer with sender staging on the fleet link: its staging holds every byte of its parameters
  /// (coord::stage_for_sending's `whole`), so that a resend after a loss, planned anew, finds the version.
  bool stage_whole = false;
  /// A re-link onto a widened link: the old link's transfer buffers on this rank, taken over where large
  /// enough (ExecutorOptions::reuse_buffers); null otherwise.
  std::shared_ptr<const exec::TransferBuffers> reuse_buffers;
  /// A re-link: the old link's staging on this rank, whose memory the new one shares (Staging's `share`),
  /// so that a re-link maps and faults in no new pages and keeps the version they hold; null otherwise.
  const Staging* share_staging = nullptr;
};

/// Probe (unless given), all-gather, plan on world rank 0, scatter, stage, register and connect. Every failure throws
/// the same wb::Error on every rank (the failing rank named), so that no rank is left waiting.
Connection establish_connection(const ConnectInput& input);

/// One worker's probe of its `load_weights` against `tensors` (the checkpoint's list) into its source map,
/// every element accounted for (`not_loaded` aside; `rollout`: an engine's). A failure names `who` (which
/// ends in ": ") and the cause; nothing is thrown.
Status probe_load_weights(const std::vector<TensorInfo>& tensors, const ParameterSet& params, const LoadWeightsFn& load,
                          const std::vector<std::string>& not_loaded, bool rollout, const std::string& who, SourceMap& map);

}  // namespace wb::coord
