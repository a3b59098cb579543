// Private to apps/baselines/: what the baselines keep between updates (set up once by the constructor in
// baselines.cpp; the plain broadcast and P2P run there, the pipelined ring broadcast in ring_broadcast.cpp).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "baselines/baselines.hpp"
#include "baselines/box_reader.hpp"
#include "core/checks.hpp"
#include "transport/transport.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::bench {

/// Waits for a non-blocking MPI operation without spinning a core away, failing past the deadline. `progress`
/// runs between tests: providers with manual progress (tcp;ofi_rxm) finish a peer's writes only while the
/// target polls, so a rank that stops polling can hold its sender's completions back indefinitely.
void wait_for(MPI_Request& request, double timeout_seconds, const std::string& what, const std::function<void()>& progress = {});

struct Baselines::State {
  MPI_Comm world = MPI_COMM_NULL, trainers = MPI_COMM_NULL, fanout = MPI_COMM_NULL;
  int rank = 0, size = 0, head = 0;
  bool trainer = false;
  std::vector<TensorInfo> tensors;
  std::vector<std::int64_t> tensor_offset;  // bytes, in the head's staging and a broadcast receiver's copy
  std::int64_t total_bytes = 0;
  ParameterSet params;
  LoadWeightsFn load_weights;
  const JobClock* clock = nullptr;
  BaselineOptions options;
  std::vector<std::string> machines;  // by world rank
  std::vector<int> roles;             // by world rank: 1 for trainers

  // Gather: buckets of whole tensors [first, last); per bucket this trainer's copies to pack, and on the
  // head, per trainer (in trainer-communicator order) the boxes it sends and their byte counts.
  struct Bucket {
    std::size_t first = 0, last = 0;
    std::int64_t offset = 0, bytes = 0;
    std::vector<std::size_t> mine;                             // indices into map.copies
    std::vector<std::vector<std::pair<std::uint32_t, Box>>> from;  // head: per trainer, in order
    std::vector<int> counts, displs;                           // head: bytes per trainer
    int my_bytes = 0;
  };
  SourceMap map;
  std::vector<Bucket> buckets;
  std::vector<std::byte> pack_buffer, gather_buffer;
  std::vector<std::byte> staging;  // head: every tensor in full; broadcast receivers: their copy

  // P2P.
  struct Need {
    std::uint32_t tensor;
    Box box;
    std::int64_t offset;  // in this rollout's receive buffer
  };
  std::vector<Need> needs;        // rollout: the boxes its source map reads, each once
  std::vector<std::byte> receive; // rollout: the boxes, back to back
  std::map<TransportKind, std::unique_ptr<Transport>> transports;
  std::map<TransportKind, std::uint32_t> staging_memory;  // head: staging registered with each transport
  std::map<int, Transport*> transport_of;                  // head: per rollout; rollout: the head's
  std::map<int, std::uint32_t> remote_memory;              // head: each rollout's receive buffer
  struct PostedBatch {
    int peer;
    std::vector<WriteRequest> writes;
    std::int64_t bytes;
  };
  std::vector<PostedBatch> batches;  // head: every batch of an update, in posting order
  std::int64_t expected_arrivals = 0;  // rollout

  // Ring broadcast: this rank's neighbours on the chain (world ranks; -1 at the ends, both -1 off it).
  int ring_previous = -1, ring_next = -1;
  bool on_ring = false;

  bool same_machine(int a, int b) const { return machines[static_cast<std::size_t>(a)] == machines[static_cast<std::size_t>(b)]; }
  std::string who() const { return (trainer ? "trainer" : "rollout") + std::string(" (world rank ") + std::to_string(rank) + ")"; }

  void setup_gather(const std::vector<SourceMap>& maps, const std::vector<int>& trainer_ranks);
  void setup_p2p(const std::vector<SourceMap>& maps);
  void setup_ring();
  /// The bytes [offset, offset + bytes) of staging, down the chain in segments (ring_broadcast.cpp).
  void ring_pass(std::int64_t offset, std::int64_t bytes, const std::string& what, BaselineUpdate& update);
  void gather(std::size_t b, BaselineUpdate& update);
  void load_from(const BoxReader& reader);
  /// One update of a broadcast: per bucket the gather to the head, then `pass` (the head's staging to every
  /// rollout worker's); every rollout worker then loads the whole model from staging, and every rank meets.
  BaselineUpdate run_broadcast(const std::string& method, const std::function<void(const Bucket&, BaselineUpdate&)>& pass);
  /// Every rank at the start of an update, within the timeout (throws wb::Error naming `what` past it).
  void start_together(const std::string& what) {
    MPI_Request request;
    WB_CHECK_MPI(MPI_Ibarrier(world, &request));
    wait_for(request, options.timeout_seconds, who() + ": " + what);
  }
};


}  // namespace wb::bench
