// The paper's two baselines as real, verified transfers, run beside WeightBridge by wb-bench. Both follow
// the native paths of an open-source RL framework and stall every worker for the whole update (sync):
//
//   broadcast  the trainers gather every checkpoint tensor in full to one head rank (each box sent by the
//              first trainer that holds it, as the trainers' source maps say, so any layout works); the
//              head broadcasts each bucket of whole tensors to every rollout worker (MPI_Bcast over the
//              head and the rollouts); each rollout worker runs its own load_weights on what it received.
//   ring       the same gather; the head sends each bucket down a chain of the rollout workers, ordered so
//              that the workers of one machine follow each other, in segments that each worker passes on
//              as soon as it has them (a pipelined chain broadcast, as NCCL's ring broadcast runs): every
//              machine's link carries the model once in and once out, whatever the number of replicas,
//              where the plain broadcast (Open MPI's MPI_Bcast) carries it about twice per replica.
//   p2p        the same gather; the head stages the model in host memory and writes each rollout worker
//              exactly the boxes its source map needs, one-sided (cma on one machine, libfabric or ibverbs
//              between machines), tensor by tensor, from that single source, with no de-duplication
//              across replicas; each rollout worker runs its own load_weights on the boxes it received.
//
// Set-up (the constructor) probes every worker's load_weights and exchanges the source maps, as connect
// does; P2P's buffers are registered and its transports connected there too.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "exec/round_executor.hpp"
#include "layout/probe.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/job_clock.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::bench {

struct BaselineOptions {
  std::int64_t bucket_bytes = std::int64_t{512} << 20;  // whole tensors per gather and broadcast step
  double timeout_seconds = comm::default_timeout_seconds();  // every wait (WB_TIMEOUT_SECONDS)
  std::int64_t ring_segment_bytes = std::int64_t{1} << 20;   // ring: bytes a worker passes on at once
  int ring_window = 8;                                       // ring: segments in flight per link
};

/// One update of a baseline as this rank saw it.
struct BaselineUpdate {
  double begin = 0, end = 0;               // this worker's stall, on the job clock
  std::int64_t between_machines = 0;       // bytes this rank sent to ranks on other machines
  std::int64_t within_machine = 0;         // bytes it sent to ranks on its own machine
};

class Baselines {
 public:
  /// Collective over `world`. `params` are this worker's parameters and `load_weights` its loader;
  /// `tensors` the checkpoint's tensor list. The first trainer (in world order) is the head.
  Baselines(MPI_Comm world, bool trainer, std::vector<TensorInfo> tensors, const ParameterSet& params,
            LoadWeightsFn load_weights, const JobClock& clock, BaselineOptions options = {});
  ~Baselines();
  Baselines(const Baselines&) = delete;
  Baselines& operator=(const Baselines&) = delete;

  /// One update each; collective over `world`. The trainers' parameters hold the version to send; on
  /// return every rollout worker's parameters hold it (loaded by its own load_weights). Throws wb::Error
  /// naming the rank and the step on a failure or a wait past the timeout.
  BaselineUpdate broadcast();
  BaselineUpdate ring_broadcast();
  BaselineUpdate p2p();

  int head() const;
  std::int64_t model_bytes() const;  // every tensor in full: what the head gathers and broadcasts

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace wb::bench
