"""The Python API itself, under mpirun with one trainer (rank 0) and one rollout (rank 1):

    mpirun -n 2 python3 test_api.py

  - help() explains every call, and the type stubs list exactly what the extension module defines;
  - bad input (a strided tensor, a dtype with no equivalent, an unknown option, a loader that is not
    callable) raises the same weightbridge.Error on both ranks, naming the rank, the tensor and the cause;
  - parameters of any __dlpack__ producer transfer bit for bit: numpy float32 arrays and a torch bf16
    tensor on the trainer, torch tensors on the rollout, one of them stored transposed;
  - the GIL is released while send_weights waits: a Python thread keeps running meanwhile;
  - the (name, tensor) pairs given to load_weights cannot be read after that call returns;
  - weightbridge.Error pickles with its code and message; summary() and stats() report the transfer.
"""

import ast
import os
import pickle
import pydoc
import threading
import time

from harness import Checks, import_or_skip

torch, MPI = import_or_skip()

import numpy  # noqa: E402

import weightbridge as wb  # noqa: E402
from weightbridge import _weightbridge  # noqa: E402

import hf_checkpoint  # noqa: E402

TENSORS = [("embed.weight", torch.float32, (6, 4)), ("proj.weight", torch.float32, (5, 4)),
           ("norm.weight", torch.bfloat16, (4,)), ("zz.unused", torch.float32, (3,))]
TIMEOUT_SECONDS = 20


def check_help(checks):
    for cls, calls in ((wb.SenderAdapter, ["__init__", "connect", "send_weights", "wait", "shutdown", "summary",
                                           "stats"]),
                       (wb.ReceiverAdapter, ["__init__", "poll_requests", "summary", "stats"])):
        text = pydoc.render_doc(cls)
        for call in calls:
            doc = getattr(cls, call).__doc__ or ""
            # pybind11 puts the signature first; an explanation must follow it.
            explanation = doc.split("\n", 1)[1].strip() if "\n" in doc else ""
            checks.check(len(explanation) > 40, f"help({cls.__name__}.{call}) explains nothing: {doc!r}")
            checks.check(call in text, f"help({cls.__name__}) does not mention {call}")
    checks.check("load_weights" in wb.SenderAdapter.__init__.__doc__, "SenderAdapter's help does not explain load_weights")


def check_stubs(checks):
    """Every public name and member of the extension module is in the stubs, and nothing else."""
    stub_path = os.path.join(os.path.dirname(_weightbridge.__file__), "_weightbridge.pyi")
    with open(stub_path) as f:
        tree = ast.parse(f.read())
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | \
                {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)} | \
                {n.name for n in node.body if isinstance(n, ast.ClassDef)}
        elif isinstance(node, ast.FunctionDef):
            stubbed[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            stubbed[node.target.id] = None
        elif isinstance(node, ast.Assign):
            stubbed[node.targets[0].id] = None
    aliases = {"Tensor", "DTypeLike", "Params", "TensorList", "LoadWeights", "OptionsLike", "_Enum"}
    defined = {n for n in dir(_weightbridge) if not n.startswith("__") or n == "__version__"}
    checks.check(defined == set(stubbed) - aliases,
                 f"stubs and module differ: only in the module {sorted(defined - set(stubbed))}, "
                 f"only in the stubs {sorted(set(stubbed) - aliases - defined)}")
    for name in defined & set(stubbed):
        cls = getattr(_weightbridge, name)
        if not isinstance(cls, type) or stubbed[name] is None:
            continue
        members = {m for m in vars(cls) if not m.startswith("_")}
        enum_values = set(getattr(cls, "__members__", {}))
        if enum_values:
            members -= {"name", "value"}  # pybind11 enum plumbing, declared once in _Enum
        missing = members - stubbed[name] - enum_values
        extra = stubbed[name] - members - {"__init__"}
        checks.check(not missing and not extra,
                     f"stub of {name}: missing {sorted(missing)}, not in the module {sorted(extra)}")


def expect_input_error(checks, case, make, pattern_words, world):
    try:
        make()
        checks.fail(f"{case}: no error")
        message = None
    except wb.Error as error:
        message = error.message
        checks.check(error.code == wb.ErrorCode.INVALID_ARGUMENT or error.code == wb.ErrorCode.UNSUPPORTED,
                     f"{case}: code {error.code}")
        for words in pattern_words:
            checks.check(words in error.message, f"{case}: {words!r} not in {error.message!r}")
        checks.check(str(error) == f"[rank {world.Get_rank()}] {wb.error_code_name(error.code)}: {error.message}",
                     f"{case}: str(error) is {str(error)!r}")
    everyone = world.allgather(message)
    checks.check(len(set(everyone)) == 1, f"{case}: ranks saw different errors: {everyone}")


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    checks = Checks(world, watchdog_seconds=180)
    if world.Get_size() != 2:
        raise SystemExit("needs 2 ranks")
    trainer = rank == 0
    comm = world.Split(rank, 0)
    try:
        check_help(checks)
        check_stubs(checks)
        error = wb.Error(wb.ErrorCode.TIMEOUT, "a message", "[rank 4] timeout: a message")
        copy = pickle.loads(pickle.dumps(error))
        checks.check((copy.code, copy.message, str(copy)) == (error.code, error.message, str(error)),
                     f"pickled Error: {copy.code}, {copy.message!r}, {str(copy)!r}")
        checks.check(repr(wb.AdapterOptions(sender_staging=True, timeout_seconds=5)).startswith(
            "AdapterOptions(sender_staging=True, receiver_staging=None"), "AdapterOptions repr")

        # Bad input: every rank raises the same error, naming the rank that had it.
        ok_param = {"w": torch.zeros(4, 4)}

        def construct(params, load_weights=lambda weights: None, **options):
            if trainer:
                wb.SenderAdapter(world, comm, params, TENSORS, load_weights, **options)
            else:
                wb.ReceiverAdapter(world, comm, params, load_weights, **options)

        expect_input_error(checks, "strided parameter",
                           lambda: construct({"w": torch.zeros(4, 4).t()} if trainer else ok_param),
                           ["trainer 0 (world rank 0)", "parameter w [4, 4] is not contiguous (strides [1, 4])"], world)
        expect_input_error(checks, "int16 parameter",
                           lambda: construct({"bad": torch.zeros(3, dtype=torch.int16)} if not trainer else ok_param),
                           ["rollout (world rank 1): parameter bad: its dtype (DLPack code 0, 16 bits, 1 lanes) has no "
                            "WeightBridge equivalent"], world)
        expect_input_error(checks, "unknown option",
                           lambda: construct(ok_param, **({"sender_stagin": True} if trainer else {})),
                           ["trainer (world rank 0): unknown option 'sender_stagin' (AdapterOptions has sender_staging"],
                           world)
        expect_input_error(checks, "loader not callable",
                           lambda: construct(ok_param, load_weights=None if not trainer else (lambda w: None)),
                           ["rollout (world rank 1): load_weights is a NoneType, not callable"], world)

        transfer(world, comm, trainer, checks)
    except Exception:
        checks.exception("api")
    checks.finish()


def transfer(world, comm, trainer, checks):
    """Two versions, sync mode, numpy and torch parameters, one stored transposed on the rollout."""
    if trainer:
        params = {"embed": numpy.zeros((6, 4), numpy.float32), "proj": numpy.zeros((5, 4), numpy.float32),
                  "norm": torch.zeros(4, dtype=torch.bfloat16)}

        def load_weights(weights):
            for name, tensor in weights:
                if name != "zz.unused":
                    target = params[name.split(".")[0]]
                    target[...] = tensor.numpy() if isinstance(target, numpy.ndarray) else tensor

        sender = wb.SenderAdapter(world, comm, params, [wb.TensorInfo(n, d, s) for n, d, s in TENSORS], load_weights,
                                  options=wb.AdapterOptions(timeout_seconds=TIMEOUT_SECONDS), sender_staging=False)
        sender.connect()
        for version in (1, 2):
            load_weights(hf_checkpoint.make_checkpoint(TENSORS, version).items())
            ticks = []
            stop = threading.Event()

            def tick():
                while not stop.is_set():
                    ticks.append(time.monotonic())
                    time.sleep(0.001)

            thread = threading.Thread(target=tick)
            thread.start()
            started = time.monotonic()
            sender.send_weights(version)
            ended = time.monotonic()
            stop.set()
            thread.join()
            if version == 2:  # the rollout waits 0.5 s before it polls for version 2
                during = [t for t in ticks if started < t < ended]
                checks.check(ended - started > 0.3 and len(during) >= 20,
                             f"send_weights took {ended - started:.3f} s while a Python thread ran {len(during)} "
                             "times: the GIL is not released while it waits")
        summary = sender.summary()
        checks.check(summary.model_bytes == 6 * 4 * 4 + 5 * 4 * 4 + 4 * 2,
                     f"model_bytes {summary.model_bytes} (zz.unused is needed by nobody)")
        sender.shutdown()
        stats = sender.stats()
        checks.check(stats.updates == 2 and stats.version == 2 and len(stats.stalls) == 2, f"trainer stats {stats}")
        checks.check({t.transport for t in stats.traffic} == {"cma"} and stats.traffic[0].peer == 1,
                     f"traffic {[(t.transport, t.peer, t.bytes) for t in stats.traffic]}")
        return

    def new_params():
        return {"embed_t": torch.zeros(4, 6), "proj": torch.zeros(5, 4), "norm": torch.zeros(4, dtype=torch.bfloat16)}

    def loader_into(target, stash=None):
        def load_weights(weights):
            # Stops before zz.unused (as engines skip what they do not hold) and keeps the iterator.
            for name, tensor in weights:
                if name == "embed.weight":
                    target["embed_t"].copy_(tensor.t())
                elif name == "proj.weight":
                    target["proj"].copy_(tensor)
                elif name == "norm.weight":
                    target["norm"].copy_(tensor)
                    break
            if stash is not None:
                stash.append(weights)
        return load_weights

    params, stash = new_params(), []
    receiver = wb.ReceiverAdapter(world, comm, params, loader_into(params, stash), {"timeout_seconds": TIMEOUT_SECONDS})
    while True:
        result = receiver.poll_requests()
        if result.event == wb.Event.SHUTDOWN:
            break
        if result.event == wb.Event.INSTALLED:
            expected = new_params()
            loader_into(expected)(hf_checkpoint.make_checkpoint(TENSORS, result.version).items())
            difference = hf_checkpoint.first_difference(params, expected)
            checks.check(difference is None, f"version {result.version}: {difference}")
            if result.version == 1:
                time.sleep(0.5)  # the trainer waits in send_weights(2) meanwhile
        time.sleep(0.002)
    checks.check(receiver.installed_version == 2, f"installed {receiver.installed_version}")
    try:
        next(stash[0])
        checks.fail("the probe's (name, tensor) pairs were readable after load_weights returned")
    except wb.Error as error:
        checks.check("readable only during that call" in error.message, f"stale pairs: {error.message}")


if __name__ == "__main__":
    main()
