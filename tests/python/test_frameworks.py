"""Megatron-style trainers and inference-engine-style rollouts in one mpirun, through `import weightbridge`.

    mpirun -n 8 python3 test_frameworks.py [--config qwen3_moe_tiny.json] [--versions 3] [--modes ...]

Ranks 0-3 are a Megatron trainer (tp=2, dp=2, ep=2); ranks 4-7 are two rollout engines (tp=2, ep=2), each
rank a PyTorch model with its own load_weights (megatron_model.py, rollout_model.py). In each of the four
synchronization modes the trainers connect and send versions 1..K; every element of the checkpoint
changes from one version to the next. What is asserted:
  - after each install, every rollout parameter equals, bit for bit, what the rollout's own load_weights
    produces from that version's full checkpoint;
  - before_update_hook(v) runs once per version on every rollout rank, with the parameters still holding
    the previous version, and while a staged version arrives the parameters keep the installed one;
  - the trainer changes its parameters as soon as send_weights returns, without affecting the version in
    flight;
  - the plan needs every checkpoint byte (two engines each need the whole model), and each rollout took
    part in K updates;
  - every trainer's stats().history gives each version's EWTT and AGST (carried by the acknowledgements),
    equal to what every worker's gathered stall intervals give (wb-replay's definitions).
Rank 0 prints one JSON line per mode ("python-frameworks {...}") with the connect time and per-version
EWTT/AGST (the same definitions as wb-replay), for comparison with wb-replay on the same layout
(compare_with_replay.py; wb-replay --model qwen3_moe_tiny.json --scale full plans the very same transfer).
"""

import argparse
import json
import os
import sys
import time

from harness import Checks, import_or_skip

torch, MPI = import_or_skip()

import weightbridge as wb  # noqa: E402

import hf_checkpoint  # noqa: E402
from megatron_model import GPTModel  # noqa: E402
from rollout_model import Qwen3MoeForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = {  # name: (sender_staging, receiver_staging), as wb-replay --mode
    "sync": (False, False),
    "sender-staged": (True, False),
    "receiver-staged": (False, True),
    "async": (True, True),
}
TRAINER = dict(tp=2, dp=2, ep=2)
ENGINES, ENGINE_TP = 2, 2
STEP_SECONDS = 0.002  # emulated compute of a training step and of an inference step (wb-replay --step-ms 2)
TIMEOUT_SECONDS = 30


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=os.path.join(HERE, "qwen3_moe_tiny.json"))
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--hook-check", choices=["full", "none"], default="full",
                        help="none: the hook only records the version (for timing: no Python work inside a stall)")
    return parser.parse_args()


def seed_of(mode_index, version):
    """Mode m's version v is checkpoint seed 10*(m+1) + v (seed 0 is the start): modes never repeat one."""
    return 0 if version == 0 else 10 * (mode_index + 1) + version


class Checkpoints:
    """Checkpoint contents by seed, made before a mode starts so that the timed loop only loads them."""

    def __init__(self, tensors):
        self.tensors = tensors
        self.cache = {}

    def prepare(self, seeds):
        self.cache = {seed: self.cache.get(seed) or hf_checkpoint.make_checkpoint(self.tensors, seed) for seed in seeds}

    def __call__(self, seed):
        if seed not in self.cache:
            self.prepare([seed])
        return self.cache[seed].items()


def run_trainer(world, comm, model, checkpoints, tensors, mode, mode_index, versions, checks):
    sender_staging, _ = MODES[mode]
    params = dict(model.named_parameters())
    checkpoints.prepare([seed_of(mode_index, v) for v in range(1, versions + 1)])
    sender = wb.SenderAdapter(world, comm, params, [(n, d, s) for n, d, s in tensors], model.load_weights,
                              sender_staging=sender_staging, timeout_seconds=TIMEOUT_SECONDS)
    started = time.perf_counter()
    sender.connect()
    timing = {"connect_wall_s": time.perf_counter() - started, "send_call_s": []}
    summary = sender.summary()
    checkpoint_bytes = sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size() for _, d, s in tensors)
    checks.check(summary.model_bytes == checkpoint_bytes,
                 f"{mode}: the plan needs {summary.model_bytes} bytes, the checkpoint holds {checkpoint_bytes}")
    for version in range(1, versions + 1):
        model.load_weights(checkpoints(seed_of(mode_index, version)))  # what this training step produced
        time.sleep(STEP_SECONDS)
        started = time.perf_counter()
        sender.send_weights(version)
        timing["send_call_s"].append(time.perf_counter() - started)
        # The next step changes the parameters at once: the version in flight must not see it.
        with torch.no_grad():
            for param in params.values():
                param.fill_(-3.0)
    sender.shutdown()
    stats = sender.stats()
    checks.check(stats.version == versions, f"{mode}: the trainer's last version is {stats.version}")
    return sender, timing


def run_rollout(world, comm, model, reference, checkpoints, mode, mode_index, versions, installed_seed, checks,
                hook_check=True):
    _, receiver_staging = MODES[mode]
    live = dict(model.named_parameters())
    expected = {}  # seed -> what the rollout's own load_weights makes of that version's full checkpoint
    for seed in [installed_seed] + [seed_of(mode_index, v) for v in range(1, versions + 1)]:
        reference.load_weights(checkpoints(seed))
        expected[seed] = {n: p.detach().clone() for n, p in reference.named_parameters()}
    checkpoints.prepare([])

    def verify(seed, when):
        difference = hf_checkpoint.first_difference(live, expected[seed])
        return checks.check(difference is None, f"{mode} {when}: {difference}")

    hooked = []

    def installed():
        return installed_seed if receiver.installed_version == 0 else seed_of(mode_index, receiver.installed_version)

    def before_update_hook(version):
        hooked.append(version)
        if hook_check:
            verify(installed(), f"before_update_hook({version})")

    receiver = wb.ReceiverAdapter(world, comm, live, model.load_weights, receiver_staging=receiver_staging,
                                  timeout_seconds=TIMEOUT_SECONDS, before_update_hook=before_update_hook)
    receiving_checked = set()
    deadline = time.monotonic() + 4 * TIMEOUT_SECONDS
    while True:
        result = receiver.poll_requests()
        if result.event == wb.Event.SHUTDOWN:
            break
        if result.event == wb.Event.CONNECTED:
            verify(installed_seed, "after connect (the probe must restore the parameters)")
        if result.event == wb.Event.RECEIVING and result.version not in receiving_checked:
            receiving_checked.add(result.version)
            verify(installed(), f"while receiving after version {result.version}")
        if result.event == wb.Event.INSTALLED:
            verify(seed_of(mode_index, result.version), f"version {result.version} installed")
        if time.monotonic() > deadline:
            checks.fail(f"{mode}: no shutdown within {4 * TIMEOUT_SECONDS} s")
            break
        time.sleep(STEP_SECONDS)  # an inference step
    checks.check(hooked == list(range(1, versions + 1)), f"{mode}: before_update_hook ran for {hooked}")
    checks.check(receiver.installed_version == versions, f"{mode}: installed {receiver.installed_version}")
    stats = receiver.stats()
    checks.check(stats.updates == versions and stats.bytes_assembled > 0,
                 f"{mode}: {stats.updates} updates, {stats.bytes_assembled} bytes assembled")
    return receiver, installed()


def report(world, adapter, mode, timing, trainer, checks):
    """Rank 0 prints the mode's timing as one JSON line: EWTT and AGST per version as wb-replay defines them,
    from every worker's gathered stall intervals; every trainer's library figures must be the same."""
    stats = adapter.stats()
    stalls = world.gather([(s.version, s.begin_seconds, s.end_seconds) for s in stats.stalls], root=0)
    figures = world.gather({u.version: (u.ewtt_seconds, u.agst_seconds) for u in stats.history} if trainer else None,
                           root=0)
    if not trainer:
        checks.check(all(u.ewtt_seconds is None and u.agst_seconds is None for u in stats.history),
                     f"{mode}: a rollout's history has EWTT/AGST: {stats.history}")
    if world.Get_rank() != 0:
        return
    summary = adapter.summary()
    workers = len(stalls)
    versions = sorted({v for worker in stalls for v, _, _ in worker})
    ewtt, agst = [], []
    for version in versions:
        spans = [(b, e) for worker in stalls for v, b, e in worker if v == version]
        ewtt.append(max(e for _, e in spans) - min(b for b, _ in spans))
        agst.append(sum(e - b for b, e in spans) / workers)
        for rank, mine in enumerate(figures):
            if mine is None:
                continue
            library = mine.get(version)
            # The same intervals summed in another order: equal but for rounding.
            checks.check(library is not None and None not in library
                         and abs(library[0] - ewtt[-1]) <= 1e-9 and abs(library[1] - agst[-1]) <= 1e-9,
                         f"{mode} version {version}: trainer (world rank {rank}) stats() give (EWTT, AGST) "
                         f"{library}, the gathered stalls ({ewtt[-1]}, {agst[-1]})")
    checks.check(versions and all(f is None or sorted(f) == versions for f in figures),
                 f"{mode}: the trainers' histories hold versions {[None if f is None else sorted(f) for f in figures]}, "
                 f"the stalls {versions}")
    line = {"mode": mode, "connect_s": summary.connect_seconds, "connect_wall_s": timing["connect_wall_s"],
            "ewtt_s": ewtt, "agst_s": agst, "send_call_s": timing["send_call_s"],
            "trainer0_stall_s": [e - b for v, b, e in stalls[0]], "model_bytes": summary.model_bytes,
            "bytes_per_update": summary.bytes_per_update, "rounds": summary.rounds}
    print("python-frameworks " + json.dumps(line), flush=True)


def main():
    args = parse_args()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    trainers = TRAINER["tp"] * TRAINER["dp"]
    checks = Checks(world, watchdog_seconds=300)
    if world.Get_size() != trainers + ENGINES * ENGINE_TP:
        if rank == 0:
            print(f"needs {trainers + ENGINES * ENGINE_TP} ranks, got {world.Get_size()}", flush=True)
        sys.exit(2)
    trainer = rank < trainers
    engine = -1 if trainer else (rank - trainers) // ENGINE_TP
    comm = world.Split(0 if trainer else 1 + engine, rank)
    config = hf_checkpoint.load_config(args.config)
    tensors = hf_checkpoint.tensor_list(config)
    checkpoints = Checkpoints(tensors)
    if trainer:
        model = GPTModel(config, comm.Get_rank(), **TRAINER)
    else:
        model = Qwen3MoeForCausalLM(config, comm.Get_rank(), ENGINE_TP)
        reference = Qwen3MoeForCausalLM(config, comm.Get_rank(), ENGINE_TP)
    model.load_weights(checkpoints(0))
    installed_seed = 0
    for mode_index, mode in enumerate(args.modes):
        try:
            if trainer:
                adapter, timing = run_trainer(world, comm, model, checkpoints, tensors, mode, mode_index,
                                              args.versions, checks)
            else:
                timing = None
                adapter, installed_seed = run_rollout(world, comm, model, reference, checkpoints, mode, mode_index,
                                                      args.versions, installed_seed, checks,
                                                      hook_check=args.hook_check == "full")
            report(world, adapter, mode, timing, trainer, checks)
            del adapter
        except Exception:
            checks.exception(mode)
            break
    checks.finish()


if __name__ == "__main__":
    main()
