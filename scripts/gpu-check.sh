#!/usr/bin/env bash
# The GPU check: one command for a machine with an NVIDIA GPU, in one short run (under 8 minutes on one
# H200, build included). It configures and builds only what the check needs, with CUDA and warnings as
# errors, in parallel on every core; runs `ctest -L gpu` (the kernels against the host interpreter, the FP8
# quantize kernels' codes and scales against the host's reference bit for bit in the three scale rules, the
# executor with CUDA parameters over cuda_ipc and over cma, cuda_ipc's conformance suite and write rate,
# and wb-replay --device cuda in all four modes on a MoE layout, 8 ranks sharing the GPU, bit for bit);
# runs the pack/assemble kernel benchmark; and prints one table: tests passed, pack and assemble rates next
# to a device-to-device copy at 4 KiB, 64 KiB and 1 MiB segments and transposed bf16/fp8, the cuda_ipc
# write rate, and the replays' EWTT per mode. Needs CMake, nvcc, Open MPI, HDF5, GoogleTest, Google
# Benchmark, nlohmann-json, Boost.Program_options and python3 already installed (no package manager).
#
#   bash scripts/gpu-check.sh          # results under $OUT (or build-gpu/gpu-check): gpu-check.json, logs
#
# Exit status: 0 when every step passed, 1 otherwise (the table still prints what ran).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_GPU_BUILD_DIR:-$root/build-gpu}
out=${OUT:-$build/gpu-check}
jobs=${WB_JOBS:-$(nproc)}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
began=$(date +%s)
failed=()
step() { echo "gpu-check: $(($(date +%s) - began)) s: $*"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$out/device.txt" || true

step "configure (CUDA on, warnings as errors, RelWithDebInfo as CI builds)"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWB_CUDA=ON -DWB_WERROR=ON -DWB_PYTHON=OFF \
    -DWB_BUILD_TESTS=ON -DWB_BUILD_BENCHMARKS=ON -DWB_BUILD_APPS=ON ${WB_CMAKE_ARGS:-} >"$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log"
  echo "gpu-check: configure failed (see $out/configure.log)"
  exit 1
fi

step "build (-j $jobs): the GPU tests, the transport tests, wb-replay, bench_pack_kernels"
if ! cmake --build "$build" -j "$jobs" --target wb_gpu_tests wb_gpu_mpi_tests wb_transport_tests wb-replay \
    bench_pack_kernels >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -40
  echo "gpu-check: build failed (see $out/build.log)"
  exit 1
fi

step "ctest -L gpu"
(cd "$build" && ctest -L gpu --output-on-failure --timeout 300 -j "${WB_GPU_TEST_JOBS:-4}" \
  --output-junit "$out/ctest-gpu.xml") >"$out/ctest-gpu.log" 2>&1 || failed+=("ctest -L gpu")
grep -E "tests passed|\*\*\*Failed|Not Run|Timeout|\(Skipped\)" "$out/ctest-gpu.log" | tail -40
cp "$build"/tests/gpu/replay_cuda_*.json "$out/" 2>/dev/null || true

step "bench_pack_kernels"
"$build/bench/bench_pack_kernels" --benchmark_out="$out/bench_pack_kernels.json" --benchmark_out_format=json \
  >"$out/bench_pack_kernels.log" 2>&1 || failed+=("bench_pack_kernels")

step "summary"
python3 - "$out" "$(($(date +%s) - began))" "${failed[*]:-}" <<'PY' || failed+=("summary")
import json, os, re, sys, xml.etree.ElementTree as ET
out, seconds, failed = sys.argv[1], int(sys.argv[2]), sys.argv[3]
summary = {"seconds": seconds, "failed_steps": failed.split() if failed else []}
# Tests: from ctest's JUnit file.
tests = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
try:
    for case in ET.parse(os.path.join(out, "ctest-gpu.xml")).getroot().iter("testcase"):
        status = case.get("status", "")
        if status == "run" or (status == "" and case.find("failure") is None and case.find("skipped") is None):
            tests["passed"] += 1
        elif status in ("notrun", "disabled") or case.find("skipped") is not None:
            tests["skipped"] += 1
        else:
            tests["failed"] += 1
            tests["failures"].append(case.get("name"))
except (OSError, ET.ParseError) as e:
    tests["error"] = str(e)
summary["tests"] = tests
# Kernels: GB/s of the kernel and of cudaMemcpy device to device, per case.
kernels = {}
try:
    for b in json.load(open(os.path.join(out, "bench_pack_kernels.json")))["benchmarks"]:
        if "GB/s" in b:
            kernels[b["name"]] = {"GB/s": b["GB/s"], "memcpy_GB/s": b.get("memcpy_GB/s"), "ratio": b.get("ratio")}
        elif b.get("error_occurred"):
            kernels[b["name"]] = {"error": b.get("error_message", "")}
except (OSError, ValueError, KeyError) as e:
    kernels["error"] = str(e)
summary["kernels"] = kernels
# cuda_ipc: the line the rate test prints.
ipc = None
try:
    m = re.search(r"\[cuda_ipc throughput\].*?: ([0-9.]+) GB/s.*?cudaMemcpy, same bytes: ([0-9.]+) GB/s",
                  open(os.path.join(out, "ctest-gpu.log")).read())
    if m: ipc = {"GB/s": float(m.group(1)), "device_copy_GB/s": float(m.group(2))}
except OSError:
    pass
summary["cuda_ipc"] = ipc
# Replays: verified, mean EWTT, per mode.
replays = {}
for mode in ("sync", "sender-staged", "receiver-staged", "async", "fp8_sync", "fp8_async"):
    try:
        r = json.load(open(os.path.join(out, "replay_cuda_%s.json" % mode)))
        steps = [s for s in r.get("steps", []) if s.get("completed")]
        ewtt = sum(s["ewtt_s"] for s in steps) / len(steps) if steps else None
        replays[mode] = {"verified": r.get("verified"), "mean_ewtt_s": ewtt, "versions": len(steps),
                         "model_bytes": r.get("model_bytes"), "ranks": r.get("ranks")}
    except (OSError, ValueError) as e:
        replays[mode] = {"error": str(e)}
summary["replay_cuda"] = replays
json.dump(summary, open(os.path.join(out, "gpu-check.json"), "w"), indent=2)

print("\n=== gpu-check (%d s) ===" % seconds)
print("tests (ctest -L gpu): %d passed, %d failed, %d skipped%s" % (tests["passed"], tests["failed"], tests["skipped"],
      (": " + ", ".join(tests["failures"])) if tests["failures"] else ""))
print("\n%-48s %10s %14s %7s" % ("kernel case (256 MiB payload)", "GB/s", "memcpy GB/s", "ratio"))
for name, k in kernels.items():
    if "error" in k:
        print("%-48s %s" % (name, k["error"]))
    else:
        print("%-48s %10.1f %14.1f %7.2f" % (name, k["GB/s"], k["memcpy_GB/s"] or 0, k["ratio"] or 0))
print("\ncuda_ipc write rate: " + ("%.1f GB/s (device copy %.1f GB/s)" % (ipc["GB/s"], ipc["device_copy_GB/s"]) if ipc else "not measured"))
print("\n%-16s %9s %10s %12s" % ("replay --device cuda", "verified", "versions", "mean EWTT ms"))
for mode, r in replays.items():
    if "error" in r:
        print("%-16s %s" % (mode, r["error"]))
    else:
        print("%-16s %9s %10d %12s" % (mode, r["verified"], r["versions"], "%.2f" % (1e3 * r["mean_ewtt_s"]) if r["mean_ewtt_s"] is not None else "-"))
print("\nJSON: %s" % os.path.join(out, "gpu-check.json"))
PY

step "done"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "gpu-check: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu-check: passed"
