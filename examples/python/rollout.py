"""The rollout side of the example: inference engines of --tp ranks each, that install every version the
trainers send between two generation steps. Run it together with trainer.py in one MPI job:

    mpirun -n 2 python3 examples/python/trainer.py : -n 2 python3 examples/python/rollout.py
"""

import argparse
import time

import mpi4py

mpi4py.rc.thread_level = "multiple"
from mpi4py import MPI  # noqa: E402

import weightbridge  # noqa: E402
from tiny_model import RolloutModel, initial_checkpoint  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--tp", type=int, default=2, help="ranks per engine")
parser.add_argument("--staging", action="store_true", help="receive while generating, install at one step")
args = parser.parse_args()

world = MPI.COMM_WORLD
rollouts = world.Split(1, world.Get_rank())  # trainer.py splits with color 0
engine = rollouts.Get_rank() // args.tp
engine_comm = rollouts.Split(engine, rollouts.Get_rank())  # the ranks that serve one model replica
leader = engine_comm.Get_rank() == 0

model = RolloutModel(engine_comm.Get_rank(), args.tp)
model.load_weights(initial_checkpoint())


def before_update(version):
    # e.g. flush the prefix cache: its entries were computed with the old weights
    if leader:
        print(f"engine {engine}: installing version {version}", flush=True)


receiver = weightbridge.ReceiverAdapter(world, engine_comm, dict(model.named_parameters()), model.load_weights,
                                        receiver_staging=args.staging, before_update_hook=before_update)
while True:
    result = receiver.poll_requests()  # between two generation steps; returns at once when nothing is pending
    if result.event == weightbridge.Event.SHUTDOWN:
        break
    if result.event == weightbridge.Event.INSTALLED:
        checksum = engine_comm.allreduce(model.checksum_part())
        if leader:
            print(f"engine {engine}: version {result.version} installed, checksum {checksum:.6f}", flush=True)
    time.sleep(0.005)  # generate_step(): result.version is the version in the parameters
if leader:
    print(f"engine {engine}: shut down at version {receiver.installed_version}", flush=True)
