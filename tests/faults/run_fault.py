#!/usr/bin/env python3
"""One fault-injection run of wb-replay (--replay) or wb-bench (--bench), and the checks that "fail loudly, never
hang" asks of it (docs/architecture.md, property 7): a bounded exit, the failing rank named, no partial version.

6 ranks: trainers tp=2 (world ranks 0, 1), two rollout engines of two workers (2, 3 and 4, 5). At version 2
the victim (trainer 1, or engine 1 worker 0, the engine's leader) stops past the timeout and resumes, kills
itself, or throws (a trainer from its own training step, a rollout from before_update_hook). wb-bench runs
WeightBridge alone in that mode, one warm-up update and two measured ones (versions 1, 2, 3). Checked, from
the line every rank prints when it exits non-zero (wb-replay: exit: ..., wb-bench: exit: ...):
  - bounded: every rank's adapter fails within 2 timeouts (+ slack) of the fault and every rank exits within
    3 timeouts (+ slack); a stopped victim, from its resume; mpirun itself ends within the same bound;
  - named: every rank's message names the victim by world rank and role;
  - whole versions: every surviving rollout holds one whole version (the bytes compared by wb-replay against
    its own load_weights) or, only without receiver staging, says the failed update wrote part of the next;
    the workers of an engine that say their parameters are intact hold the same version; a resumed victim
    never installed the aborted version;
  - the launcher does not tear the job down (mpirun --enable-recovery, no abort on a non-zero exit): the
    ranks end by themselves. With --teardown, mpirun's defaults: it must still end, non-zero, in time.
A job still running at the hard limit fails the test with the stacks of its remaining processes (gdb), so
that a hang seen once is diagnosable from the log.
Exit status 0 when every check holds; the failures are printed.
"""
import argparse
import os
import re
import subprocess
import sys
import time

TRAINER_VICTIM, ROLLOUT_VICTIM = 1, 4
ROLES = {0: "trainer 0", 1: "trainer 1", 2: "engine 0 worker 0", 3: "engine 0 worker 1", 4: "engine 1 worker 0",
         5: "engine 1 worker 1"}
EXIT = re.compile(r"wb-(?:replay|bench): exit: ([^(]*) \(world rank (\d+)\) exits with (\d+) at t=([\d.]+) \(failed at t=([\d.]+)\): (.*)")
FAULT = re.compile(r"wb-(?:replay|bench): fault: [^(]* \(world rank (\d+)\): (\w+) at version (\d+), at t=([\d.]+)")
RESUMED = re.compile(r"wb-(?:replay|bench): fault: [^(]* \(world rank (\d+)\) resumed at t=([\d.]+)")
PARAMETERS = re.compile(r"; parameters: (version (\d+)|a mix of versions [\d and]+) \(reported (intact|not intact)\)$")


def descendants(root):
    """The processes below `root` (the launcher's ranks and helpers), from /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    # the command name may hold spaces and parentheses: the fields follow the last ')'
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += children
        frontier = children
    return sorted(found)


def dump_stacks(pid):
    """Every thread's backtrace of a running process (gdb attaches and detaches), headed by its world rank."""
    rank = "?"
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                    rank = item.split(b"=", 1)[1].decode()
        with open("/proc/%d/comm" % pid) as f:
            name = f.read().strip()
    except OSError:
        return "run_fault: process %d ended before its stacks were taken" % pid
    head = "run_fault: stacks of process %d (%s, world rank %s):" % (pid, name, rank)
    try:
        # Within the test's own ctest timeout, several processes over; no symbol downloads.
        gdb = subprocess.run(["gdb", "-batch", "-nx", "-ex", "thread apply all bt", "-p", str(pid)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=15,
                             env=dict(os.environ, DEBUGINFOD_URLS=""))
        text = gdb.stdout
    except FileNotFoundError:
        text = "(gdb is not installed)"
    except subprocess.TimeoutExpired:
        text = "(gdb did not finish within 15 s)"
    # gdb's chatter about symbols and threads is left out; the frames are what tell the story.
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith(
        ("[New LWP", "[Thread debugging", "Using host libthread_db", "Reading symbols", "warning:", "Downloading"))]
    return head + "\n" + "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    program = ap.add_mutually_exclusive_group(required=True)
    program.add_argument("--replay", help="wb-replay to run")
    program.add_argument("--bench", help="wb-bench to run (--methods weightbridge, the one mode)")
    ap.add_argument("--mode", required=True, choices=["sync", "sender-staged", "receiver-staged", "async"])
    ap.add_argument("--victim", required=True, choices=["trainer", "rollout"])
    ap.add_argument("--kind", required=True, choices=["stop", "kill", "throw"])
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--slack", type=float, default=6.0, help="seconds allowed on top of each bound (a loaded CI machine)")
    ap.add_argument("--teardown", action="store_true", help="let mpirun tear the job down (its default)")
    args = ap.parse_args()

    timeout = args.timeout
    victim = TRAINER_VICTIM if args.victim == "trainer" else ROLLOUT_VICTIM
    fault = "%s,rank=%d,version=2" % (args.kind, victim)
    if args.kind == "stop":
        fault += ",seconds=%g" % (2 * timeout + 1)  # past the timeout, and past the others giving up
    launcher = [args.mpiexec, "-np", "6"]
    if not args.teardown:
        launcher += ["--enable-recovery", "--mca", "orte_abort_on_non_zero_status", "0"]
    layout = ["--model", "qwen3-30b-a3b", "--scale", "tiny", "--trainer", "tp=2", "--rollout", "engines=2,tp=2",
              "--gpus-per-node", "2"]
    if args.replay:
        command = launcher + [args.replay] + layout + ["--mode", args.mode, "--steps", "3", "--step-ms", "1", "--fault", fault]
    else:
        command = launcher + [args.bench] + layout + ["--modes", args.mode, "--methods", "weightbridge", "--warmup", "1",
                                                      "--reps", "2", "--fault", fault]
    env = dict(os.environ, WB_TIMEOUT_SECONDS=str(timeout))
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    print("run_fault: " + " ".join(command), flush=True)
    started = time.time()
    # A hard limit far above the bound: a hang fails the test instead of holding CI, with the stacks of the
    # ranks still running, so that a hang seen once in CI can be diagnosed from the log alone.
    limit = 60 + 10 * timeout
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = job.communicate(timeout=limit)
        returncode = job.returncode
    except subprocess.TimeoutExpired:
        ranks = descendants(job.pid)
        stacks = [dump_stacks(pid) for pid in ranks]
        job.kill()
        for pid in ranks:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        output, _ = job.communicate()
        print(output)
        for text in stacks:
            print(text)
        print("run_fault: FAILED: the job did not end within %g s (%d processes still running, stacks above)" %
              (limit, len(ranks)))
        return 1
    ended = time.time()
    problems = []
    faults = [m for m in map(FAULT.search, output.splitlines()) if m]
    resumed = [m for m in map(RESUMED.search, output.splitlines()) if m]
    exits = {int(m.group(2)): m for m in map(EXIT.search, output.splitlines()) if m}
    for line in output.splitlines():
        if re.match(r"wb-(replay|bench): (fault|exit)", line):
            print(line[:600])
    if not faults:
        print(output[-4000:])
        print("run_fault: FAILED: the fault was never injected")
        return 1
    fault_at = float(faults[0].group(4))
    resume_at = float(resumed[0].group(2)) if resumed else None
    if args.kind == "stop" and resume_at is None and not args.teardown:
        problems.append("the stopped victim never resumed")

    if args.teardown:
        # The launcher ends everything: it must do so in time, and say the job failed.
        if returncode == 0:
            problems.append("mpirun exited 0 after a fault")
        if ended - fault_at > 3 * timeout + args.slack:
            problems.append("mpirun ended %.1f s after the fault (bound %g s)" % (ended - fault_at, 3 * timeout + args.slack))
    else:
        expected = set(range(6)) - ({victim} if args.kind == "kill" else set())
        missing = expected - set(exits)
        if missing:
            problems.append("no exit line from world ranks %s (they did not fail, or did not end)" % sorted(missing))
        victim_name = re.compile(r"%s \(world rank %d\)" % (re.escape(ROLES[victim]), victim))
        engines = {}
        latest = 0.0  # the last exit after its origin (the fault, or the victim's resume)
        for rank, m in sorted(exits.items()):
            code, exit_at, failed_at, message = int(m.group(3)), float(m.group(4)), float(m.group(5)), m.group(6)
            origin = resume_at if (rank == victim and resume_at is not None) else fault_at
            latest = max(latest, exit_at - origin)
            if code == 0:
                problems.append("world rank %d exited 0" % rank)
            if failed_at > 0 and failed_at - origin > 2 * timeout + args.slack:
                problems.append("world rank %d failed %.1f s after the %s (bound: 2 timeouts + %g s)" %
                                (rank, failed_at - origin, "resume" if origin == resume_at else "fault", args.slack))
            if exit_at - origin > 3 * timeout + args.slack:
                problems.append("world rank %d exited %.1f s after the %s (bound: 3 timeouts + %g s)" %
                                (rank, exit_at - origin, "resume" if origin == resume_at else "fault", args.slack))
            if not victim_name.search(message):
                problems.append("world rank %d does not name %s (world rank %d): %s" % (rank, ROLES[victim], victim, message))
            if rank >= 2:
                p = PARAMETERS.search(message)
                if not p:
                    problems.append("world rank %d does not say what its parameters hold: %s" % (rank, message[-200:]))
                    continue
                whole, intact = p.group(2) is not None, p.group(3) == "intact"
                if not whole and (intact or args.mode in ("receiver-staged", "async")):
                    problems.append("world rank %d holds %s%s" % (rank, p.group(1), " while it says they are intact" if intact else ""))
                if rank == victim and not (whole and intact and int(p.group(2)) < 2):
                    problems.append("the resumed victim holds %s (reported %s): it must still hold version 1, whole" %
                                    (p.group(1), p.group(3)))
                if whole and intact:
                    engines.setdefault((rank - 2) // 2, set()).add(int(p.group(2)))
        for engine, versions in engines.items():
            if len(versions) > 1:
                problems.append("the workers of engine %d hold versions %s: one engine, two versions" % (engine, sorted(versions)))
        if ended - (resume_at or fault_at) > 3 * timeout + args.slack + 5:
            problems.append("mpirun ended %.1f s after the fault" % (ended - fault_at))
        print("run_fault: the last rank exited %.1f s after the fault (%.2f timeouts; bound 3 timeouts + %g s); mpirun "
              "ended %.1f s after the %s" % (latest, latest / timeout, args.slack, ended - (resume_at or fault_at),
                                            "resume" if resume_at else "fault"))
    for problem in problems:
        print("run_fault: " + problem)
    print("run_fault: %s%s %s %s%s: %s in %.1f s" % ("wb-bench " if args.bench else "", args.mode, args.victim, args.kind, " (launcher tears down)" if args.teardown else "",
                                                 "FAILED" if problems else "OK", ended - started))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
