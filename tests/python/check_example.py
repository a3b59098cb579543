"""Runs examples/python (trainer.py and rollout.py in one mpirun, as the README says) and checks that the
engine reports, for every version the trainer sent, the same checksum and then a clean shutdown.

    python3 check_example.py MPIEXEC EXAMPLES_DIR PYTHON [extra example arguments]
"""

import re
import subprocess
import sys

mpiexec, examples, python, *extra = sys.argv[1:]
steps = 3
command = [mpiexec, "-n", "2", python, f"{examples}/trainer.py", "--steps", str(steps), *extra, ":",
           "-n", "2", python, f"{examples}/rollout.py", *extra]
run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=150)
print(run.stdout)
sent = dict(re.findall(r"trainer: sent version (\d+), checksum (-?\d+\.\d{6})", run.stdout))
installed = dict(re.findall(r"engine 0: version (\d+) installed, checksum (-?\d+\.\d{6})", run.stdout))
problems = []
if run.returncode != 0:
    problems.append(f"mpirun exited with {run.returncode}")
if sorted(sent) != [str(v) for v in range(1, steps + 1)]:
    problems.append(f"the trainer sent versions {sorted(sent)}")
for version, checksum in sent.items():
    if installed.get(version) is None or abs(float(installed[version]) - float(checksum)) > 1e-5:
        problems.append(f"version {version}: trainer checksum {checksum}, engine {installed.get(version)}")
if f"engine 0: shut down at version {steps}" not in run.stdout:
    problems.append("the engine did not shut down after the last version")
print("\n".join(problems) or "example: PASSED")
sys.exit(1 if problems else 0)
