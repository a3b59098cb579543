// GoogleTest main for tests that run under mpiexec. Every rank runs every test; each rank's failures
// are collected on rank 0, which names the failing ranks and tests, so a failure on any rank fails the
// test (not only rank 0's exit code). Output from ranks other than 0 is kept to failures.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

class RankFailureCollector : public ::testing::EmptyTestEventListener {
 public:
  // The test's name is remembered at its start: gtest calls OnTestPartResult holding the lock that
  // current_test_info() takes, so asking for it there would deadlock the failing rank.
  void OnTestStart(const ::testing::TestInfo& test) override {
    current_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestEnd(const ::testing::TestInfo&) override { current_ = "(global)"; }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    failures_ += current_ + " at " + (result.file_name() ? result.file_name() : "?") + ":" +
                 std::to_string(result.line_number()) + ": " + result.summary() + "\n";
  }
  const std::string& failures() const { return failures_; }

 private:
  std::string failures_;
  std::string current_ = "(global)";
};

}  // namespace

int main(int argc, char** argv) {
  // The adapters' staged modes run transfers on a background thread beside MPI calls of the test.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Let failing MPI calls return, so the check macros can report them instead of MPI aborting.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  auto* collector = new RankFailureCollector;
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(collector);  // owned by gtest

  const int local_result = RUN_ALL_TESTS();

  // Gather every rank's failure text on rank 0.
  const std::string& text = collector->failures();
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<char> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += lengths[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total) + 1);
  }
  MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  int failed = local_result != 0 ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    int failing_ranks = 0;
    for (int r = 0; r < size; ++r) {
      if (lengths[static_cast<std::size_t>(r)] == 0) continue;
      ++failing_ranks;
      std::fprintf(stderr, "[mpi] rank %d of %d failed:\n%.*s", r, size, lengths[static_cast<std::size_t>(r)],
                   all.data() + displs[static_cast<std::size_t>(r)]);
    }
    std::printf("[mpi] %d of %d ranks failed\n", failing_ranks, size);
  }
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
