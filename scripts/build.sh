#!/usr/bin/env bash
# Configures and builds WeightBridge into ${WB_BUILD_DIR:-build}. Used by demo.sh and test.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
jobs=${WB_JOBS:-$(nproc)}
# WB_DEBUG_LEVEL: the C/C++ debug level of a RelWithDebInfo build, 2 (-g, full; the default) or 1 (-g1: line
# tables only, enough for file:line in backtraces). scripts/test.sh builds with 1: without ccache every file
# is compiled, and -g1 takes about 30% less CPU time per file (src/layout/probe.cpp 7.8 -> 5.6 CPU-s,
# tests/unit/test_pack.cpp 14.3 -> 9.3, measured alternately).
case "${WB_DEBUG_LEVEL:-2}" in
  2) debug=-g ;;
  1) debug=-g1 ;;
  *) echo "build.sh: WB_DEBUG_LEVEL=${WB_DEBUG_LEVEL}: 1 or 2" >&2; exit 2 ;;
esac
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${WB_BUILD_TYPE:-RelWithDebInfo} -DWB_WERROR=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $debug -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 $debug -DNDEBUG" \
  ${WB_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs" "$@"
