// The adapters in a job whose world keeps MPI's default error handler, MPI_ERRORS_ARE_FATAL (most users
// never change it). 4 ranks: 2 trainers, 2 single-worker engines. After version 1, world rank 3 dies at
// version 2 (SIGKILL in its before_update_hook); run with a launcher that keeps the job going (mpirun
// --enable-recovery). The survivors must get a Status naming it, never an abort. Each survivor prints one
// line, "fatal_world: world rank R: <event>: <status>", which check_fatal_world.sh counts; the library's
// own duplicates of a communicator return errors even here (checked first, with a call MPI refuses).
#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "comm/collectives.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/frameworks/backend.hpp"
#include "weightbridge/adapter.hpp"

using namespace wb;
using namespace wb::emu;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) {
    std::fprintf(stderr, "fatal_world: run with 4 ranks\n");
    return 2;
  }
  // A duplicate made by the library returns an error for a call MPI refuses (here: a send to a rank that
  // does not exist) instead of aborting, although the world's handler is MPI_ERRORS_ARE_FATAL.
  MPI_Comm copy = comm::duplicate(MPI_COMM_WORLD);
  int value = 0;
  if (MPI_Send(&value, 1, MPI_INT, size, 0, copy) == MPI_SUCCESS) {
    std::fprintf(stderr, "fatal_world: world rank %d: a send to rank %d succeeded\n", rank, size);
    return 2;
  }

  const bool trainer = rank < 2;
  ScaleOptions scale;
  scale.num_layers = 2;
  const ModelConfig model = scale_model(load_named_model_config("qwen3-30b-a3b"), scale);
  const std::vector<TensorInfo> tensors = model_tensors(model);
  const SyntheticCheckpoint checkpoint(tensors, 7);
  std::unique_ptr<EmulatedWorker> worker = trainer ? make_trainer_worker(model, TrainerSpec::parse("tp=2,ep=2"), rank)
                                                   : make_rollout_worker(model, RolloutSpec::parse("engines=2,tp=1"), rank - 2);
  HostParameters params(worker->parameter_infos());
  worker->load_weights(checkpoint, params.parameters());
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : rank, rank, &group);
  const LoadWeightsFn load = [&worker](const CheckpointReader& c, const ParameterSet& p) { worker->load_weights(c, p); };
  AdapterOptions options;
  options.timeout_seconds = 3;
  options.node = trainer ? 0 : rank;
  options.buffer_bytes = 96 << 10;

  if (trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, group, params.parameters(), tensors, load, options);
    sender.connect();
    for (std::uint64_t v = 1; v <= 2; ++v) {
      worker->load_weights(VersionedCheckpoint(checkpoint, v), params.parameters());
      const Status status = sender.send_weights(v);
      if (!status) {
        std::printf("fatal_world: world rank %d: send_weights(%llu) failed: %s\n", rank, static_cast<unsigned long long>(v),
                    status.to_string().c_str());
        break;
      }
    }
    (void)sender.shutdown();
  } else {
    const auto hook = [rank](std::uint64_t v) {
      if (rank == 3 && v == 2) std::raise(SIGKILL);
    };
    ReceiverAdapter receiver(MPI_COMM_WORLD, group, params.parameters(), load, options, hook);
    for (;;) {
      const PollResult result = receiver.poll_requests();
      if (result.event == PollResult::Event::kShutdown) {
        std::printf("fatal_world: world rank %d: shut down without a failure\n", rank);
        break;
      }
      if (result.event == PollResult::Event::kFailed || result.event == PollResult::Event::kAborted) {
        std::printf("fatal_world: world rank %d: %s: %s\n", rank, poll_event_name(result.event), result.status.to_string().c_str());
        break;
      }
    }
  }
  std::fflush(stdout);
  // A peer is dead: MPI_Finalize is not for this job.
  std::_Exit(0);
}
