#include "baselines/baselines.hpp"
#include "baselines/baseline_state.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "baselines/box_reader.hpp"
#include "comm/backoff.hpp"
#include "core/checks.hpp"
#include "layout/source_map_exchange.hpp"
#include "transport/transport.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::bench {
namespace {

constexpr int kSetupTag = 0x5762;  // P2P endpoint records and keys

/// One box of a checkpoint tensor.
struct BoxKey {
  std::uint32_t tensor;
  Shape offset, extent;
  bool operator<(const BoxKey& o) const {
    return std::tie(tensor, offset, extent) < std::tie(o.tensor, o.offset, o.extent);
  }
};

/// A contiguous run of a box inside its row-major tensor: element offset in the tensor, length.
struct Run {
  std::int64_t first = 0, length = 0;
};

/// The box as runs of the row-major tensor, in the box's row-major order.
std::vector<Run> runs_of(const Box& box, const Shape& shape) {
  const int d = box.ndim();
  std::vector<Run> runs;
  if (box.numel() == 0) return runs;
  // The innermost axes the box spans fully are one run with the first axis it does not.
  int k = d - 1;
  while (k > 0 && box.extent[static_cast<std::size_t>(k)] == shape[static_cast<std::size_t>(k)]) --k;
  const Shape strides = contiguous_strides(shape);
  std::int64_t run = box.extent[static_cast<std::size_t>(k)] * strides[static_cast<std::size_t>(k)];
  Shape index(box.offset.begin(), box.offset.end());
  for (;;) {
    std::int64_t first = 0;
    for (int a = 0; a < d; ++a) first += index[static_cast<std::size_t>(a)] * strides[static_cast<std::size_t>(a)];
    runs.push_back({first, run});
    int a = k - 1;
    for (; a >= 0; --a) {
      const auto u = static_cast<std::size_t>(a);
      if (++index[u] < box.offset[u] + box.extent[u]) break;
      index[u] = box.offset[u];
    }
    if (a < 0) break;
  }
  return runs;
}

}  // namespace

void wait_for(MPI_Request& request, double timeout_seconds, const std::string& what, const std::function<void()>& progress) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  comm::Backoff backoff;
  for (;;) {
    int done = 0;
    WB_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(ErrorCode::kTimeout, what + " did not finish within " + std::to_string(timeout_seconds) + " s");
    if (progress) progress();
    backoff.pause();
  }
}

Baselines::Baselines(MPI_Comm world, bool trainer, std::vector<TensorInfo> tensors, const ParameterSet& params,
                     LoadWeightsFn load_weights, const JobClock& clock, BaselineOptions options)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  WB_CHECK_MPI(MPI_Comm_dup(world, &s.world));
  WB_CHECK_MPI(MPI_Comm_rank(s.world, &s.rank));
  WB_CHECK_MPI(MPI_Comm_size(s.world, &s.size));
  s.trainer = trainer;
  s.tensors = std::move(tensors);
  s.params = params;
  s.load_weights = std::move(load_weights);
  s.clock = &clock;
  s.options = options;
  for (const TensorInfo& t : s.tensors) {
    s.tensor_offset.push_back(s.total_bytes);
    s.total_bytes += static_cast<std::int64_t>(t.nbytes());
  }

  // Who is a trainer, the head, the machines.
  int mine = trainer ? 1 : 0;
  s.roles.resize(static_cast<std::size_t>(s.size));
  WB_CHECK_MPI(MPI_Allgather(&mine, 1, MPI_INT, s.roles.data(), 1, MPI_INT, s.world));
  std::vector<int> trainer_ranks;
  for (int r = 0; r < s.size; ++r)
    if (s.roles[static_cast<std::size_t>(r)]) trainer_ranks.push_back(r);
  if (trainer_ranks.empty() || static_cast<int>(trainer_ranks.size()) == s.size)
    throw Error(ErrorCode::kInvalidArgument, "baselines need trainers and rollouts in the world");
  s.head = trainer_ranks.front();
  constexpr int kIdBytes = 256;
  char id[kIdBytes] = {};
  std::strncpy(id, machine_id().c_str(), kIdBytes - 1);
  std::vector<char> ids(static_cast<std::size_t>(s.size) * kIdBytes);
  WB_CHECK_MPI(MPI_Allgather(id, kIdBytes, MPI_CHAR, ids.data(), kIdBytes, MPI_CHAR, s.world));
  for (int r = 0; r < s.size; ++r) s.machines.emplace_back(&ids[static_cast<std::size_t>(r) * kIdBytes]);
  WB_CHECK_MPI(MPI_Comm_split(s.world, trainer ? 0 : 1, s.rank, &s.trainers));
  // The broadcast's communicator: the head (its root, rank 0) and every rollout worker.
  const bool in_fanout = !trainer || s.rank == s.head;
  WB_CHECK_MPI(MPI_Comm_split(s.world, in_fanout ? 0 : MPI_UNDEFINED, s.rank == s.head ? -1 : s.rank, &s.fanout));

  // What every worker's load_weights reads, from its own probe, as connect learns it.
  s.map = probe_source_map(s.tensors, s.params, s.load_weights);
  comm::Call call;
  call.waiter.timeout = comm::normalize_timeout(options.timeout_seconds);
  const std::vector<SourceMap> maps = allgather_source_maps(s.map, s.world, call);
  s.setup_gather(maps, trainer_ranks);
  s.setup_p2p(maps);
  s.setup_ring();
}

Baselines::~Baselines() = default;

int Baselines::head() const { return s_->head; }
std::int64_t Baselines::model_bytes() const { return s_->total_bytes; }

void Baselines::State::setup_gather(const std::vector<SourceMap>& maps, const std::vector<int>& trainer_ranks) {
  // Each box leaves the trainers once: the first trainer (in rank order) holding exactly it sends it.
  std::set<BoxKey> sent;
  std::vector<std::vector<std::size_t>> owned(trainer_ranks.size());
  for (std::size_t t = 0; t < trainer_ranks.size(); ++t) {
    const SourceMap& m = maps[static_cast<std::size_t>(trainer_ranks[t])];
    for (std::size_t c = 0; c < m.copies.size(); ++c) {
      const SliceCopy& copy = m.copies[c];
      if (copy.box.numel() == 0) continue;
      if (sent.insert({copy.tensor, copy.box.offset, copy.box.extent}).second) owned[t].push_back(c);
    }
  }
  // Buckets of whole tensors.
  const std::int64_t limit = std::max<std::int64_t>(options.bucket_bytes, 1);
  for (std::size_t t = 0; t < tensors.size();) {
    Bucket bucket;
    bucket.first = t;
    bucket.offset = tensor_offset[t];
    while (t < tensors.size() && (t == bucket.first || bucket.bytes + static_cast<std::int64_t>(tensors[t].nbytes()) <= limit))
      bucket.bytes += static_cast<std::int64_t>(tensors[t++].nbytes());
    bucket.last = t;
    if (bucket.bytes > INT_MAX)
      throw Error(ErrorCode::kInvalidArgument, "tensor " + tensors[bucket.first].name + " (" + std::to_string(bucket.bytes) +
                                                   " bytes) is larger than one MPI message of the baselines takes");
    buckets.push_back(std::move(bucket));
  }
  const auto bucket_of = [&](std::uint32_t tensor) {
    for (std::size_t b = 0; b < buckets.size(); ++b)
      if (tensor >= buckets[b].first && tensor < buckets[b].last) return b;
    return buckets.size();
  };
  const auto position = std::find(trainer_ranks.begin(), trainer_ranks.end(), rank) - trainer_ranks.begin();
  std::int64_t largest = 0, largest_gather = 0;
  for (Bucket& bucket : buckets) {
    bucket.from.resize(trainer_ranks.size());
    bucket.counts.assign(trainer_ranks.size(), 0);
    bucket.displs.assign(trainer_ranks.size(), 0);
  }
  for (std::size_t t = 0; t < trainer_ranks.size(); ++t) {
    const SourceMap& m = maps[static_cast<std::size_t>(trainer_ranks[t])];
    for (std::size_t c : owned[t]) {
      const SliceCopy& copy = m.copies[c];
      Bucket& bucket = buckets[bucket_of(copy.tensor)];
      const auto bytes = static_cast<int>(copy.box.numel() * static_cast<std::int64_t>(dtype_size(tensors[copy.tensor].dtype)));
      bucket.from[t].emplace_back(copy.tensor, copy.box);
      bucket.counts[t] += bytes;
      if (static_cast<std::ptrdiff_t>(t) == position && trainer) bucket.mine.push_back(c);
    }
  }
  for (Bucket& bucket : buckets) {
    int at = 0;
    for (std::size_t t = 0; t < trainer_ranks.size(); ++t) {
      bucket.displs[t] = at;
      at += bucket.counts[t];
    }
    if (trainer) bucket.my_bytes = bucket.counts[static_cast<std::size_t>(position)];
    largest = std::max<std::int64_t>(largest, bucket.my_bytes);
    largest_gather = std::max<std::int64_t>(largest_gather, at);
  }
  if (trainer) pack_buffer.resize(static_cast<std::size_t>(std::max<std::int64_t>(largest, 1)));
  if (rank == head) gather_buffer.resize(static_cast<std::size_t>(std::max<std::int64_t>(largest_gather, 1)));
  if (rank == head || !trainer) staging.resize(static_cast<std::size_t>(total_bytes));
}

void Baselines::State::setup_p2p(const std::vector<SourceMap>& maps) {
  // Rollouts: the boxes their source maps read, each once, back to back.
  std::vector<std::vector<Need>> all_needs(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (roles[static_cast<std::size_t>(r)]) continue;
    std::set<BoxKey> seen;
    std::int64_t at = 0;
    for (const SliceCopy& copy : maps[static_cast<std::size_t>(r)].copies) {
      if (copy.box.numel() == 0 || !seen.insert({copy.tensor, copy.box.offset, copy.box.extent}).second) continue;
      all_needs[static_cast<std::size_t>(r)].push_back({copy.tensor, copy.box, at});
      at += copy.box.numel() * static_cast<std::int64_t>(dtype_size(tensors[copy.tensor].dtype));
    }
  }
  std::vector<int> rollouts;
  for (int r = 0; r < size; ++r)
    if (!roles[static_cast<std::size_t>(r)]) rollouts.push_back(r);
  if (!trainer) {
    needs = all_needs[static_cast<std::size_t>(rank)];
    std::int64_t bytes = 0;
    for (const Need& n : needs) bytes = n.offset + n.box.numel() * static_cast<std::int64_t>(dtype_size(tensors[n.tensor].dtype));
    receive.resize(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 64)));
  }
  if (rank != head && trainer) return;

  // Transports between the head and every rollout, as WeightBridge would choose them.
  const auto transport_for = [&](int peer) {
    const TransportKind kind = choose_transport(same_machine(rank, peer), MemoryKind::kHost);
    auto it = transports.find(kind);
    if (it == transports.end()) it = transports.emplace(kind, make_transport(kind, rank)).first;
    return it->second.get();
  };
  const auto send_bytes = [&](const std::vector<std::byte>& bytes, int peer) {
    const auto n = static_cast<std::uint64_t>(bytes.size());
    WB_CHECK_MPI(MPI_Send(&n, 1, MPI_UINT64_T, peer, kSetupTag, world));
    WB_CHECK_MPI(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, peer, kSetupTag, world));
  };
  const auto receive_bytes = [&](int peer) {
    std::uint64_t n = 0;
    MPI_Request request;
    WB_CHECK_MPI(MPI_Irecv(&n, 1, MPI_UINT64_T, peer, kSetupTag, world, &request));
    wait_for(request, options.timeout_seconds, who() + ": P2P set-up record from world rank " + std::to_string(peer));
    std::vector<std::byte> bytes(n);
    WB_CHECK_MPI(MPI_Irecv(bytes.data(), static_cast<int>(n), MPI_BYTE, peer, kSetupTag, world, &request));
    wait_for(request, options.timeout_seconds, who() + ": P2P set-up record from world rank " + std::to_string(peer));
    return bytes;
  };
  if (rank == head) {
    for (int r : rollouts) transport_of[r] = transport_for(r);
    for (auto& [kind, transport] : transports)
      staging_memory[kind] = transport->register_memory(staging.data(), staging.size(), MemoryKind::kHost, 0).id;
    for (int r : rollouts) {
      Transport& t = *transport_of[r];
      send_bytes(t.endpoint(r), r);
      t.connect(r, receive_bytes(r));
      remote_memory[r] = t.import_memory(r, receive_bytes(r));
    }
    // Every update's batches: tensor by tensor, each rollout worker the runs of the boxes it needs.
    std::map<int, std::int64_t> arrivals;
    for (std::uint32_t t = 0; t < tensors.size(); ++t) {
      const std::int64_t element = static_cast<std::int64_t>(dtype_size(tensors[t].dtype));
      for (int r : rollouts) {
        Transport& transport = *transport_of[r];
        const std::size_t limit = std::max<std::size_t>(1, transport.capabilities().max_writes_per_batch);
        const std::uint32_t local = staging_memory[transport.kind()];
        PostedBatch batch{r, {}, 0};
        for (const Need& need : all_needs[static_cast<std::size_t>(r)]) {
          if (need.tensor != t) continue;
          std::int64_t into = need.offset;
          for (const Run& run : runs_of(need.box, tensors[t].shape)) {
            const std::int64_t bytes = run.length * element;
            batch.writes.push_back({local, static_cast<std::uint64_t>(tensor_offset[t] + run.first * element), remote_memory[r],
                                    static_cast<std::uint64_t>(into), static_cast<std::uint64_t>(bytes)});
            batch.bytes += bytes;
            into += bytes;
            if (batch.writes.size() == limit) {
              batches.push_back(std::move(batch));
              batch = PostedBatch{r, {}, 0};
              ++arrivals[r];
            }
          }
        }
        if (!batch.writes.empty()) {
          batches.push_back(std::move(batch));
          ++arrivals[r];
        }
      }
    }
    for (int r : rollouts) {
      const std::int64_t n = arrivals[r];
      WB_CHECK_MPI(MPI_Send(&n, 1, MPI_INT64_T, r, kSetupTag, world));
    }
  } else {
    Transport& t = *transport_for(head);
    transport_of[head] = &t;
    const MemoryRegistration registration = t.register_memory(receive.data(), receive.size(), MemoryKind::kHost, 0);
    const std::vector<std::byte> endpoint = receive_bytes(head);
    send_bytes(t.endpoint(head), head);
    t.connect(head, endpoint);
    send_bytes(registration.remote_key, head);
    MPI_Request request;
    WB_CHECK_MPI(MPI_Irecv(&expected_arrivals, 1, MPI_INT64_T, head, kSetupTag, world, &request));
    wait_for(request, options.timeout_seconds, who() + ": the P2P batch count from the head");
  }
}

void Baselines::State::gather(std::size_t b, BaselineUpdate& update) {
  Bucket& bucket = buckets[b];
  if (!trainer) return;
  // Pack what this trainer sends of the bucket, in its map's order.
  std::int64_t at = 0;
  for (std::size_t c : bucket.mine) {
    const SliceCopy& copy = map.copies[c];
    const Parameter& parameter = params[copy.parameter];
    const TensorView from{static_cast<std::byte*>(parameter.view.data) +
                              copy.offset * static_cast<std::int64_t>(parameter.view.element_size()),
                          parameter.view.dtype, copy.box.extent, copy.strides};
    copy_tensor(TensorView::contiguous(pack_buffer.data() + at, from.dtype, copy.box.extent), from);
    at += static_cast<std::int64_t>(from.nbytes());
  }
  (same_machine(rank, head) ? update.within_machine : update.between_machines) += rank == head ? 0 : bucket.my_bytes;
  MPI_Request request;
  WB_CHECK_MPI(MPI_Igatherv(pack_buffer.data(), bucket.my_bytes, MPI_BYTE, gather_buffer.data(), bucket.counts.data(),
                            bucket.displs.data(), MPI_BYTE, 0, trainers, &request));
  wait_for(request, options.timeout_seconds, who() + ": gather of tensors " + tensors[bucket.first].name + " ... to the head");
  if (rank != head) return;
  for (std::size_t t = 0; t < bucket.from.size(); ++t) {
    std::int64_t from = bucket.displs[t];
    for (const auto& [tensor, box] : bucket.from[t]) {
      const TensorInfo& info = tensors[tensor];
      const TensorView whole = TensorView::contiguous(staging.data() + tensor_offset[tensor], info.dtype, info.shape);
      const TensorView part = TensorView::contiguous(gather_buffer.data() + from, info.dtype, box.extent);
      copy_tensor(whole.box(box), part);
      from += static_cast<std::int64_t>(part.nbytes());
    }
  }
}

void Baselines::State::load_from(const BoxReader& reader) {
  try {
    load_weights(reader, params);
  } catch (const std::exception& error) {
    throw Error(ErrorCode::kInvalidArgument, who() + ": load_weights on what the baseline delivered failed: " + error.what());
  }
}

BaselineUpdate Baselines::broadcast() {
  State& s = *s_;
  return s.run_broadcast("broadcast", [&s](const State::Bucket& bucket, BaselineUpdate& update) {
    if (s.fanout == MPI_COMM_NULL) return;
    MPI_Request request;
    WB_CHECK_MPI(MPI_Ibcast(s.staging.data() + bucket.offset, static_cast<int>(bucket.bytes), MPI_BYTE, 0, s.fanout, &request));
    wait_for(request, s.options.timeout_seconds, s.who() + ": broadcast of tensors " + s.tensors[bucket.first].name + " ...");
    if (s.rank == s.head)  // what the head's fan-out carries logically (MPI may relay it through the receivers)
      for (int r = 0; r < s.size; ++r)
        if (!s.roles[static_cast<std::size_t>(r)]) (s.same_machine(s.head, r) ? update.within_machine : update.between_machines) += bucket.bytes;
  });
}

BaselineUpdate Baselines::State::run_broadcast(const std::string& method,
                                               const std::function<void(const Bucket&, BaselineUpdate&)>& pass) {
  BaselineUpdate update;
  start_together("the start of the " + method + " update");
  update.begin = clock->now();
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    gather(b, update);
    pass(buckets[b], update);
  }
  if (!trainer) {
    BoxReader reader(tensors, "the " + method);
    for (std::size_t t = 0; t < tensors.size(); ++t) reader.add(t, Box::whole(tensors[t].shape), staging.data() + tensor_offset[t]);
    load_from(reader);
    update.end = clock->now();
  }
  MPI_Request request;
  WB_CHECK_MPI(MPI_Ibarrier(world, &request));
  wait_for(request, options.timeout_seconds, who() + ": the end of the " + method + " update");
  if (trainer) update.end = clock->now();
  return update;
}

BaselineUpdate Baselines::p2p() {
  State& s = *s_;
  BaselineUpdate update;
  s.start_together("the start of the P2P update");
  update.begin = s.clock->now();
  for (std::size_t b = 0; b < s.buckets.size(); ++b) s.gather(b, update);
  const auto deadline = [&] { return std::chrono::steady_clock::now() + std::chrono::duration<double>(s.options.timeout_seconds); };
  std::vector<Completion> completions;
  // Every wait below pauses through the one wait policy when a poll found nothing new.
  comm::Backoff backoff;
  if (s.rank == s.head) {
    std::size_t done = 0;
    auto limit = deadline();
    const auto poll_all = [&] {
      for (auto& [kind, transport] : s.transports) {
        completions.clear();
        throw_if_error(transport->poll(completions));
        for (const Completion& c : completions) done += c.kind == Completion::Kind::kWritesDone ? 1 : 0;
      }
    };
    for (std::size_t i = 0; i < s.batches.size(); ++i) {
      const State::PostedBatch& batch = s.batches[i];
      for (;;) {
        const Status status = s.transport_of[batch.peer]->post_writes(batch.peer, batch.writes, 0, i);
        if (status.is_ok()) break;
        if (status.code() != ErrorCode::kRetryLater) throw Error(status);
        const std::size_t before = done;
        poll_all();
        if (std::chrono::steady_clock::now() > limit)
          throw Error(ErrorCode::kTimeout, s.who() + ": P2P writes to world rank " + std::to_string(batch.peer) +
                                               " stayed back-pressured for " + std::to_string(s.options.timeout_seconds) + " s");
        if (done == before) backoff.pause();
      }
      backoff.progressed();
      (s.same_machine(s.rank, batch.peer) ? update.within_machine : update.between_machines) += batch.bytes;
      limit = deadline();
    }
    limit = deadline();
    while (done < s.batches.size()) {
      const std::size_t before = done;
      poll_all();
      if (std::chrono::steady_clock::now() > limit)
        throw Error(ErrorCode::kTimeout, s.who() + ": " + std::to_string(s.batches.size() - done) +
                                             " P2P batches not complete after " + std::to_string(s.options.timeout_seconds) + " s");
      if (done == before)
        backoff.pause();
      else
        backoff.progressed();
    }
  } else if (!s.trainer) {
    Transport& transport = *s.transport_of[s.head];
    std::int64_t arrived = 0;
    const auto limit = deadline();
    while (arrived < s.expected_arrivals) {
      completions.clear();
      throw_if_error(transport.poll(completions));
      for (const Completion& c : completions) arrived += c.kind == Completion::Kind::kArrival ? 1 : 0;
      if (std::chrono::steady_clock::now() > limit)
        throw Error(ErrorCode::kTimeout, s.who() + ": " + std::to_string(arrived) + " of " + std::to_string(s.expected_arrivals) +
                                             " P2P batches arrived within " + std::to_string(s.options.timeout_seconds) + " s");
      if (completions.empty())
        backoff.pause();
      else
        backoff.progressed();
    }
    BoxReader reader(s.tensors, "the P2P writes");
    for (const State::Need& need : s.needs) reader.add(need.tensor, need.box, s.receive.data() + need.offset);
    s.load_from(reader);
    update.end = s.clock->now();
  }
  MPI_Request request;
  WB_CHECK_MPI(MPI_Ibarrier(s.world, &request));
  // Keep every transport progressing: the head's last completions may need the receivers' progress.
  wait_for(request, s.options.timeout_seconds, s.who() + ": the end of the P2P update", [&] {
    for (auto& [kind, transport] : s.transports) {
      completions.clear();
      throw_if_error(transport->poll(completions));
    }
  });
  if (s.trainer) update.end = s.clock->now();
  return update;
}

}  // namespace wb::bench
