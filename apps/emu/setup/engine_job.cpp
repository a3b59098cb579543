#include "emu/setup/engine_job.hpp"

#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <stop_token>
#include <thread>
#include <vector>

#include "core/checks.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/frameworks/worker_parameters.hpp"
#include "emu/reports/trace_file.hpp"
#include "emu/setup/joined_engine.hpp"
#include "emu/setup/reference_ahead.hpp"
#include "emu/setup/update_mark.hpp"
#include "transport/transport.hpp"

namespace wb::emu {

int run_engine_job(const RunOptions& options, const RunSetup& setup, const EngineJob& job, Ending& ending) {
  const double timeout = ending.timeout;  // the job's (job_timeout()), set by the caller
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const RolloutSpec& spec = setup.deployment.rollout;
  if (spec.engines != 1 || spec.tp != world)
    throw Error(ErrorCode::kInvalidArgument, "--engine-job: the job is one engine of its " + std::to_string(world) +
                                                 " ranks, but --rollout " + spec.to_string() + " has " +
                                                 std::to_string(spec.engines) + " of tp=" + std::to_string(spec.tp));
  if ((job.knock_at_ms >= 0 || job.fault.placed()) && job.update_mark.empty())
    throw Error(ErrorCode::kInvalidArgument, "--engine-job: a join or fault placed in the trainers' update needs their --update-mark");
  const std::string who = job.name + " worker " + std::to_string(rank);
  ending.who = who;
  // A fault placed in the trainers' update falls wherever the engine is then (its receive, its install,
  // its poll loop), so a thread of its own waits for it. Stopped and joined when the job ends first.
  std::jthread placed;
  if (job.fault.placed() && job.fault.rank == rank)
    placed = std::jthread([&job, who, timeout](std::stop_token stop) {
      while (::access(job.fault.when.c_str(), F_OK) != 0)
        if (stop.stop_requested()) return;
        else std::this_thread::sleep_for(std::chrono::milliseconds(2));
      try {
        const UpdateMark mark = UpdateMark::wait_into_next(job.update_mark, *job.fault.at_ms, std::max(timeout, 60.0), stop);
        if (mark.version == 0) return;
        job.fault.met = mark.version;
        // Where it fell, measured (the bench's JSON takes it from this line).
        std::fprintf(stderr, "%s: fault placed: %s: %.3f s into the trainers' update %llu\n", job.program.c_str(), who.c_str(),
                     wall_seconds() - mark.began, static_cast<unsigned long long>(mark.version));
        inject(job.fault, job.program, who);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "%s: %s: the fault placed in the trainers' update: %s\n", job.program.c_str(), who.c_str(), error.what());
      }
    });
  const std::unique_ptr<EmulatedWorker> worker = make_rollout_worker(setup.model, spec, rank);
  const WorkerParameters params(worker->parameter_infos(), parse_parameter_place(options.device), default_cuda_device());
  params.load(*worker, EngineVersion(setup, 0, worker->loads_fp8_form()).reader());
  // Loaded ahead in the inference steps, so that the check at each install holds no joiner at the replica.
  ReferenceAhead reference(*worker, setup);
  AdapterOptions adapter;
  adapter.join_address = job.join_address;
  adapter.receiver_staging = job.mode.receiver_staging;
  if (worker->loads_fp8_form()) adapter.fp8 = fp8_engine_option(setup.engine_form->config);
  if (!options.trace.empty()) adapter.trace = true;
  JoinedEngineRun run;
  run.name = job.name;
  run.step_ms = job.step_ms;
  run.timeout = timeout;
  run.expect_next = [&](std::uint64_t v) { reference.expect(v); };
  run.inference_step = [&](double ms) { reference.inference_step(ms); };
  UpdateMark knock_mark;  // rank 0's, where the join is placed in the trainers' update
  double knock_into = 0;
  if (job.knock_at_ms >= 0 && rank == 0)
    run.before_join = [&] {
      knock_mark = UpdateMark::wait_into_next(job.update_mark, job.knock_at_ms, std::max(timeout, 60.0));
      knock_into = wall_seconds() - knock_mark.began;
    };
  JoinedEngineOutcome out;
  try {
    out = serve_joined_engine(
        params.parameters(), params.loader(*worker), adapter,
        [&](std::uint64_t v) {
          if (job.fault.due(rank, v)) inject(job.fault, job.program, who);  // never one placed in the update
        },
        [&](std::uint64_t v) { return reference.difference(params.read(), v); }, run);
  } catch (const std::exception& error) {
    out.failure = job.program + ": " + error.what();
  }
  if (out.failure.empty() && out.installed.empty())
    out.failure = who + ": the trainers shut down before this engine installed any version";
  nlohmann::json mine = joined_engine_json(out);
  mine["who"] = who;
  mine["failed_at"] = out.failure.empty() ? 0.0 : wall_seconds();
  mine["trace"] = timeline_json(out.stats);
  const std::vector<nlohmann::json> reports = gather_reports(mine, timeout);
  int exit_code = out.failure.empty() ? 0 : 1;
  bool everyone = true;
  std::string first_failed;
  if (rank == 0) {
    double probe = 0;
    nlohmann::json failed = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& report = reports[static_cast<std::size_t>(r)];
      if (report.is_null()) {
        everyone = false;
        failed.push_back({{"rank", r}, {"error", "did not report within " + std::to_string(timeout) + " s (stopped or dead)"}});
      } else if (const std::string error = report["failure"].get<std::string>(); !error.empty()) {
        failed.push_back({{"rank", r}, {"error", error}});
      } else {
        probe = std::max(probe, report["probe_s"].get<double>());
      }
    }
    const bool verified = failed.empty();
    exit_code = verified ? 0 : 1;
    first_failed = first_failure(reports, timeout);
    nlohmann::json result = mine;
    result.erase("trace");
    result.erase("who");
    result["verified"] = verified;
    result["role"] = "engine-job";
    result["name"] = job.name;
    result["mode"] = job.mode.name;
    result["model"] = setup.model.name;
    result["rollout"] = spec.to_string();
    result["workers"] = world;
    result["machine"] = machine_id();
    result["probe_s"] = probe;  // the slowest worker's: the engine's probe ends with it
    result["model_bytes"] = out.summary.model_bytes;  // M of its link: what the trainers send it per update
    if (setup.engine_form) result["fp8_form_bytes"] = setup.engine_form->total_bytes();
    // From the take, or, for a first version from the fleet's replica, from the knock (no wait at the port
    // comes before it).
    const double began = out.from_replica ? out.join_began : out.taken;
    if (out.first_installed > 0) result["after_probe_s"] = out.first_installed - began - probe;
    // Its probe (the early one, from the replica's tensor list) comes before the knock at the replica.
    if (knock_mark.version > 0) result["join_placed"] = {{"update", knock_mark.version}, {"into_update_s", knock_into}};
    result["failures"] = failed;
    const std::uint64_t first = out.installed.empty() ? 0 : out.installed.front();
    const std::uint64_t last = out.installed.empty() ? 0 : out.installed.back();
    std::printf("%s engine job %s: %s, versions %llu..%llu (%zu installs), taken %.3f s after its knock, probe %.3f s, "
                "first install %.3f s after %s (T_min of its link %.3f ms)\n",
                job.program.c_str(), job.name.c_str(), verified ? "verified bit for bit" : "NOT VERIFIED", static_cast<unsigned long long>(first),
                static_cast<unsigned long long>(last), out.installed.size(), out.taken - out.join_began, probe,
                out.first_installed > 0 ? out.first_installed - began : 0.0,
                out.from_replica ? "its knock, from the fleet's replica" : "the take", 1e3 * out.summary.t_min_seconds);
    write_run_results(options, result, reports);
  }
  const Verdict verdict = exchange_verdict(exit_code, everyone, first_failed, timeout);
  ending.finalize = verdict.finalize;
  const int code = verdict.exit_code != 0 ? verdict.exit_code : (out.failure.empty() ? 0 : 1);
  if (code != 0)
    print_exit_line(ending, code, mine["failed_at"].get<double>(),
                    out.failure.empty() ? verdict_text(verdict, timeout, "verified " + std::to_string(out.verified) + " versions")
                                        : out.failure);
  return code;
}

}  // namespace wb::emu
