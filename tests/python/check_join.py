"""Runs join_worker.py as separate mpirun jobs through one ompi-server (issue 31): a Python trainer job with
no engine, a 2-worker Python engine job that joins after version 3, installs three versions and leaves,
then a 1-worker engine job that joins in its place and serves to the end. Checks each job's result and that
the last engine installed up to the trainers' last version.

    python3 check_join.py MPIEXEC PYTHON MODE
"""

import os
import re
import subprocess
import sys
import tempfile
import time

mpiexec, python, mode = sys.argv[1:4]
worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "join_worker.py")
problems = []
with tempfile.TemporaryDirectory() as folder:
    uri, address = os.path.join(folder, "uri"), os.path.join(folder, "address")
    server = subprocess.Popen(["ompi-server", "--no-daemonize", "--report-uri", uri])
    jobs = []

    def job(name, ranks, *arguments):
        log = open(os.path.join(folder, name + ".log"), "w")
        command = [mpiexec, "--oversubscribe", "--ompi-server", f"file:{uri}", "--mca", "pmix_server_max_wait", "5",
                   "--mca", "btl_tcp_progress_thread", "1", "-np", str(ranks), python, worker, *arguments]
        jobs.append((name, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
        return jobs[-1][1]

    def text(name):
        with open(os.path.join(folder, name + ".log")) as f:
            return f.read()

    def wait_for(name, pattern, seconds):
        for _ in range(int(seconds * 10)):
            if re.search(pattern, text(name)):
                return True
            time.sleep(0.1)
        return False

    try:
        for _ in range(100):
            if os.path.exists(uri) and os.path.getsize(uri) > 0:
                break
            time.sleep(0.1)
        trainers = job("trainers", 2, "trainers", address, mode)
        if not wait_for("trainers", r"version 3 sent", 120):
            problems.append("the trainers never sent version 3")
        else:
            first = job("first", 2, "engine", address, mode, "leave")
            first.wait(timeout=180)
            if first.returncode != 0:
                problems.append(f"the engine job that leaves ended with {first.returncode}")
            job("second", 1, "engine", address, mode, "serve").wait(timeout=180)
        trainers.wait(timeout=180)
        for name, process, _ in jobs:
            if process.returncode != 0:
                problems.append(f"the {name} job ended with {process.returncode}")
    except subprocess.TimeoutExpired as error:
        problems.append(f"timed out: {error}")
    finally:
        for _, process, log in jobs:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
        server.kill()
        server.wait()
    logs = {name: text(name) for name, _, _ in jobs}
    for name, log in logs.items():
        print(f"== {name}\n{log}")
    last = re.findall(r"trainers: sent up to (\d+)", logs.get("trainers", ""))
    lasts = set(re.findall(r"joined engine worker \d+: .* then up to (\d+),", logs.get("second", "")))
    if not last or lasts != {last[0]}:
        problems.append(f"the trainers sent up to {last}; the last engine installed up to {sorted(lasts)}")
    if len(re.findall(r"then it left", logs.get("first", ""))) != 2:
        problems.append("the first engine's two workers did not both leave")
    # The link the engines joined: the fleet link (fleet_link's default) unless WB_FLEET_LINK=0.
    fleet_link = os.environ.get("WB_FLEET_LINK", "1") != "0"
    joined = re.findall(r"trainers: (joined engine [^:]*):", logs.get("trainers", ""))
    if len(joined) != 2 or any(("on the fleet link" in name) != fleet_link for name in joined):
        problems.append(f"not two engines joined on {'the fleet link' if fleet_link else 'links of their own'}: {joined}")
print("\n".join(problems) or f"join ({mode}): PASSED")
sys.exit(1 if problems else 0)
