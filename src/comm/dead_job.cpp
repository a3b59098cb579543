#include "comm/dead_job.hpp"

#include <mpi.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "core/log.hpp"

namespace wb::comm {
namespace {

// Open MPI 4.1's floor on a direct modex request's budget (orte/orted/pmix: ORTED_PMIX_MIN_DMX_TIMEOUT, the
// budget for fewer than 5000 daemons).
constexpr int kRequestBudget = 10;
constexpr int kDefaultMaxWait = 2;
// Where the setting gives up soonest: a single eviction after 5 s.
constexpr int kAdvisedMaxWait = 5;

bool launched_by_open_mpi_4() {
  if (std::getenv("OMPI_MCA_orte_hnp_uri") == nullptr) return false;  // mpirun's jobs only (not srun's, not a singleton)
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(version, &length) != MPI_SUCCESS) return false;
  return std::string(version, static_cast<std::size_t>(length)).starts_with("Open MPI v4.");
}

}  // namespace

std::optional<double> dead_job_give_up_seconds(int max_wait) {
  if (max_wait <= 0) return std::nullopt;  // no eviction at all
  int budget = kRequestBudget;
  for (int evictions = 1;; ++evictions) {
    budget -= max_wait;
    if (budget <= 0) return std::nullopt;  // checked back in with nothing left: it stays forever
    budget -= max_wait;
    if (budget <= 0) return static_cast<double>(evictions * max_wait);
  }
}

void check_dead_job_bound(const char* who) {
  static std::once_flag once;
  std::call_once(once, [who] {
    if (!launched_by_open_mpi_4()) return;
    const char* text = std::getenv("OMPI_MCA_pmix_server_max_wait");
    int max_wait = kDefaultMaxWait;
    if (text != nullptr) {
      char* end = nullptr;
      const long value = std::strtol(text, &end, 10);
      max_wait = end != text && *end == '\0' ? static_cast<int>(value) : 0;
    }
    if (dead_job_give_up_seconds(max_wait)) return;
    WB_LOG(kWarn) << who << ": this job's mpirun runs with pmix_server_max_wait " << (text ? text : "2 (Open MPI's default)")
                  << ", with which Open MPI 4.1 never gives up fetching the addresses of a job that dies while it pairs with "
                     "this one: such a connect or accept stays inside MPI, and no later join of this process completes. "
                     "Start every job that joins or takes joins with `mpirun --mca pmix_server_max_wait "
                  << kAdvisedMaxWait << "` (it gives up after " << *dead_job_give_up_seconds(kAdvisedMaxWait)
                  << " s; README, \"Engines as jobs of their own\")";
  });
}

}  // namespace wb::comm
