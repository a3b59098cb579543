// The trainer side of the coordinator (the state is coord/sender_state.hpp): SenderAdapter's calls, and an
// update's sending, acknowledgements and figures.
#include "coord/sender_state.hpp"

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/log.hpp"

namespace wb {

using namespace coord;

SenderAdapter::SenderAdapter(MPI_Comm world, MPI_Comm trainer_comm, ParameterSet params,
                             std::vector<TensorInfo> checkpoint_tensors, LoadWeightsFn load_weights,
                             AdapterOptions options)
    : state_(std::make_unique<State>(world, trainer_comm, std::move(params), std::move(checkpoint_tensors),
                                     std::move(load_weights), options)) {}

SenderAdapter::~SenderAdapter() {
  if (!state_ || state_->shut_down) return;
  if (!state_->connection) {
    (void)shutdown();  // not collective: the engines learn that no connect is coming instead of polling for ever
    return;
  }
  if (std::uncaught_exceptions() > 0) {
    // Collective calls are out of the question while unwinding: the peers are told instead, joined engines
    // too, and the join port closes without a step of the trainers (its accept thread must not outlive
    // the adapter: one left in MPI_Comm_accept hangs MPI_Finalize).
    const std::string why = "its SenderAdapter was destroyed by an exception after version " + std::to_string(state_->version);
    state_->announce_departure(why);
    for (const std::unique_ptr<State>& link : state_->joined)
      if (!link->dropped) link->announce_departure(why);
    state_->close_port();
    return;
  }
  const Status status = shutdown();
  if (!status) {
    WB_LOG(kWarn) << "SenderAdapter shutdown: " << status.to_string();
  }
}

void SenderAdapter::connect() {
  State& s = *state_;
  if (s.connection) throw Error(ErrorCode::kInvalidArgument, "SenderAdapter::connect called twice");
  s.connect_link();
}

Status SenderAdapter::send_weights(std::uint64_t version, void* cuda_stream) {
  State& s = *state_;
  // A call refused (failed, not connected, a version that does not increase) takes no join either.
  if (!s.failure.is_ok() || !s.connection || s.shut_down || version <= s.version) return s.send(version, cuda_stream);
  // With a replica engine of this job, the version in flight ends first (every engine's acknowledgement, as
  // s.send would do next): the replica a joiner is taken with then holds the latest version installed, and
  // no transfer of the world's runs while the trainers and the replica widen the join (measured in async:
  // three joiners at once, a widening that waited on the replica while its staged receive waited on the
  // trainers' background writes, and neither completed in 30 s).
  if (s.replica_comm != MPI_COMM_NULL && s.port.open && s.in_flight) (void)s.finish_link();
  // The fleet link is widened only between updates: its version in flight ends first.
  if (fleet_link_enabled() && s.port.open && !s.joined.empty() && !s.joined.back()->dropped && s.joined.back()->in_flight) {
    const std::size_t k = s.joined.size() - 1;
    Status ended = s.joined[k]->finish_link();
    if (s.recoverable(*s.joined[k])) ended = s.agreed_outcome(ended);
    if (!ended) {
      if (s.recoverable(*s.joined[k])) (void)s.recover_fleet(k, ended, 0);  // the resend stays in flight
      else s.drop(k, ended);
    }
  }
  s.take_joins();
  // Parameters the framework moved since the last update (a binding's watch): followed on every link, or
  // the version refused before any byte of it moves (the peers, entering it together, fail with it).
  std::vector<MovedParameter> moved;
  if (Status checked = s.check_parameters(moved, "version " + std::to_string(version)); !checked) {
    checked = s.give_up(checked, "");
    for (std::size_t k = 0; k < s.joined.size(); ++k)
      if (!s.joined[k]->dropped) (void)s.joined[k]->fail(checked);
  }
  return s.serve([&](State& link) { return link.send(version, cuda_stream, moved); },
                 [&] { return s.send(version, cuda_stream, moved); }, version);
}

Status SenderAdapter::State::send(std::uint64_t version, void* cuda_stream, const std::vector<MovedParameter>& moved) {
  State& s = *this;
  if (!s.failure.is_ok()) return s.failure;
  if (!s.connection || s.shut_down)
    return Status(ErrorCode::kInvalidArgument, "send_weights before connect or after shutdown");
  if (version <= s.version)
    return Status(ErrorCode::kInvalidArgument, "send_weights(" + std::to_string(version) +
                                                   "): versions must increase, the last one sent was " +
                                                   std::to_string(s.version));
  if (s.roles.engine_leaders.empty()) {
    // Nobody to send to: the version is the trainers' latest at once, and nothing was written (an engine
    // that joins later gets a link over the parameters where they are now).
    if (Status followed = s.follow(moved); !followed) return s.give_up(followed, "");
    s.version = version;
    s.history.push_back({version, 0, true, 0.0, 0.0});
    return Status::ok();
  }
  const double began = s.now();
  s.open_stall.reset();
  // A peer that gave up since the last call (this trainer's group steps then end at once too).
  if (Status noticed = s.service(true); !noticed) return s.fail(noticed);
  Status status = s.finish_in_flight();
  if (!status) return status;
  if (status = s.follow(moved); !status) return s.give_up(status, "");
  s.requested_at = comm::local_seconds();
  s.faults->set_activity(s.group->first_incomplete(), s.about(version) + ": sending");
  status = s.send_request(RequestKind::kUpdate, version);
  if (!status) return s.fail(status);
  s.version = version;
  s.in_flight = true;
  s.open_stall = StallInterval{version, began, began};
  Staging& staging = s.connection->staging;
  const bool by_round = s.options.sender_staging && staging.stages_by_round();
  if (s.options.sender_staging && !by_round) {  // CUDA parameters: staged at once, before the FP8 quantize
    status = staging.copy_from(s.params, cuda_stream);
    if (!status) {
      s.in_flight = false;
      return s.give_up(status, "version " + std::to_string(version) + ": copying the parameters to staging: ");
    }
  }
  exec::QuantizedPack* quantized = s.connection->quantized.get();
  std::vector<std::byte*> bases;  // what quantize reads: the parameters, or the staging copied at once
  if (s.options.sender_staging && !by_round) bases = staging.memory(s.params).data;
  else
    for (const Parameter& p : s.params) bases.push_back(static_cast<std::byte*>(p.view.data));
  // Staged by rounds, the FP8 codes are quantized by the same rounds below.
  const bool quantize_by_round = quantized != nullptr && by_round && quantized->quantizes_by_round();
  if (quantized) {
    // FP8 engines, before any round and before send_weights returns (the trainer may change its parameters
    // afterwards, in every mode): the amaxes, their exchange between trainers, scales and codes (into the
    // shadows); casting in the pack, only what the casts cannot take; by rounds, only the shared blocks.
    const exec::AmaxExchange exchange = [&s, version](std::span<std::uint32_t> bits) {
      return comm::reduce_max(bits, s.group_comm, s.waiter(), s.about(version) + ": the FP8 amax exchange");
    };
    status = quantize_by_round ? quantized->quantize_shared(bases, exchange) : quantized->quantize(bases, exchange, cuda_stream);
    if (!status) {
      s.in_flight = false;
      return s.give_up(status, "version " + std::to_string(version) + ": quantizing to FP8: ");
    }
  }
  if (by_round) {
    // The staged copy is what the transfer reads, and the trainer may change its parameters once this
    // returns. Host staging is copied in the order of the rounds while the transfer already packs and
    // sends those staged (a copy of host memory cannot fail), so the copy's time leaves the EWTT; the FP8
    // codes of a round are quantized into the shadows before the round is published, the same way.
    s.staged_rounds.store(0, std::memory_order_relaxed);
    s.start_background(version, &s.staged_rounds, s.behind());
    std::function<void(std::size_t)> round_codes;
    if (quantize_by_round) round_codes = [quantized, &bases](std::size_t round) { quantized->quantize_round(bases, round); };
    (void)staging.copy_from_by_round(s.params, s.staged_rounds, nullptr, round_codes);
  } else if (s.options.sender_staging) {
    s.start_background(version, nullptr, s.behind());
  } else {
    // Every trainer takes part in the same steps whatever happened, so a failure on one reaches all.
    status = s.run_transfer(version, cuda_stream);
    if (status) status = s.group->step(Status::ok(), s.waiter(), s.about(version) + ": the trainers' writes");
    else status = s.give_up(s.diagnose(version, status), "version " + std::to_string(version) + ": ");
    if (!status) {
      s.in_flight = false;
      status = s.fail(status);
    } else if (!s.connection->rollouts_stage || recoverable(s)) {
      // Synchronous: wait for the installs. On the fleet link with receiver staging alone too: a loss met
      // a call later could not be re-sent (these parameters hold the next version by then), so the call
      // ends once every engine holds v, and a loss within it is answered from the parameters, as in sync.
      // The trainers' stall grows by the forwards' tail and the engines' install step.
      status = s.finish_in_flight();
    }
  }
  s.close_stall(version);
  return status;
}

Status SenderAdapter::wait() {
  State& s = *state_;
  return s.serve([](State& link) { return link.finish_link(); }, [&s] { return s.finish_link(); });
}

Status SenderAdapter::State::shutdown_link() {
  State& s = *this;
  if (s.shut_down) return s.failure;
  Status status = s.failure;
  if (s.connection) {
    if (status) status = s.service(true);
    if (status) status = s.finish_in_flight();
    else status = s.fail(status);
  }
  // Sent after a failure too, so that the engines stop polling; the connection itself stays until the
  // adapter is destroyed (its statistics remain readable).
  const Status sent = s.send_request(status ? RequestKind::kShutdown : RequestKind::kAbort, s.version);
  s.shut_down = true;
  return status ? sent : status;
}

Status SenderAdapter::shutdown() {
  State& s = *state_;
  s.close_port();
  return s.serve([](State& link) { return link.shutdown_link(); }, [&s] { return s.shutdown_link(); });
}

bool SenderAdapter::connected() const { return state_->connection.has_value(); }

int SenderAdapter::engines() const {
  std::size_t n = state_->roles.engine_leaders.size();
  for (const std::unique_ptr<State>& link : state_->joined)
    if (!link->dropped) n += link->roles.engine_leaders.size();
  return static_cast<int>(n);
}

const TransferSummary& SenderAdapter::summary() const {
  static const TransferSummary none;
  return state_->connection ? state_->connection->summary : none;
}

AdapterStats SenderAdapter::stats() const {
  const State& s = *state_;
  AdapterStats stats = s.stats();
  // This trainer's writes to joined engine jobs count as its own: per version (its egress per update) and
  // in all.
  for (const std::unique_ptr<State>& link : s.joined) {
    for (const UpdateRecord& r : link->history)
      for (UpdateRecord& mine : stats.history)
        if (mine.version == r.version) mine.bytes_written += r.bytes_written;
    stats.bytes_written += link->executor_stats.bytes_written;
  }
  for (std::size_t e = 0; e < s.roles.engine_leaders.size(); ++e)
    stats.engines.push_back({s.engine_name(e), "serving", s.acknowledged, ""});
  stats.engines.insert(stats.engines.end(), s.fleet_lost.begin(), s.fleet_lost.end());
  for (std::size_t k = 0; k < s.joined.size(); ++k) {
    const State& link = *s.joined[k];
    const char* state = link.dropped ? (link.left ? "left" : "dropped") : "serving";
    for (std::size_t e = 0; e < link.fleet_records.size(); ++e) {  // the fleet link: a record per engine
      const State::JoinedEngine& r = link.fleet_records[e];
      stats.engines.push_back({State::fleet_name(r, link.roles.engines[e].size()), state, link.acknowledged, link.why,
                               r.connect_seconds, r.probe_seconds, r.first_install_seconds});
    }
    if (!link.fleet_records.empty()) continue;
    stats.engines.push_back({s.joined_name(k), link.dropped ? (link.left ? "left" : "dropped") : "serving", link.acknowledged, link.why,
                             link.connect_seconds, link.connection ? link.connection->summary.probe_seconds : 0.0,
                             link.first_install_seconds});
  }
  return stats;
}

}  // namespace wb
