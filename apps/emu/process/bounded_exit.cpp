#include "emu/process/bounded_exit.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "comm/backoff.hpp"
#include "core/checks.hpp"

namespace wb::emu {
namespace {

constexpr int kReportTag = 0x7e01, kVerdictTag = 0x7e02;
// A verdict: exit code and finalize flag (two int32), then rank 0's account of the first failure, cut to
// fit and NUL-terminated: one eager message.
constexpr std::size_t kVerdictBytes = 2048;

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

}  // namespace

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double job_timeout() { return comm::normalize_timeout(comm::timeout_setting()); }

bool wait_within(const comm::OperationPtr& op, double seconds, const std::function<bool()>& idle) {
  comm::Waiter waiter{seconds, {}};
  if (idle) waiter.service = [&idle](bool) { return idle() ? Status::ok() : Status(ErrorCode::kInternal, "left the wait"); };
  return comm::wait_for(op, waiter, true, "").is_ok();
}

std::vector<nlohmann::json> gather_reports(const nlohmann::json& mine, double seconds) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  if (rank != 0) {
    comm::OperationPtr op = comm::make_operation();
    const std::string text = mine.dump();
    op->out.assign(reinterpret_cast<const std::byte*>(text.data()), reinterpret_cast<const std::byte*>(text.data()) + text.size());
    WB_CHECK_MPI(MPI_Isend(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, 0, kReportTag, MPI_COMM_WORLD, &op->request));
    comm::abandon(std::move(op));  // not waited for: kept until MPI completes it
    return {};
  }
  std::vector<nlohmann::json> reports(static_cast<std::size_t>(world));
  reports[0] = mine;
  int missing = world - 1;
  const double start = wall_seconds();
  comm::Backoff backoff;
  while (missing > 0 && wall_seconds() - start <= seconds) {
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status probe;
    WB_CHECK_MPI(MPI_Improbe(MPI_ANY_SOURCE, kReportTag, MPI_COMM_WORLD, &found, &message, &probe));
    if (!found) {
      backoff.pause();
      continue;
    }
    backoff.progressed();
    int count = 0;
    WB_CHECK_MPI(MPI_Get_count(&probe, MPI_BYTE, &count));
    std::string text(static_cast<std::size_t>(count), '\0');
    WB_CHECK_MPI(MPI_Mrecv(text.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
    reports[static_cast<std::size_t>(probe.MPI_SOURCE)] = nlohmann::json::parse(text);
    --missing;
  }
  return reports;
}

std::string first_failure(const std::vector<nlohmann::json>& reports, double seconds) {
  std::string first, silent;
  double first_at = std::numeric_limits<double>::infinity();
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const nlohmann::json& report = reports[r];
    if (report.is_null()) {
      if (silent.empty())
        silent = "world rank " + std::to_string(r) + " did not report within " + seconds_text(seconds) + " s (stopped or dead)";
      continue;
    }
    const std::string failure = report.value("failure", std::string());
    const double at = report.value("failed_at", 0.0);
    if (!failure.empty() && (first.empty() || at < first_at)) {
      first = "world rank " + std::to_string(r) + ": " + failure;
      first_at = at;
    }
  }
  return first.empty() ? silent : first;
}

// Whether a rank got the verdict cannot itself be agreed on in bounded time: a failure anywhere makes every
// rank skip MPI_Finalize whatever it heard, and the rare rank that misses the verdict of a run that
// succeeded is what the deadline on MPI_Finalize (finish_process) is for.
Verdict exchange_verdict(int exit_code, bool everyone, const std::string& failure, double seconds) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  if (rank == 0) {
    Verdict verdict;
    verdict.exit_code = exit_code;
    verdict.finalize = everyone && exit_code == 0;
    verdict.failure = exit_code != 0 ? failure : std::string();
    const std::int32_t head[2] = {exit_code, verdict.finalize ? 1 : 0};
    const std::size_t text = std::min(verdict.failure.size(), kVerdictBytes - sizeof head - 1);
    std::vector<comm::OperationPtr> sends;
    for (int r = 1; r < world; ++r) {
      comm::OperationPtr op = comm::make_operation();
      op->out.assign(sizeof head + text + 1, std::byte{0});
      std::memcpy(op->out.data(), head, sizeof head);
      std::memcpy(op->out.data() + sizeof head, verdict.failure.data(), text);
      WB_CHECK_MPI(MPI_Isend(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, r, kVerdictTag, MPI_COMM_WORLD,
                             &op->request));
      sends.push_back(std::move(op));
    }
    // After a failure the sends are not waited for long: a stopped rank takes its verdict when it resumes.
    for (const auto& op : sends) (void)wait_within(op, verdict.finalize ? seconds : 0.1);
    return verdict;
  }
  comm::OperationPtr op = comm::make_operation(0, kVerdictBytes);
  WB_CHECK_MPI(MPI_Irecv(op->in.data(), static_cast<int>(kVerdictBytes), MPI_BYTE, 0, kVerdictTag, MPI_COMM_WORLD, &op->request));
  Verdict verdict;
  if (!wait_within(op, seconds)) {
    verdict.exit_code = exit_code != 0 ? exit_code : 1;
    verdict.heard = false;
    return verdict;
  }
  std::int32_t head[2];
  std::memcpy(head, op->in.data(), sizeof head);
  op->in.back() = std::byte{0};
  verdict.failure = reinterpret_cast<const char*>(op->in.data() + sizeof head);
  verdict.exit_code = exit_code != 0 ? exit_code : head[0];
  verdict.finalize = exit_code == 0 && head[0] == 0 && head[1] != 0;
  return verdict;
}

std::string verdict_text(const Verdict& verdict, double seconds, const std::string& own_outcome) {
  const std::string own = own_outcome.empty() ? "" : " (" + own_outcome + ")";
  if (!verdict.heard)
    return "did not hear rank 0's verdict within " + seconds_text(seconds) +
           " s (rank 0 stopped, died or is late); this rank's own part succeeded" + own;
  return "this rank's own part succeeded" + own + ", but the run failed: " +
         (verdict.failure.empty() ? std::string("rank 0's verdict, its output says why") : verdict.failure);
}

void print_exit_line(const Ending& ending, int code, double failed_at, const std::string& why) {
  std::fprintf(stderr, "%s: exit: %s exits with %d at t=%.3f (failed at t=%.3f): %s\n", ending.program.c_str(),
               ending.who.c_str(), code, wall_seconds(), failed_at, why.c_str());
  std::fflush(stderr);
}

int finish_process(const Ending& ending, int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (!ending.finalize) std::_Exit(exit_code != 0 ? exit_code : 1);
  if (std::isfinite(ending.timeout)) {
    // A rank of a run that succeeded missed the verdict (later than the timeout) and left without
    // MPI_Finalize: this one would wait for it for good. Like every other wait, this one has a deadline.
    std::thread([ending] {
      std::this_thread::sleep_for(std::chrono::duration<double>(ending.timeout));
      const double now = wall_seconds();
      print_exit_line(ending, 1, now,
                      "MPI_Finalize did not return within " + seconds_text(ending.timeout) + " s (a rank left without it)");
      std::_Exit(1);
    }).detach();
  }
  MPI_Finalize();
  return exit_code;
}

}  // namespace wb::emu
