"""An FP8 engine in Python (issue 32): two BF16 trainers (rows of w cut at 96, inside a 128-row block, so
that block's amax comes from both) to one engine that holds w as torch.uint8 e4m3 codes (torch 1.13 has
no float8) with w_scale_inv in float32, and the head and norm as they are. Three versions in each of the
four modes; after each, every engine parameter equals an independent reference computed here from the
BF16 values (numpy, float32 arithmetic, round to nearest even, saturation at 448): SGLang's
per_block_cast_to_fp8. In the modes that stage on the engine, w is given as a DLPack producer of
float8_e4m3fn (DLPack 1.0's code 10, as a torch with float8 exports it) over the same bytes."""

import ctypes
import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, import_or_skip  # noqa: E402

torch, MPI = import_or_skip()
import numpy  # noqa: E402
import weightbridge as wb  # noqa: E402

TIMEOUT_SECONDS = 60
ROWS, COLS, CUT = 192, 200, 96  # w: [192, 200]: 2 x 2 blocks of 128, the edge ones partial
TENSORS = [("w.weight", "bf16", (ROWS, COLS)), ("norm.weight", "bf16", (COLS,)), ("lm_head.weight", "bf16", (64, COLS))]
FP8 = wb.Fp8Engine(block_rows=128, block_cols=128, scale_rule="per-block-cast", modules_to_not_convert=["lm_head"])


def version_values(name, shape, version):
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()) + version)  # the same on every rank
    values = torch.randn(shape, generator=generator) * 0.05
    if name == "w.weight":
        values[0:128, 128:] = 0  # an all-zero block: its scale is max(0, 1e-4) / 448, its codes zeros
        values[128:, 0:128] *= 1e4  # large values: the scale follows them
    return values.to(torch.bfloat16)


class Float8Codes:
    """A uint8 tensor's bytes exported as DLPack float8_e4m3fn (code 10, 8 bits): numpy's capsule with its
    dtype code changed (the DLTensor's data, device and ndim take 20 bytes before it)."""

    def __init__(self, codes):
        self.array = codes.numpy()  # the tensor's memory

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, stream=None):
        capsule = self.array.__dlpack__()
        pointer = ctypes.pythonapi.PyCapsule_GetPointer
        pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        ctypes.memmove(pointer(capsule, b"dltensor") + 20, bytes([10]), 1)
        return capsule


def e4m3_reference(y):
    """float32 array -> e4m3fn codes: nearest of the 127 non-negative values, ties to the even code."""
    values = [k / 512.0 for k in range(8)]
    values += [(8 + m) * 2.0 ** (e - 10) for e in range(1, 16) for m in range(8) if not (e == 15 and m == 7)]
    table = numpy.array(values, dtype=numpy.float64)
    a = numpy.abs(y.astype(numpy.float64))
    upper = numpy.clip(numpy.searchsorted(table, a), 1, len(table) - 1)
    lower = upper - 1
    d_low, d_up = a - table[lower], table[upper] - a
    code = numpy.where((d_up < d_low) | ((d_up == d_low) & (upper % 2 == 0)), upper, lower)
    code = numpy.where(a >= 448.0, 0x7E, code)
    code = numpy.where(numpy.isnan(y), 0x7F, code)
    return (code | numpy.where(numpy.signbit(y), 0x80, 0)).astype(numpy.uint8)


def reference(version):
    """The engine's parameters for `version`: w's codes and scales by per_block_cast_to_fp8, the rest as is."""
    x = version_values("w.weight", (ROWS, COLS), version).float().numpy()
    codes = numpy.zeros((ROWS, COLS), numpy.uint8)
    scales = numpy.zeros((2, 2), numpy.float32)
    for bi in range(2):
        for bj in range(2):
            block = x[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]
            amax = numpy.float32(max(numpy.abs(block).max(), numpy.float32(1e-4)))
            scales[bi, bj] = amax / numpy.float32(448)
            factor = numpy.float32(448) / amax
            codes[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128] = e4m3_reference((block * factor).astype(numpy.float32))
    return {"w": torch.from_numpy(codes), "w_scale_inv": torch.from_numpy(scales),
            "norm": version_values("norm.weight", (COLS,), version),
            "head": version_values("lm_head.weight", (64, COLS), version)}


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    checks = Checks(world, watchdog_seconds=int(os.environ.get("WB_TEST_WATCHDOG", 240)))
    if world.Get_size() != 3:
        raise SystemExit("needs 3 ranks")
    trainer = rank < 2
    comm = world.Split(0 if trainer else 1, rank)
    if trainer:
        rows = slice(0, CUT) if rank == 0 else slice(CUT, ROWS)
        params = {"w": torch.zeros((rows.stop - rows.start, COLS), dtype=torch.bfloat16),
                  "norm": torch.zeros((COLS,), dtype=torch.bfloat16),
                  "head": torch.zeros((64, COLS), dtype=torch.bfloat16)}

        def load_weights(weights):
            for name, tensor in weights:
                if name == "w.weight":
                    params["w"].copy_(tensor[rows])
                elif name == "norm.weight":
                    params["norm"].copy_(tensor)
                elif name == "lm_head.weight":
                    params["head"].copy_(tensor)
    else:
        params = {"w": torch.zeros((ROWS, COLS), dtype=torch.uint8), "w_scale_inv": torch.zeros((2, 2)),
                  "norm": torch.zeros((COLS,), dtype=torch.bfloat16), "head": torch.zeros((64, COLS), dtype=torch.bfloat16)}
        places = {"w.weight": "w", "w.weight_scale_inv": "w_scale_inv", "norm.weight": "norm", "lm_head.weight": "head"}

        def load_weights(weights):  # SGLang's default weight_loader: copy_ by name
            for name, tensor in weights:
                params[places[name]].copy_(tensor)

    for sender_staging in (False, True):
        for receiver_staging in (False, True):
            mode = f"sender_staging={sender_staging}, receiver_staging={receiver_staging}"
            options = wb.AdapterOptions(sender_staging=sender_staging, receiver_staging=receiver_staging,
                                        timeout_seconds=TIMEOUT_SECONDS, node=0 if trainer else 1)
            try:
                if trainer:
                    sender = wb.SenderAdapter(world, comm, params, TENSORS, load_weights, options)
                    sender.connect()
                    summary = sender.summary()
                    # One copy of the FP8 form: w's codes (1 byte an element) and 4 scales, the rest in bf16.
                    form_bytes = ROWS * COLS + 4 * 4 + 2 * COLS + 2 * 64 * COLS
                    checks.check(summary.model_bytes == form_bytes,
                                 f"{mode}: M is {summary.model_bytes} bytes, the FP8 form has {form_bytes}")
                    for version in (1, 2, 3):
                        load_weights((name, version_values(name, shape, version)) for name, _, shape in TENSORS)
                        sender.send_weights(version)
                        for tensor in params.values():
                            tensor.fill_(7)  # must not reach version `version`
                    sender.shutdown()
                else:
                    options.fp8 = FP8
                    given = dict(params, w=Float8Codes(params["w"])) if receiver_staging else params
                    receiver = wb.ReceiverAdapter(world, comm, given, load_weights, options)
                    deadline = time.monotonic() + 3 * TIMEOUT_SECONDS
                    installed = 0
                    while time.monotonic() < deadline:
                        result = receiver.poll_requests()
                        if result.event == wb.Event.SHUTDOWN:
                            break
                        if result.event == wb.Event.INSTALLED:
                            installed = result.version
                            expected = reference(installed)
                            for name, want in expected.items():
                                checks.check(torch.equal(params[name], want),
                                             f"{mode}: version {installed}: {name} differs from the reference in "
                                             f"{int((params[name] != want).sum())} elements")
                        time.sleep(0.001)
                    checks.check(installed == 3, f"{mode}: installed version {installed}, not 3")
            except wb.Error as error:
                checks.fail(f"{mode}: {error}")
    checks.finish()


main()
