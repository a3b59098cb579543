// Engine jobs of their own join, leave and die beside a running trainer job (issue 31), run by
// run_join_engine.sh:
//   join_engine trainers ADDRESS MODE SCENARIO   2 trainers (tp=2) and 1 engine of the world; versions 1..3,
//                                                 then more, until the scenario's events happened and 3
//                                                 versions more were sent:
//     join    an engine joined (at version J): J+1..J+3; its first install is J-1, written by the built-in
//             engine (the replica), and the trainers wrote as many bytes for J-1 as for J-2 (none for it)
//     leave   an engine joined and left (leave()), then another joined (at J2): J2+1..J2+3
//     kill    three engine jobs joined (at J); trainer rank 0 writes ADDRESS.trigger naming J+2; the victim
//             job is SIGKILLed in that update; it is dropped (at D): D+1..D+3
//     stop    as kill, but the victim is SIGSTOPped in that update, dropped after the deadline, resumed by
//             the script, and joins again (at R): R+1..R+3
//     vanish  a joiner is admitted at the port and dies before the trainers take it; then another joins
//             (at J): J+1..J+3
//     ghost   as vanish, but the joiner dies right after it answered the trainers' take
//     joined_replica  (the trainers alone, no engine of their own) A joins (2 workers) and is appointed the
//             replica; B joins (at J), gets J-1 from A, the trainers wrote as many bytes for J-1 as for J-2: J+1..J+3
//     kill_relay  (the trainers alone) A joins (2 workers) and is appointed the replica; B joins (at J) and
//             SIGKILLs A's job in the hook of the version A writes it (the relay lost mid-update): B's first
//             install is J, from the trainers; A is dropped; the trainers never fail: J+1..J+3
//     lose_joiner  a joiner dies while the built-in engine writes it its first version (in its
//             before_update_hook of that version): the built-in engine warns and serves on, the joiner is
//             dropped, the trainers never fail; another joins (at J), gets its first version from the
//             built-in engine and serves: J+1..J+3
//     at_once three engine jobs, started at the same moment, all joined: 3 more
//     fleet   (the trainers alone, fleet_link set on every job) A joins, then B (at J), both on one link and
//             one plan: A (2 workers) is the fleet's replica and writes B the version it holds before the
//             trainers take B; then each installs from the version that took it on; the trainers wrote
//             together for J exactly what they wrote for J-1 (one model copy): J+1..J+3
//     fleet_kill  as fleet; then A is SIGKILLed in the update J+2 (its workers relay B's part on one node):
//             the trainers rebuild the fleet link from B, re-send that version, B installs it and every later
//             one, the trainers never fail and name A dropped: D+1..D+3
//     fleet_kill_arriving  as fleet_kill, but A's workers stop as J+2 starts to arrive in their staging
//             (receiver staging; the trainers' writes into them complete, their forwards of B's part never
//             come) and are SIGKILLed once dropped: B misses J+2, and the trainers, whose send_weights on the
//             fleet link waits for every install, re-send it within send_weights(J+2) from their parameters
//     fleet_leave as fleet_kill, but A leaves (leave()) once it installed version J+2: the fleet link is rebuilt
//             from B, which serves on: L+1..L+3
//     fleet_stop  as fleet_kill, but A is SIGSTOPped, dropped after the deadline, resumed by the script: it
//             reports kFailed at once (the trainers' verdict left it out) and joins the fleet link again (at R),
//             B's leader meeting its port: R+1..R+3
//     fleet_join_after_stop  as fleet; then A is SIGSTOPped between updates (once it installed the version
//             ADDRESS.trigger names, T); the trainers end T (wait()) and send nothing until the script writes
//             ADDRESS.go (C, one worker, is admitted at the port by then); send_weights(T+1) finds A silent at C's
//             port: A is left out (the link rebuilt from B, W3), then C is taken onto it, in that call; resumed,
//             A reports kFailed at once and joins again (at R): R+1..R+3
//     fleet_join_after_kill  as fleet_join_after_stop, but A is SIGKILLed there: C+1..C+3
//     fleet_join_after_stop_alone  as fleet_join_after_stop with A alone on the fleet link (hit two versions
//             after its join): left out, no engine is left on the link; C starts a fleet link of its own
//     ghost_connector  a joiner connects and presents nothing, holding the trainers' accept thread; meanwhile
//             another starts to connect and dies (its half of the pairing left at the name server): the trainers'
//             next accept pairs with the dead job and fails (at its mpirun's deadline, pmix_server_max_wait), the
//             port takes the next join: another joins (at J): J+1..J+3
//     fleet_ghost  A joins the fleet link; a joiner then dies once it answered the trainers' fleet offer,
//             before A's leader met its port: the joiner is given up on (A's leader says it could not connect,
//             within the trainers' wait), A is kept and serves on; the trainers send until the script
//             writes ADDRESS.go (it saw them give up on the joiner): 1
//     fleet_ghost_next  as fleet_ghost, then B (one worker) joins once A's connect to the dead joiner ended
//             (6 s: its mpirun gives up at 5): A's leader meets B's port, B installs from the version that took it
//     fleet_refused  A joins the fleet link; B is served by A, the replica, and its admission at the trainers'
//             port (on a thread, after the copy) fails: the trainers refuse it and warn, never take it, and
//             send until the script writes ADDRESS.go (B's job ended): 1
//   join_engine engine ADDRESS MODE ROLE          an engine of as many workers as its job's ranks (tp=n)
//                                                 that joins by ADDRESS:
//     serve   until the trainers shut down
//     leave   leaves after its third install (then poll_requests says kShutdown)
//     leave_at_trigger  leaves once it installed the version ADDRESS.trigger names
//     killed  every worker SIGKILLs itself in the before_update_hook of the version ADDRESS.trigger names
//     killed_first  every worker SIGKILLs itself in its first before_update_hook (its catch-up from the replica)
//     relay   as serve, and every worker writes its pid to ADDRESS.relay.RANK
//     kill_relay  as serve, but its first before_update_hook (the replica's write) SIGKILLs the relay job's workers
//     stopped every worker writes its pid to ADDRESS.stopped.RANK and SIGSTOPs itself in that hook; once
//             resumed, its poll_requests must end in kFailed naming why; it joins again and serves
//     stopped_between, killed_between  as stopped and killed, but between updates: once its install of the
//             version ADDRESS.trigger names was reported (kInstalled)
//     vanish  (one rank) presents the secret, is admitted, and SIGKILLs itself
//     ghost   (one rank) as vanish, once it answered the trainers' take (on the fleet link, their offer first)
//     ghost_fleet  (one rank) as vanish, once it answered the trainers' fleet offer (its port for the
//             joined jobs' leaders open), before any of them met it
//     silent_joiner  (one rank) connects to the trainers' port, presents nothing, and SIGKILLs itself once
//             the script writes ADDRESS.go
//     ghost_connector  (one rank) starts MPI_Comm_connect to the trainers' port and SIGKILLs itself 1 s later
//     patient as serve, its timeout 3 s
//     slow_probe  as serve, but each load_weights pass of its first probe (the one before the replica's copy)
//             takes 2 s more
//     forged_address  as serve, but in its first before_update_hook (the replica's copy, before its admission
//             at the trainers' port) worker 0 replaces the address file by one with another secret (a trainer job
//             restarted meanwhile would look so): the replica's version installed, its poll_requests must end in
//             kFailed on every worker, naming the refused secret; it never serves the trainers
// MODE: sync | sender-staged | receiver-staged | async. Every rollout worker checks every version it installs against its own
// load_weights of that version, bit for bit; the built-in engine installs 1..last in order; a joiner's
// first event after kConnected is kInstalled (of the trainers' latest version, from the built-in engine or
// the fleet's replica), then every later version in order (on the fleet link, from the one that took it:
// those sent between the replica's copy and the take are skipped). The trainers' every
// send_weights succeeds, and their AdapterStats list every engine with the state the scenario implies; a
// join probes the joiner's load_weights only, never the trainers' again.
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "comm/join.hpp"
#include "coord/fleet_link.hpp"
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
  mutable int probes = 0;  // calls of load(): the adapters' probes of this worker's load_weights
  double first_probe_delay = 0;  // seconds each call of its first probe (two passes) sleeps first

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
    return [this](const CheckpointReader& c, const ParameterSet& p) {
      if (++probes <= 2 && first_probe_delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(first_probe_delay));
      worker->load_weights(c, p);
    };
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

AdapterOptions options_for(const std::string& address, const std::string& mode, double timeout = 30) {
  AdapterOptions o;
  o.timeout_seconds = timeout;
  o.join_address = address;
  o.sender_staging = mode == "sender-staged" || mode == "async";
  o.receiver_staging = mode == "receiver-staged" || mode == "async";
  // Several rounds; a script that sets WB_BUFFER_MIB (fleet_kill_arriving: every round in flight at once)
  // leaves the buffer to that setting.
  if (std::getenv("WB_BUFFER_MIB") == nullptr) o.buffer_bytes = 96 << 10;
  return o;
}

// Trainer rank 0 names the version the victim is hit in: written whole (a rename), before the update
// before it is sent, so every worker of the victim reads it in time and alike.
void write_trigger(const std::string& address, std::uint64_t version) {
  const std::string path = address + ".trigger";
  std::ofstream(path + ".part") << version << "\n";
  std::rename((path + ".part").c_str(), path.c_str());
}
std::uint64_t read_trigger(const std::string& address) {
  std::uint64_t version = 0;
  std::ifstream(address + ".trigger") >> version;
  return version;
}

// fleet_join_after_*: until the script writes ADDRESS.go (at most 2 minutes).
bool await_go(const std::string& address) {
  for (int i = 0; i < 1200; ++i) {
    if (std::ifstream(address + ".go").good()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Polls until shutdown (or, `leave_after` > 0, until that many installs, then leaves); the installed
// versions in order. The first event after kConnected must be kInstalled (nothing else but kNone /
// kReceiving in between). `failed`: a failure ends it too (false), kept there. `first_after`: seconds from
// the call (the adapter just made: the trainers took it) to the first install.
bool serve(ReceiverAdapter& receiver, const Worker& w, const char* who, std::vector<std::uint64_t>& installed,
           std::size_t leave_after = 0, PollResult* failed = nullptr, double* first_after = nullptr,
           const std::string& leave_at_trigger = "", const std::function<void(const PollResult&)>& polled = {}) {
  bool connected = false;
  const auto began = std::chrono::steady_clock::now();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (std::chrono::steady_clock::now() < deadline) {
    const PollResult r = receiver.poll_requests();
    if (polled) polled(r);
    switch (r.event) {
      case PollResult::Event::kNone:
      case PollResult::Event::kReceiving: break;
      case PollResult::Event::kConnected:
        if (connected) return false;
        connected = true;
        break;
      case PollResult::Event::kInstalled:
        if (installed.empty() && first_after != nullptr)
          *first_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
        if (!connected || !w.holds(r.version)) return false;
        installed.push_back(r.version);
        if (installed.size() == leave_after ||
            (!leave_at_trigger.empty() && read_trigger(leave_at_trigger) != 0 && r.version >= read_trigger(leave_at_trigger))) {
          receiver.leave();
          return receiver.poll_requests().event == PollResult::Event::kShutdown;
        }
        break;
      case PollResult::Event::kShutdown: return connected;
      default:
        if (failed != nullptr) *failed = r;
        else std::fprintf(stderr, "%s: %s: %s\n", who, poll_event_name(r.event), r.status.to_string().c_str());
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

// The trainers' view of the engines: stats().engines, one word per engine ("serving left dropped"), in
// the order given, or sorted (which joined job a victim is, is the order its job happened to join in).
std::string engine_states(const SenderAdapter& sender, bool sorted = false) {
  std::vector<std::string> words;
  for (const EngineRecord& e : sender.stats().engines) words.push_back(e.state);
  if (sorted) std::sort(words.begin(), words.end());
  std::string states;
  for (const std::string& word : words) states += (states.empty() ? "" : " ") + word;
  return states;
}

int run_trainer_job(const std::string& address, const std::string& mode, const std::string& scenario) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool trainer = rank < 2;
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1, rank, &group);
  int ok = 1;
  if (trainer) {
    Worker w(true, "tp=2", rank);
    const bool victim = scenario == "kill" || scenario == "stop" ||  // fleet_leave: the leaver
                        (scenario.starts_with("fleet_") && !scenario.starts_with("fleet_ghost") && scenario != "fleet_long_step" &&
                         scenario != "fleet_refused");
    const bool join_after = scenario.starts_with("fleet_join_after_");
    const bool alone = scenario.ends_with("_alone");  // A alone on the fleet link when it is hit
    // A victim's deadline is short: it is how long the lost engine is waited for.
    SenderAdapter sender(MPI_COMM_WORLD, group, w.params->parameters(), w.tensors, w.load(),
                         options_for(address, mode, victim || scenario == "lose_joiner" || scenario == "kill_relay" ? 5
                                                     : scenario == "ghost_connector"                           ? 10
                                                                                                                : 30));
    sender.connect();
    const int probes = w.probes;  // a join probes the joiner only: the trainers' maps are kept
    // The events the scenario waits for, in order: engines() after a send_weights, and the states then
    // (sorted where a victim's place among the joined jobs is not known).
    using Events = std::vector<std::pair<int, std::string>>;
    const Events events =
        scenario == "join"    ? Events{{2, "serving serving"}}
        : scenario == "leave" ? Events{{2, "serving serving"}, {1, "serving left"}, {2, "serving left serving"}}
        : scenario == "kill"  ? Events{{4, "serving serving serving serving"}, {3, "dropped serving serving serving"}}
        : scenario == "vanish" || scenario == "ghost" || scenario == "ghost_connector" ? Events{{2, "serving serving"}}
        : scenario == "at_once" ? Events{{4, "serving serving serving serving"}}
        : scenario == "lose_joiner" ? Events{{1, "serving dropped"}, {2, "serving dropped serving"}}
        : scenario == "joined_replica" ? Events{{1, "serving"}, {2, "serving serving"}}
        : scenario == "kill_relay" ? Events{{1, "serving"}, {1, "dropped serving"}}
        : scenario == "fleet" || scenario == "fleet_long_step" ? Events{{1, "serving"}, {2, "serving serving"}}
        : scenario == "fleet_ghost" || scenario == "fleet_refused" ? Events{{1, "serving"}}
        : scenario == "fleet_ghost_next" ? Events{{1, "serving"}, {2, "serving serving"}}
        : scenario == "fleet_kill" || scenario == "fleet_kill_arriving" ? Events{{1, "serving"}, {2, "serving serving"}, {1, "dropped serving"}}
        : scenario == "fleet_leave" ? Events{{1, "serving"}, {2, "serving serving"}, {1, "left serving"}}
        : scenario == "fleet_stop" ? Events{{1, "serving"}, {2, "serving serving"}, {1, "dropped serving"}, {2, "dropped serving serving"}}
        : scenario == "fleet_join_after_stop_alone" ? Events{{1, "serving"}, {1, "dropped serving"}, {2, "dropped serving serving"}}
        : scenario == "fleet_join_after_kill" ? Events{{1, "serving"}, {2, "serving serving"}, {2, "dropped serving serving"}}
        : scenario == "fleet_join_after_stop" ? Events{{1, "serving"}, {2, "serving serving"}, {2, "dropped serving serving"},
                                                       {3, "dropped serving serving serving"}}
                              : Events{{4, "serving serving serving serving"}, {3, "dropped serving serving serving"},
                                       {4, "dropped serving serving serving serving"}};
    std::size_t next = 0;
    int engines = sender.engines();
    std::uint64_t last_event = 0, last = 0, joined_at = 0, hit_at = 0;
    std::vector<double> call_seconds;  // send_weights(v)'s wall time, v = 1, 2, ...
    for (std::uint64_t v = 1;; ++v) {
      w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, v), w.params->parameters());  // "training"
      const auto called = std::chrono::steady_clock::now();
      const Status sent = sender.send_weights(v);
      call_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - called).count());
      if (!sent) {
        std::fprintf(stderr, "trainer %d: %s\n", rank, sent.to_string().c_str());
        ok = 0;
        break;
      }
      if (v == kBefore && rank == 0) std::printf("trainers: version %llu sent\n", static_cast<unsigned long long>(v));
      // fleet_join_after_*: the version A is hit after ends on every engine, then nothing is sent until the
      // joiner waits at the port (the script says so): A is silent at the next send_weights, not in an update.
      if (join_after && v == read_trigger(address)) {
        if (const Status waited = sender.wait(); !waited) {
          std::fprintf(stderr, "trainer %d: wait() after version %llu: %s\n", rank, static_cast<unsigned long long>(v),
                       waited.to_string().c_str());
          ok = 0;
          break;
        }
        if (!await_go(address)) {
          std::fprintf(stderr, "trainer %d: the script never said the joiner waits (%s.go)\n", rank, address.c_str());
          ok = 0;
          break;
        }
      }
      // fleet_long_step: a training step longer than the joiners' timeout while each waits at the port (the
      // script's ADDRESS.hold, seen alike by both trainers): the next send_weights once the script says go.
      if (scenario == "fleet_long_step" && v >= kBefore) {
        int hold = std::ifstream(address + ".hold").good() ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &hold, 1, MPI_INT, MPI_MIN, group);
        if (hold != 0) {
          if (rank == 0) std::printf("trainers: holding after version %llu\n", static_cast<unsigned long long>(v));
          std::fflush(stdout);
          const bool go = sender.wait().is_ok() && await_go(address);
          MPI_Barrier(group);
          if (rank == 0) {
            std::remove((address + ".hold").c_str());
            std::remove((address + ".go").c_str());
          }
          MPI_Barrier(group);
          if (!go) {
            std::fprintf(stderr, "trainer %d: holding after version %llu: no go from the script\n", rank, static_cast<unsigned long long>(v));
            ok = 0;
            break;
          }
        }
      }
      if (const int now = sender.engines(); now != engines && rank == 0) {
        std::printf("trainers: %d engines after version %llu\n", now, static_cast<unsigned long long>(v));
      }
      engines = sender.engines();
      std::fflush(stdout);
      // lose_joiner: the engine count alone says nothing (1 before the join and after the loss).
      // fleet_join_after_*: A left out and C taken leave two engines serving, as before.
      if (next < events.size() && sender.engines() == events[next].first &&
          ((scenario != "lose_joiner" && scenario != "kill_relay") || engine_states(sender) == events[next].second) &&
          (!join_after || engine_states(sender, true) == events[next].second)) {
        const std::string states = engine_states(sender, victim);
        if (!events[next].second.empty() && states != events[next].second) {
          std::fprintf(stderr, "trainer %d: after version %llu the engines are \"%s\", not \"%s\"\n", rank,
                       static_cast<unsigned long long>(v), states.c_str(), events[next].second.c_str());
          ok = 0;
          break;
        }
        if (rank == 0)
          std::printf("trainers: at version %llu %d engines (%s)\n", static_cast<unsigned long long>(v), sender.engines(),
                      states.c_str());
        const bool joined = scenario == "join" || (join_after && next == (alone ? 1u : 2u)) ||
                            ((scenario == "lose_joiner" || scenario == "joined_replica" || scenario.starts_with("fleet")) && !join_after && next == 1);
        if (joined) joined_at = v;
        if (joined && rank == 0) std::printf("trainers: an engine joined at version %llu;\n", static_cast<unsigned long long>(v));
        if (victim && next == (scenario.starts_with("fleet_") && !alone ? 1u : 0u) && rank == 0) {
          write_trigger(address, v + 2);
          hit_at = v + 2;
          std::printf("trainers: the victim is hit in version %llu\n", static_cast<unsigned long long>(v + 2));
        }
        ++next;
        last_event = v;
      }
      // fleet_ghost: on, until the script saw the trainers give up on the joiner that died (ADDRESS.go);
      // fleet_refused: until the refused joiner's job ended. The trainers agree on whether they saw it (each
      // looking alone, one could end while the other sends on).
      bool done = next == events.size() && v >= last_event + kAfter;
      if (done && (scenario == "fleet_ghost" || scenario == "fleet_refused")) {
        int seen = std::ifstream(address + ".go").good() ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &seen, 1, MPI_INT, MPI_MIN, group);
        done = seen != 0;
      }
      if (done) {
        last = v;
        break;
      }
      if (v > 1500) {
        std::fprintf(stderr, "trainer %d: %zu of the scenario's %zu events by version 1500\n", rank, next, events.size());
        ok = 0;
        break;
      }
      if (v >= kBefore) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!sender.shutdown()) ok = 0;
    if (ok && w.probes != probes) {
      std::fprintf(stderr, "trainer %d: load_weights probed %d times at connect, %d times by the end: a join probed the trainers\n",
                   rank, probes, w.probes);
      ok = 0;
    }
    const AdapterStats stats = sender.stats();
    // A joined engine's figures: its probe within its connect, within the time to its first install.
    for (const EngineRecord& e : stats.engines)
      if (ok && e.name.starts_with("joined") && (e.state == "serving" || e.first_install_seconds > 0) &&
          !(e.probe_seconds > 0 && e.probe_seconds <= e.connect_seconds && e.connect_seconds <= e.first_install_seconds)) {
        std::fprintf(stderr, "trainer %d: %s: probe %g s, connect %g s, first install %g s are not in order\n", rank,
                     e.name.c_str(), e.probe_seconds, e.connect_seconds, e.first_install_seconds);
        ok = 0;
      }
    if (ok && rank == 0) {
      for (const EngineRecord& e : stats.engines)
        std::printf("trainers: %s: %s, installed %llu (connected %.3f s after the take, its probe %.3f s, first install "
                    "%.3f s)%s%s\n", e.name.c_str(), e.state.c_str(), static_cast<unsigned long long>(e.installed),
                    e.connect_seconds, e.probe_seconds, e.first_install_seconds, e.why.empty() ? "" : ": ", e.why.c_str());
      std::printf("trainers: sent up to %llu\n", static_cast<unsigned long long>(last));
      // Trainer 0's egress per update (its writes to every engine, built-in and joined): first and last.
      if (stats.history.size() > 1)
        std::printf("trainers: trainer 0 wrote %lld bytes for version %llu, %lld for version %llu (%d engines)\n",
                    static_cast<long long>(stats.history.front().bytes_written),
                    static_cast<unsigned long long>(stats.history.front().version),
                    static_cast<long long>(stats.history.back().bytes_written),
                    static_cast<unsigned long long>(stats.history.back().version), sender.engines());
    }
    // The joiner's first version (the one before the take) came from the replica: this trainer wrote for it
    // what it wrote for the version before (to the built-in engine only), and more once the joiner was served.
    // kill_relay: the relay may be dropped in the update that took the joiner or after it; the joiner's take is
    // the version after the one its record names.
    if (ok && scenario == "kill_relay") {
      const EngineRecord& e = stats.engines.back();
      const std::size_t at = e.name.find("after version ");
      if (at != std::string::npos) joined_at = std::stoull(e.name.substr(at + 14)) + 1;
      if (rank == 0) std::printf("trainers: an engine joined at version %llu;\n", static_cast<unsigned long long>(joined_at));
    }
    // The calls around a loss on the fleet link (the loss is met in the victim's version, or a call later
    // where either side stages): detection, rebuild and resend.
    if (ok && scenario.starts_with("fleet_") && rank == 0 && hit_at >= 2 && hit_at + 2 <= call_seconds.size()) {
      std::printf("trainers: send_weights took");
      for (std::uint64_t u = hit_at - 1; u <= hit_at + 2; ++u) std::printf(" %.3f s (version %llu)", call_seconds[u - 1], static_cast<unsigned long long>(u));
      std::printf("\n");
    }
    // The fleet link: both joined jobs on one plan, so the trainers wrote together for version J (A and B)
    // exactly what they wrote for J-1 (A alone): one model copy, whatever the number of joined jobs.
    if (ok && scenario == "fleet") {
      std::int64_t bytes[2] = {0, 0};  // versions J-1, J, summed over the trainers
      for (const UpdateRecord& r : stats.history)
        if (r.version + 1 >= joined_at && r.version <= joined_at) bytes[r.version + 1 - joined_at] = r.bytes_written;
      MPI_Allreduce(MPI_IN_PLACE, bytes, 2, MPI_INT64_T, MPI_SUM, group);
      if (rank == 0)
        std::printf("trainers: the trainers wrote %lld bytes for version %llu (one joined engine), %lld for version %llu "
                    "(two, on the fleet link)\n", static_cast<long long>(bytes[0]), static_cast<unsigned long long>(joined_at - 1),
                    static_cast<long long>(bytes[1]), static_cast<unsigned long long>(joined_at));
      if (bytes[0] <= 0 || bytes[1] != bytes[0]) {
        std::fprintf(stderr, "trainer %d: the trainers' egress with two joined engines is not one model copy\n", rank);
        ok = 0;
      }
    }
    if (ok && joined_at > 2 && scenario != "kill_relay" && !scenario.starts_with("fleet")) {
      std::int64_t bytes[3] = {-1, -1, -1};  // versions J-2, J-1, J
      for (const UpdateRecord& r : stats.history)
        if (r.version + 2 >= joined_at && r.version <= joined_at) bytes[r.version + 2 - joined_at] = r.bytes_written;
      std::printf("trainers: trainer %d wrote %lld bytes for version %llu, %lld for version %llu (the joiner's first, from "
                  "the replica), %lld for version %llu\n", rank, static_cast<long long>(bytes[0]),
                  static_cast<unsigned long long>(joined_at - 2), static_cast<long long>(bytes[1]),
                  static_cast<unsigned long long>(joined_at - 1), static_cast<long long>(bytes[2]),
                  static_cast<unsigned long long>(joined_at));
      if (bytes[0] <= 0 || bytes[1] != bytes[0] || bytes[2] <= bytes[1]) {
        std::fprintf(stderr, "trainer %d: the trainers' egress for the joiner's first version is not that of the version before\n", rank);
        ok = 0;
      }
    }
    // Killed or stopped: exactly one engine dropped, named with its cause, the others serving up to the last
    // version.
    if (ok && victim) {
      int dropped = 0;
      const std::string gone = scenario == "fleet_leave" ? "left" : "dropped";
      for (const EngineRecord& e : stats.engines) {
        if (e.state == gone && !e.why.empty() && e.installed < last) ++dropped;
        else if (e.state != "serving" || e.installed != last) ok = 0;
      }
      if (dropped != 1) ok = 0;
      if (!ok) std::fprintf(stderr, "trainer %d: not one engine dropped and the others at %llu\n", rank, static_cast<unsigned long long>(last));
    }
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

// The victim's hook: in the version the trainers named, every worker is killed or stopped (the whole job,
// as a crash or a frozen node would); a stopped one writes its pid for the script that resumes it.
BeforeUpdateHook victim_hook(const std::string& address, const std::string& role, int rank, bool& hit) {
  if (role == "killed_first") return [](std::uint64_t) { std::raise(SIGKILL); };
  if (role == "kill_relay")
    return [address, &hit](std::uint64_t) {
      for (int r = 0; !hit && r < 2; ++r) {
        pid_t pid = 0;
        std::ifstream(address + ".relay." + std::to_string(r)) >> pid;
        if (pid > 0) ::kill(pid, SIGKILL);
      }
      hit = true;
    };
  if (role == "forged_address")
    return [address, rank, &hit](std::uint64_t) {
      if (hit || rank != 0) return;
      hit = true;
      comm::JoinAddress forged = comm::read_address_file(address);
      forged.secret.assign(forged.secret.size(), '0');
      const std::string next = address + ".forged";
      comm::write_address_file(next, forged);  // owner-only, as the trainers' own
      if (std::rename(next.c_str(), address.c_str()) != 0) std::perror("forged_address: rename");
    };
  if (role != "killed" && role != "stopped") return {};
  return [address, role, rank, &hit](std::uint64_t v) {
    const std::uint64_t at = read_trigger(address);
    if (hit || at == 0 || v < at) return;
    hit = true;
    if (role == "killed") std::raise(SIGKILL);
    std::ofstream(address + ".stopped." + std::to_string(rank)) << getpid() << "\n";
    std::raise(SIGSTOP);
  };
}

int run_engine_job(const std::string& address, const std::string& mode, const std::string& role) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (role == "vanish") {  // admitted at the port, gone before the trainers take it
    (void)comm::join_by_address(address, 30);
    std::printf("vanishing joiner: admitted\n");
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  if (role == "silent_joiner") {  // connects to the trainers' port and presents nothing, until the script's go
    const comm::JoinAddress joined = comm::read_address_file(address);
    MPI_Comm trainers = MPI_COMM_NULL;
    MPI_Comm_connect(joined.port.c_str(), MPI_INFO_NULL, 0, MPI_COMM_SELF, &trainers);
    std::printf("silent joiner: connected\n");
    std::fflush(stdout);
    for (int i = 0; i < 1200 && !std::ifstream(address + ".go").good(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::raise(SIGKILL);
  }
  if (role == "ghost_connector") {  // starts a connect to the trainers' port, and is gone before it pairs
    const comm::JoinAddress joined = comm::read_address_file(address);
    std::thread([port = joined.port] {
      MPI_Comm trainers = MPI_COMM_NULL;
      MPI_Comm_connect(port.c_str(), MPI_INFO_NULL, 0, MPI_COMM_SELF, &trainers);
    }).detach();
    std::this_thread::sleep_for(std::chrono::seconds(1));  // its half published at the name server
    std::printf("ghost connector: connecting, and gone\n");
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  if (role == "ghost_fleet") {  // answers the trainers' fleet offer (its port open), and is gone before the meeting
    const MPI_Comm leaders = comm::join_by_address(address, 30);
    std::unique_ptr<comm::JoinPort> port;
    std::int64_t jobs = 0;
    comm::AddressWatch watch(address, 30);
    if (!coord::answer_fleet(leaders, address, 30, watch, port, jobs)) return 1;
    std::printf("ghost joiner: answered the fleet offer (%lld job(s) to meet)\n", static_cast<long long>(jobs));
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  if (role == "ghost") {  // answers the trainers' take, and is gone before the widening
    const MPI_Comm leaders = comm::join_by_address(address, 30);
    // On the fleet link the take comes after the trainers' offer (its first joiner: no port to open).
    std::unique_ptr<comm::JoinPort> port;
    std::int64_t jobs = 0;
    comm::AddressWatch watch(address, 30);
    if (coord::fleet_link_enabled() && !coord::answer_fleet(leaders, address, 30, watch, port, jobs)) return 1;
    if (!comm::answer_take(leaders, 30)) return 1;
    std::printf("ghost joiner: answered the take\n");
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  Worker w(false, ("engines=1,tp=" + std::to_string(size)).c_str(), rank);
  if (role == "slow_probe") w.first_probe_delay = 2;
  if (role == "relay") std::ofstream(address + ".relay." + std::to_string(rank)) << getpid() << "\n";
  std::vector<std::uint64_t> installed;
  int ok = 0;
  bool hit = false;
  double first_after = 0;
  // A fleet joiner that the replica served before the trainers took it: the replica's version (at hand once
  // the adapter is made), then the versions from the one that took it on (any sent in between skipped).
  std::uint64_t served_before = 0;
  const bool stopped = role == "stopped" || role == "stopped_between";
  const bool forged = role == "forged_address";
  {
    // patient: a timeout shorter than the trainers' step while it waits at their port (fleet_long_step).
    ReceiverAdapter receiver(MPI_COMM_WORLD, MPI_COMM_WORLD, w.params->parameters(), w.load(),
                             options_for(address, mode, role == "patient" ? 3 : 30), victim_hook(address, role, rank, hit));
    served_before = receiver.installed_version();
    PollResult failed;
    // frozen_arriving: every worker stops (SIGSTOP) as the version the trainers named starts to arrive in
    // the background (receiver staging): the trainers' writes into its memory still complete (CMA), its
    // forwards of the others' parts never come; the script SIGKILLs it once the trainers dropped it.
    std::function<void(const PollResult&)> polled;
    if (role == "stopped_between" || role == "killed_between")
      polled = [&address, &hit, &role, rank](const PollResult& r) {
        const std::uint64_t at = read_trigger(address);
        if (!hit && at != 0 && r.event == PollResult::Event::kInstalled && r.version >= at) {
          hit = true;
          std::ofstream(address + ".stopped." + std::to_string(rank)) << getpid() << "\n";
          std::raise(role == "killed_between" ? SIGKILL : SIGSTOP);
        }
      };
    if (role == "frozen_arriving")
      polled = [&address, &hit, rank](const PollResult& r) {
        const std::uint64_t at = read_trigger(address);
        if (!hit && at != 0 && r.event == PollResult::Event::kReceiving && r.version + 1 >= at) {
          hit = true;
          std::ofstream(address + ".stopped." + std::to_string(rank)) << getpid() << "\n";
          std::raise(SIGSTOP);
        }
      };
    ok = serve(receiver, w, "the joined engine", installed, role == "leave" ? 3 : 0, stopped || forged ? &failed : nullptr, &first_after,
               role == "leave_at_trigger" ? address : "", polled) ? 1 : 0;
    if (forged) {
      // Served by the replica (its version installed, bit for bit), then refused at the trainers' port: the
      // admission's failure, on every worker, and nothing after it.
      const bool refused = failed.event == PollResult::Event::kFailed &&
                           failed.status.message().find("the trainers refused the secret") != std::string::npos;
      ok = hit == (rank == 0) && installed.size() == 1 && installed[0] == served_before && refused ? 1 : 0;
      std::printf("joined engine worker %d: served version %llu by the replica (%zu install(s)), then %s: %s\n", rank,
                  static_cast<unsigned long long>(served_before), installed.size(), poll_event_name(failed.event),
                  failed.status.to_string().c_str());
      int all = 0;
      MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      return all == 1 ? 0 : 1;
    }
    if (stopped) {
      // Resumed after the trainers dropped it: its update ends in kFailed (an kAborted of the version it
      // was in first), naming why.
      if (failed.event == PollResult::Event::kAborted) failed = receiver.poll_requests();
      ok = hit && failed.event == PollResult::Event::kFailed && !failed.status.message().empty() ? 1 : 0;
      std::printf("joined engine worker %d: resumed: %s: %s\n", rank, poll_event_name(failed.event), failed.status.to_string().c_str());
    }
  }
  if (stopped && ok) {
    // It joins again: the first event after kConnected is kInstalled, then every later version.
    installed.clear();
    ReceiverAdapter again(MPI_COMM_WORLD, MPI_COMM_WORLD, w.params->parameters(), w.load(), options_for(address, mode));
    served_before = again.installed_version();
    ok = serve(again, w, "the engine that joined again", installed) ? 1 : 0;
  }
  const std::size_t count = role == "leave" ? 3 : kAfter + 1;
  const std::vector<std::uint64_t> taken(installed.begin() + (served_before > 0 && installed.size() > 1 && installed[0] == served_before &&
                                                                     installed[1] > served_before ? 1 : 0),
                                         installed.end());
  if (ok && (installed.size() < count || installed.front() <= kBefore || !consecutive(taken, taken.front(), taken.back()))) {
    std::string list;
    for (std::uint64_t v : installed) list += " " + std::to_string(v);
    std::fprintf(stderr, "joined engine worker %d: %zu versions installed (%s), not J.. in order (%llu or more) with J > %llu\n", rank,
                 installed.size(), list.c_str(), static_cast<unsigned long long>(count), static_cast<unsigned long long>(kBefore));
    ok = 0;
  }
  if (ok)
    std::printf("joined engine worker %d: first event after kConnected kInstalled %llu, then up to %llu, each bit for bit%s%s "
                "(first install %.3f s after the take)\n", rank,
                static_cast<unsigned long long>(installed.front()), static_cast<unsigned long long>(installed.back()),
                served_before > 0 ? (", from the replica before its take, then from " + std::to_string(taken.front())).c_str() : "",
                role == "leave" ? "; then it left" : stopped ? "; it had joined again" : "", first_after);
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
  const std::string role = argc == 5 ? argv[1] : "";
  try {
    if (role == "trainers") rc = wb::emu::run_trainer_job(argv[2], argv[3], argv[4]);
    else if (role == "engine") rc = wb::emu::run_engine_job(argv[2], argv[3], argv[4]);
    else std::fprintf(stderr, "usage: join_engine trainers ADDRESS MODE join|leave|kill|stop | engine ADDRESS MODE serve|leave|killed|stopped (MODE: sync, sender-staged, receiver-staged or async)\n");
  } catch (const wb::Error& error) {
    std::fprintf(stderr, "%s\n", error.status().to_string().c_str());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
