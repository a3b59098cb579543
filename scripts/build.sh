#!/usr/bin/env bash
# Configures and builds WeightBridge into ${WB_BUILD_DIR:-build}. Used by demo.sh and test.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
jobs=${WB_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${WB_BUILD_TYPE:-RelWithDebInfo} -DWB_WERROR=ON ${WB_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs" "$@"
