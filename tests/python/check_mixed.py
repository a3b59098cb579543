"""Runs a job that mixes Python and C++ adapters in one mpirun (two programs: mixed_worker.py and
wb-mixed-worker) and checks that every rollout verified every version bit for bit and every trainer has each
version's EWTT and AGST in its stats().history.

    python3 check_mixed.py MPIEXEC PYTHON MIXED_WORKER python-trainers|cxx-trainers [--staging | --bad-input 1]

With --bad-input 1 (Python trainers), trainer 1 passes load_weights=None and every rank, the C++ ones too,
must refuse to construct with that rank's message: the Python checks travel in the C++ constructors' first
exchange over the world.
"""

import os
import re
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
mpiexec, python, cxx, which, *extra = sys.argv[1:]
versions = 3
py = [python, os.path.join(HERE, "mixed_worker.py"), "--versions", str(versions), *extra]
cc = [cxx, "--versions", str(versions), *extra]
trainers, rollouts = (py, cc) if which == "python-trainers" else (cc, py)
command = [mpiexec, "-n", "2", *trainers, "--role", "trainer", ":", "-n", "2", *rollouts, "--role", "rollout"]
print(" ".join(command), flush=True)
# Its own session, so that a job that hangs is killed whole (mpirun and every rank), not mpirun alone.
job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
try:
    output, _ = job.communicate(timeout=150)
except subprocess.TimeoutExpired:
    os.killpg(job.pid, signal.SIGKILL)
    output, _ = job.communicate()
    output += "\nmixed job: killed after 150 s\n"
print(output)
if "skipped:" in output and job.returncode != 0:
    sys.exit(77)
trainer_lang, rollout_lang = ("Python", "C++") if which == "python-trainers" else ("C++", "Python")
problems = []
if job.returncode != 0:
    problems.append(f"mpirun exited with {job.returncode}")
if "--bad-input" in extra:
    # Python trainer 1's load_weights is None: all four ranks, C++ ones too, refuse with its message. Lines are
    # also cut where a "mixed: " starts, in case two ranks' lines arrive joined.
    cause = "trainer (world rank 1): load_weights is a NoneType, not callable"
    for rank, role, lang in ((0, "trainer", trainer_lang), (1, "trainer", trainer_lang), (2, "rollout", rollout_lang),
                             (3, "rollout", rollout_lang)):
        if not any(line.startswith(f"mixed: {role} {rank} ({lang}): refused: ") and cause in line
                   for line in re.split(r"\n|(?=mixed: )", output)):
            problems.append(f"{role} {rank} ({lang}) was not refused with {cause!r}")
    print("\n".join(problems) or "mixed job, bad input: PASSED")
    sys.exit(1 if problems else 0)
for rank in (0, 1):
    line = f"mixed: trainer {rank} ({trainer_lang}): sent {versions} versions, EWTT and AGST for {versions}"
    if line not in output:
        problems.append(f"no line {line!r}")
for rank in (2, 3):
    line = f"mixed: rollout {rank} ({rollout_lang}): verified {versions} of {versions} versions"
    if line not in output:
        problems.append(f"no line {line!r}")
print("\n".join(problems) or "mixed job: PASSED")
sys.exit(1 if problems else 0)
