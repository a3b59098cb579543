// An engine job of its own joins a running trainer job by address (issue 31), run by run_join_engine.sh:
//   join_engine trainers ADDRESS MODE   2 trainers (tp=2) and 1 engine of the world; versions 1..3, then
//                                        more until an engine joined (at version J), then J+1..J+3
//   join_engine engine ADDRESS MODE     a 2-worker engine (tp=2) that joins by ADDRESS
// MODE: sync | receiver-staged. Every rollout worker checks every version it installs against its own
// load_weights of that version, bit for bit; the built-in engine installs 1..J+3 in order, the joiner's
// first event after kConnected is kInstalled with J, then J+1..J+3. Exit 0 when all of it holds.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "emu/checkpoints/synthetic.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/frameworks/backend.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::emu {
namespace {

constexpr std::uint64_t kBefore = 3, kAfter = 3;

struct Worker {
  ModelConfig model;
  std::vector<TensorInfo> tensors;
  std::unique_ptr<SyntheticCheckpoint> checkpoint;
  std::unique_ptr<EmulatedWorker> worker;
  std::unique_ptr<HostParameters> params;

  Worker(bool trainer, const char* spec, int rank) {
    ScaleOptions scale;
    scale.num_layers = 2;
    model = scale_model(load_named_model_config("qwen3-30b-a3b"), scale);
    tensors = model_tensors(model);
    checkpoint = std::make_unique<SyntheticCheckpoint>(tensors, 7);
    worker = trainer ? make_trainer_worker(model, TrainerSpec::parse(spec), rank)
                     : make_rollout_worker(model, RolloutSpec::parse(spec), rank);
    params = std::make_unique<HostParameters>(worker->parameter_infos());
    worker->load_weights(*checkpoint, params->parameters());
  }
  LoadWeightsFn load() const {
    return [this](const CheckpointReader& c, const ParameterSet& p) { worker->load_weights(c, p); };
  }
  // Its parameters hold exactly its own load_weights of version v.
  bool holds(std::uint64_t v) const {
    HostParameters expected(worker->parameter_infos());
    worker->load_weights(VersionedCheckpoint(*checkpoint, v), expected.parameters());
    const ParameterSet& a = params->parameters();
    const ParameterSet& b = expected.parameters();
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(a[i].view.data, b[i].view.data, a[i].view.nbytes()) != 0) {
        std::fprintf(stderr, "version %llu: parameter %s differs\n", static_cast<unsigned long long>(v), a[i].name.c_str());
        return false;
      }
    return true;
  }
};

AdapterOptions options_for(const std::string& address, const std::string& mode) {
  AdapterOptions o;
  o.timeout_seconds = 30;
  o.join_address = address;
  o.receiver_staging = mode == "receiver-staged";
  o.buffer_bytes = 96 << 10;  // several rounds
  return o;
}

// Polls until shutdown; the installed versions in order. `joined`: the first event after kConnected must be
// kInstalled (nothing else but kNone / kReceiving in between).
bool serve(ReceiverAdapter& receiver, const Worker& w, const char* who, std::vector<std::uint64_t>& installed) {
  bool connected = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (std::chrono::steady_clock::now() < deadline) {
    const PollResult r = receiver.poll_requests();
    switch (r.event) {
      case PollResult::Event::kNone:
      case PollResult::Event::kReceiving: break;
      case PollResult::Event::kConnected:
        if (connected) return false;
        connected = true;
        break;
      case PollResult::Event::kInstalled:
        if (!connected || !w.holds(r.version)) return false;
        installed.push_back(r.version);
        break;
      case PollResult::Event::kShutdown: return connected;
      default:
        std::fprintf(stderr, "%s: %s: %s\n", who, poll_event_name(r.event), r.status.to_string().c_str());
        return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "%s: no shutdown within 240 s\n", who);
  return false;
}

bool consecutive(const std::vector<std::uint64_t>& v, std::uint64_t first, std::uint64_t last) {
  if (v.size() != last - first + 1) return false;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != first + i) return false;
  return true;
}

int run_trainer_job(const std::string& address, const std::string& mode) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool trainer = rank < 2;
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1, rank, &group);
  std::uint64_t joined_at = 0, last = 0;
  int ok = 1;
  if (trainer) {
    Worker w(true, "tp=2", rank);
    SenderAdapter sender(MPI_COMM_WORLD, group, w.params->parameters(), w.tensors, w.load(), options_for(address, mode));
    sender.connect();
    for (std::uint64_t v = 1;; ++v) {
      w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, v), w.params->parameters());  // "training"
      const Status sent = sender.send_weights(v);
      if (!sent) {
        std::fprintf(stderr, "trainer %d: %s\n", rank, sent.to_string().c_str());
        ok = 0;
        break;
      }
      if (v == kBefore && rank == 0) std::printf("trainers: version %llu sent\n", static_cast<unsigned long long>(v));
      std::fflush(stdout);
      if (joined_at == 0 && sender.engines() == 2) joined_at = v;
      if (joined_at != 0 && v == joined_at + kAfter) {
        last = v;
        break;
      }
      if (v > 400) {
        std::fprintf(stderr, "trainer %d: no engine joined by version 400\n", rank);
        ok = 0;
        break;
      }
      if (v >= kBefore) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!sender.shutdown()) ok = 0;
    if (ok && rank == 0)
      std::printf("trainers: an engine joined at version %llu; sent up to %llu\n", static_cast<unsigned long long>(joined_at),
                  static_cast<unsigned long long>(last));
  } else {
    Worker w(false, "engines=1,tp=1", 0);
    AdapterOptions o = options_for("", mode);
    ReceiverAdapter receiver(MPI_COMM_WORLD, group, w.params->parameters(), w.load(), o);
    std::vector<std::uint64_t> installed;
    ok = serve(receiver, w, "the built-in engine", installed) ? 1 : 0;
    if (ok && (installed.empty() || !consecutive(installed, 1, installed.back()) || installed.back() <= kBefore + kAfter)) {
      std::fprintf(stderr, "the built-in engine installed %zu versions, not 1.. in order\n", installed.size());
      ok = 0;
    }
    if (ok) std::printf("built-in engine: versions 1..%llu, each bit for bit\n", static_cast<unsigned long long>(installed.back()));
  }
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1 ? 0 : 1;
}

int run_engine_job(const std::string& address, const std::string& mode) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Worker w(false, "engines=1,tp=2", rank);
  std::vector<std::uint64_t> installed;
  int ok = 0;
  {
    ReceiverAdapter receiver(MPI_COMM_WORLD, MPI_COMM_WORLD, w.params->parameters(), w.load(), options_for(address, mode));
    ok = serve(receiver, w, "the joined engine", installed) ? 1 : 0;
  }
  if (ok && (installed.empty() || installed.front() <= kBefore || !consecutive(installed, installed.front(), installed.front() + kAfter))) {
    std::fprintf(stderr, "joined engine worker %d: %zu versions installed, not J..J+%llu with J > %llu\n", rank, installed.size(),
                 static_cast<unsigned long long>(kAfter), static_cast<unsigned long long>(kBefore));
    ok = 0;
  }
  if (ok)
    std::printf("joined engine worker %d: first event after kConnected kInstalled %llu, then up to %llu, each bit for bit\n", rank,
                static_cast<unsigned long long>(installed.front()), static_cast<unsigned long long>(installed.back()));
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1 ? 0 : 1;
}

}  // namespace
}  // namespace wb::emu

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 2;
  const std::string role = argc == 4 ? argv[1] : "";
  try {
    if (role == "trainers") rc = wb::emu::run_trainer_job(argv[2], argv[3]);
    else if (role == "engine") rc = wb::emu::run_engine_job(argv[2], argv[3]);
    else std::fprintf(stderr, "usage: join_engine trainers|engine ADDRESS sync|receiver-staged\n");
  } catch (const wb::Error& error) {
    std::fprintf(stderr, "%s\n", error.status().to_string().c_str());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
