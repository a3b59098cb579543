// wb-elastic: a trainer job and rollout engines that are MPI jobs of their own, joining it by address and
// leaving or dying while it trains (issue 31; scripts/elastic-demo.sh runs one such fleet).
//
//   mpirun --ompi-server file:URI --mca pmix_server_max_wait 5 --mca btl_tcp_progress_thread 1
//       -np T wb-elastic trainers --address FILE [--steps K] [--step-ms MS]
//   mpirun --ompi-server file:URI --mca pmix_server_max_wait 5 --mca btl_tcp_progress_thread 1
//       -np E wb-elastic engine --address FILE [--name NAME]
//
// The trainers (tensor parallel over the job's T ranks, no engine of their own world) publish FILE
// (join_address) and send versions 1..K of a synthetic checkpoint of --model, one every --step-ms; trainer
// rank 0 prints each change in the number of engines, the warning for an engine that was dropped, and at the
// end every engine with its state and the last version it acknowledged. An engine (tensor parallel over its
// job's E ranks) joins by FILE and serves until the trainers shut down; its rank 0 prints every version it
// installs, each checked on every rank against the engine's own load_weights of that version, bit for bit.
// Both sides take the same --model, --layers and --mode. Exit 0 when every check passed.
#include <mpi.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "comm/deadline.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/options/setting_flags.hpp"
#include "emu/setup/joined_engine.hpp"
#include "weightbridge/adapter.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

struct Options {
  std::string role, address, model = "qwen3-30b-a3b", mode = "sync", name = "engine";
  std::int64_t layers = 2;
  int steps = 40;
  double step_ms = 250;
};

// This rank's emulated worker over a synthetic checkpoint that every job generates alike (seed 7).
struct Worker {
  std::vector<TensorInfo> tensors;
  std::unique_ptr<SyntheticCheckpoint> checkpoint;
  std::unique_ptr<EmulatedWorker> worker;
  std::unique_ptr<HostParameters> params;

  Worker(const Options& o, int rank, int size) {
    ScaleOptions scale;
    scale.num_layers = o.layers;
    const ModelConfig model = scale_model(load_named_model_config(o.model), scale);
    tensors = model_tensors(model);
    checkpoint = std::make_unique<SyntheticCheckpoint>(tensors, 7);
    const std::string tp = "tp=" + std::to_string(size);
    worker = o.role == "trainers" ? make_trainer_worker(model, TrainerSpec::parse(tp), rank)
                                  : make_rollout_worker(model, RolloutSpec::parse("engines=1," + tp), rank);
    params = std::make_unique<HostParameters>(worker->parameter_infos());
    worker->load_weights(*checkpoint, params->parameters());
  }
  LoadWeightsFn load() const {
    return [this](const CheckpointReader& c, const ParameterSet& p) { worker->load_weights(c, p); };
  }
  // The parameters hold exactly this worker's own load_weights of version v; otherwise the first that differs.
  std::string differs(std::uint64_t v) const {
    HostParameters expected(worker->parameter_infos());
    worker->load_weights(VersionedCheckpoint(*checkpoint, v), expected.parameters());
    const ParameterSet& a = params->parameters();
    const ParameterSet& b = expected.parameters();
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(a[i].view.data, b[i].view.data, a[i].view.nbytes()) != 0) return a[i].name;
    return "";
  }
};

AdapterOptions adapter_options(const Options& o) {
  AdapterOptions a;
  a.join_address = o.address;
  a.sender_staging = o.mode == "sender-staged" || o.mode == "async";
  a.receiver_staging = o.mode == "receiver-staged" || o.mode == "async";
  return a;
}

bool all_ranks(bool mine) {
  int ok = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

int run_trainers(const Options& o, int rank, int size) {
  Worker w(o, rank, size);
  SenderAdapter sender(MPI_COMM_WORLD, MPI_COMM_WORLD, w.params->parameters(), w.tensors, w.load(), adapter_options(o));
  sender.connect();
  if (rank == 0) std::printf("trainers: %d ranks publish %s; versions 1..%d every %g ms\n", size, o.address.c_str(), o.steps, o.step_ms);
  bool ok = true;
  int engines = 0;
  for (int v = 1; v <= o.steps && ok; ++v) {
    const auto began = std::chrono::steady_clock::now();
    w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, static_cast<std::uint64_t>(v)), w.params->parameters());
    const Status sent = sender.send_weights(static_cast<std::uint64_t>(v));
    if (!sent) {
      std::fprintf(stderr, "trainer %d: %s\n", rank, sent.to_string().c_str());
      ok = false;
    }
    if (sender.engines() != engines && rank == 0) std::printf("trainers: %d engine(s) after version %d\n", sender.engines(), v);
    engines = sender.engines();
    std::fflush(stdout);
    std::this_thread::sleep_until(began + std::chrono::duration<double, std::milli>(o.step_ms));
  }
  if (const Status done = sender.shutdown(); !done) {
    std::fprintf(stderr, "trainer %d: shutdown: %s\n", rank, done.to_string().c_str());
    ok = false;
  }
  if (rank == 0)
    for (const EngineRecord& e : sender.stats().engines)
      std::printf("trainers: %s: %s, last version %llu%s%s\n", e.name.c_str(), e.state.c_str(),
                  static_cast<unsigned long long>(e.installed), e.why.empty() ? "" : ": ", e.why.c_str());
  return all_ranks(ok) ? 0 : 1;
}

int run_engine(const Options& o, int rank, int size) {
  Worker w(o, rank, size);
  JoinedEngineRun run;
  run.name = o.name;
  run.timeout = comm::normalize_timeout(comm::timeout_setting());
  const JoinedEngineOutcome out = serve_joined_engine(w.params->parameters(), w.load(), adapter_options(o), {},
                                                      [&w](std::uint64_t v) { return w.differs(v); }, run);
  return all_ranks(out.failure.empty()) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // joins accept and connect on a thread
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  po::options_description flags("wb-elastic trainers|engine --address FILE [options]");
  flags.add_options()("help", "this text")
      ("role", po::value(&o.role), "trainers or engine (the first argument)")
      ("address", po::value(&o.address), "the join address file: written by the trainers (absent before), read by engines")
      ("model", po::value(&o.model)->default_value(o.model), "model name or config.json (both sides alike)")
      ("layers", po::value(&o.layers)->default_value(o.layers), "layers of the scaled-down model (both sides alike)")
      ("mode", po::value(&o.mode)->default_value(o.mode), "sync, sender-staged, receiver-staged or async (both sides alike)")
      ("steps", po::value(&o.steps)->default_value(o.steps), "trainers: versions to send")
      ("step-ms", po::value(&o.step_ms)->default_value(o.step_ms), "trainers: milliseconds per training step")
      ("name", po::value(&o.name)->default_value(o.name), "engine: its name in what it prints");
  add_setting_options(flags);
  po::positional_options_description positional;
  positional.add("role", 1);
  int rc = 2;
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(flags).positional(positional).run(), vm);
    po::notify(vm);
    apply_setting_overrides(vm);
    if (vm.count("help") || (o.role != "trainers" && o.role != "engine") || o.address.empty()) {
      if (rank == 0) std::cout << flags << "\n";
      rc = vm.count("help") ? 0 : 2;
    } else {
      rc = o.role == "trainers" ? run_trainers(o, rank, size) : run_engine(o, rank, size);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "wb-elastic (rank %d): %s\n", rank, error.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
