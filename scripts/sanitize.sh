#!/usr/bin/env bash
# Runs tests under a sanitizer, in a build of its own.
#
#   bash scripts/sanitize.sh address [CTEST ARGS...]   AddressSanitizer + UBSan (build-asan/); default: the
#                                                      whole suite but the labels that cannot take it (below)
#   bash scripts/sanitize.sh thread  [CTEST ARGS...]   ThreadSanitizer (build-tsan/); default: the coordinator
#                                                      and executor tests (the staged modes' transfer threads)
#
# CTEST ARGS replace the default selection, e.g. `bash scripts/sanitize.sh address -L coord`; scripts/test.sh
# runs the coordinator's tests this way after the suite.
# A finding fails the test it happens in: every sanitizer stops the process at its first report
# (halt_on_error), and leaks are reported when a process ends (in MPI ranks only with
# WB_SANITIZE_MPI_LEAKS=1, below). Reports inside Open MPI and its helpers (PMIx, hwloc, libevent) are
# suppressed by library name only (tests/sanitizers/*.supp): they are not ours, and each file says why.
# Not run under a sanitizer: python (the interpreter would need the runtime preloaded), slurm and multinode
# (their ranks start from daemons or in network namespaces that do not pass the sanitizer settings on),
# install (a consumer built without the sanitizer), gpu (no device here), bench (benchmarks are not built).
# WB_SANITIZE_BUILD_DIR, WB_JOBS (build; default: every core) and WB_TEST_JOBS (ctest; default 2) are read
# from the environment; WB_SANITIZE_BUILD_ONLY=1 builds and runs nothing (scripts/test.sh builds while the
# main suite runs, then calls this again to test: the second build finds nothing to do).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kind=${1:-}
shift || true
case "$kind" in
  address)
    sanitizers=address,undefined
    build_name=build-asan
    default_selection=(-LE 'python|slurm|multinode|install|gpu|bench')
    ;;
  thread)
    sanitizers=thread
    build_name=build-tsan
    # The coordinator (adapters in the four modes, wb-replay, faults) and the executor: where threads are.
    default_selection=(-R '^(adapter|verify|executor|replay\.|faults\.)')
    ;;
  *)
    echo "usage: bash scripts/sanitize.sh address|thread [CTEST ARGS...]" >&2
    exit 2
    ;;
esac
build=${WB_SANITIZE_BUILD_DIR:-$root/$build_name}
jobs=${WB_JOBS:-$(nproc)}
selection=("$@")
if [[ ${#selection[@]} -eq 0 ]]; then selection=("${default_selection[@]}"); fi

bash "$root/scripts/install-deps.sh"
# No CUDA (nvcc takes no -fsanitize, and there is no device to run it on), no Python module, no benchmarks.
# -O1 and line tables only: the sanitizers' usual optimization, and a third less build time than -O2 -g on
# two cores; reports still name file:line.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DWB_WERROR=ON -DWB_SANITIZE="$sanitizers" -DWB_CUDA=OFF -DWB_PYTHON=OFF -DWB_BUILD_BENCHMARKS=OFF >/dev/null
# WB_SANITIZE_TARGETS: build only these (what the selected tests run), e.g. CI's coordinator leg.
read -r -a targets <<<"${WB_SANITIZE_TARGETS:-all}"
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
if [[ "${WB_SANITIZE_BUILD_ONLY:-0}" == "1" ]]; then exit 0; fi

supp=$root/tests/sanitizers
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp
# allocator_may_return_null: the tests that feed huge sizes expect std::bad_alloc, as glibc's malloc gives.
asan=halt_on_error=1:allocator_may_return_null=1
export ASAN_OPTIONS=$asan:detect_leaks=1
export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
# Leaks in MPI ranks: Open MPI and glibc have no frame pointers, so the fast unwinder stops inside them and
# Open MPI's own allocations (kept for the process's life) cannot be told from ours by a suppression;
# whole stacks (fast_unwind_on_malloc=0) can, at two to three times the run time. So mpiexec's ranks check
# leaks only with WB_SANITIZE_MPI_LEAKS=1; single-process tests always do. (mca_base_env_list: what
# mpiexec sets in its ranks' environment.)
if [[ "${WB_SANITIZE_MPI_LEAKS:-0}" == "1" ]]; then
  export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS=$asan:detect_leaks=1:fast_unwind_on_malloc=0"
else
  export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS=$asan:detect_leaks=0"
fi
# second_deadlock_stack: both stacks of a lock-order report. The exit code is TSan's own, so a report that
# halts a rank is told apart from a test's failure in the log.
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp:print_suppressions=0
# Open MPI's memory hooks (the patcher) rewrite malloc and mmap behind the sanitizers' backs.
export OMPI_MCA_memory=^patcher

cd "$build"
echo "sanitize.sh: $kind ($sanitizers): ctest ${selection[*]}"
ctest --output-on-failure --timeout 900 -j "${WB_TEST_JOBS:-2}" "${selection[@]}"
