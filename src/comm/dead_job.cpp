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

bool open_mpi_4() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(version, &length) != MPI_SUCCESS) return false;
  return std::string(version, static_cast<std::size_t>(length)).starts_with("Open MPI v4.");
}

bool launched_by_open_mpi_4() {
  // mpirun's jobs only (not srun's, not a singleton)
  return std::getenv("OMPI_MCA_orte_hnp_uri") != nullptr && open_mpi_4();
}

// An integer control variable of the MPI library as this process runs with it (MPI_T), or none where the
// library has no such variable (another MPI; in Open MPI, a component that is not selected).
std::optional<int> int_control_variable(const char* name) {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return std::nullopt;
  std::optional<int> result;
  int index = -1;
  if (MPI_T_cvar_get_index(name, &index) == MPI_SUCCESS) {
    char found[128] = {}, description[8] = {};
    int found_length = sizeof found, description_length = sizeof description;
    int verbosity = 0, binding = 0, scope = 0, count = 0, value = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumeration = MPI_T_ENUM_NULL;
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    if (MPI_T_cvar_get_info(index, found, &found_length, &verbosity, &type, &enumeration, description,
                            &description_length, &binding, &scope) == MPI_SUCCESS &&
        type == MPI_INT && binding == MPI_T_BIND_NO_OBJECT &&
        MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      if (count == 1 && MPI_T_cvar_read(handle, &value) == MPI_SUCCESS) result = value;
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return result;
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

void check_tcp_progress_thread(const char* who) {
  static std::once_flag once;
  std::call_once(once, [who] {
    if (!open_mpi_4()) return;
    const std::optional<int> progress_thread = int_control_variable("btl_tcp_progress_thread");
    if (!progress_thread || *progress_thread != 0) return;  // TCP not selected, or its thread on
    WB_LOG(kWarn) << who << ": Open MPI's TCP transport runs here without its progress thread "
                     "(btl_tcp_progress_thread 0, Open MPI's default), with which a failed write to a process of a "
                     "job that was killed (\"writev failed: Broken pipe\") can leave this process spinning for good "
                     "inside its next MPI call (an engine is then left out; a trainer would hold the training). Start "
                     "every job that joins or takes joins with `mpirun --mca btl_tcp_progress_thread 1` (README, "
                     "\"Engines as jobs of their own\")";
  });
}

}  // namespace wb::comm
