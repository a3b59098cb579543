#!/usr/bin/python3
"""Writes HDF5 checkpoints the way other tools do (h5py's defaults and its variants), for the reader test.

usage: h5py_checkpoints.py OUTDIR

Writes *.h5 files into OUTDIR and OUTDIR/manifest.json: for each file either the tensors a reader must
list (name, dtype, shape, and the little-endian bytes in hex, in the reader's order) or the parts its
error message must contain. Exits 77 (the test then skips) when h5py or numpy cannot be imported; they
come with Debian's python3-h5py, which only /usr/bin/python3 sees.
"""
import json
import os
import sys

try:
    import h5py
    import numpy as np
except ImportError as error:  # the C++ test reports this line as its reason to skip
    print(f"h5py_checkpoints.py: cannot import h5py/numpy with {sys.executable}: {error} "
          "(install python3-h5py, scripts/install-deps.sh)", file=sys.stderr)
    sys.exit(77)

out = sys.argv[1]
manifest = {}


def values(shape, dtype, seed):
    """Deterministic values that use every bit of each element's width."""
    count = int(np.prod(shape)) if shape else 1
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=count * np.dtype(dtype).itemsize, dtype=np.uint8)
    array = raw.view(np.dtype(dtype).newbyteorder("<")).reshape(shape)
    if np.dtype(dtype).kind == "f":  # NaN payloads may not survive numpy's conversions: keep finite values
        array = np.nan_to_num(array, nan=1.5, posinf=2.5, neginf=-2.5)
    return array


def expect(name, dtype, array):
    return {"name": name, "dtype": dtype, "shape": list(array.shape),
            "hex": np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes().hex()}


# --- every encoding of the dtype attribute over bf16/f16/fp8 bit patterns stored as integers ----------
expected = []
with h5py.File(os.path.join(out, "strings.h5"), "w") as f:
    def bits(name, storage, text_or_create, dtype, seed):
        array = values((3, 4), storage, seed)
        d = f.create_dataset(name, data=array)
        text_or_create(d)
        expected.append(expect(name, dtype, array))

    bits("a.vlen_utf8", "<u2", lambda d: d.attrs.__setitem__("dtype", "bf16"), "bf16", 1)  # h5py's default str
    bits("b.vlen_ascii", "<u2", lambda d: d.attrs.create("dtype", "bf16", dtype=h5py.string_dtype("ascii")), "bf16", 2)
    bits("c.fixed_ascii", "<u2", lambda d: d.attrs.__setitem__("dtype", np.bytes_("f16")), "f16", 3)
    bits("d.fixed_utf8", "<u2",
         lambda d: d.attrs.create("dtype", "bf16".encode(), dtype=h5py.string_dtype("utf-8", 8)), "bf16", 4)
    bits("e.array_of_one", "<u2",
         lambda d: d.attrs.__setitem__("dtype", np.array(["bf16"], dtype=h5py.string_dtype())), "bf16", 5)
    bits("f.torch_name", ">u2", lambda d: d.attrs.__setitem__("dtype", "torch.bfloat16"), "bf16", 6)  # big-endian
    bits("g.fp8_unsigned", "u1", lambda d: d.attrs.__setitem__("dtype", "f8e4m3"), "f8e4m3", 7)
    bits("h.fp8_signed", "i1", lambda d: d.attrs.__setitem__("dtype", "F8_E5M2"), "f8e5m2", 8)
    bits("i.signed_bf16", "<i2", lambda d: d.attrs.__setitem__("dtype", "bfloat16"), "bf16", 9)
manifest["strings.h5"] = {"tensors": expected}

# --- dtypes the dataset's own type states: no attribute needed ------------------------------------------
expected = []
with h5py.File(os.path.join(out, "native.h5"), "w") as f:
    for seed, (name, storage, dtype, shape) in enumerate([
            ("model.a.f16", "<f2", "f16", (5, 3)),
            ("model.b.f32_big_endian", ">f4", "f32", (2, 7)),
            ("model.c.f64", "<f8", "f64", (4,)),
            ("model.d.i8", "i1", "i8", (6,)),
            ("model.e.u8", "u1", "u8", (2, 2, 2)),
            ("model.f.i32_big_endian", ">i4", "i32", (3, 3)),
            ("model.g.i64", "<i8", "i64", (2,)),
            ("model.h.scalar", "<f4", "f32", ())]):
        array = values(shape, storage, 100 + seed)
        f.create_dataset(name, data=array)
        expected.append(expect(name, dtype, array))
    # An attribute that agrees with the type is fine too, in any spelling.
    array = values((8,), "<f4", 200)
    f.create_dataset("model.i.f32_with_attribute", data=array).attrs["dtype"] = "float32"
    expected.append(expect("model.i.f32_with_attribute", "f32", array))
    # Chunked and compressed storage reads the same.
    array = values((16, 8), "<f2", 201)
    f.create_dataset("model.j.f16_gzip", data=array, chunks=(4, 8), compression="gzip")
    expected.append(expect("model.j.f16_gzip", "f16", array))
    # Groups are not tensors; what they hold is not listed.
    f.create_group("optimizer").create_dataset("state", data=np.zeros(4, dtype="<f4"))
manifest["native.h5"] = {"tensors": expected}


# --- files a reader must refuse, and the parts of the message ---------------------------------------------
def refused(file_name, parts, make):
    with h5py.File(os.path.join(out, file_name), "w") as f:
        make(f)
    manifest[file_name] = {"error": parts}


refused("u16_no_attribute.h5", ["w.bits", "16-bit unsigned integer", "no 'dtype' attribute"],
        lambda f: f.create_dataset("w.bits", data=np.zeros(4, dtype="<u2")))
refused("f16_says_bf16.h5", ["w.half", "16-bit float", "bf16"],
        lambda f: f.create_dataset("w.half", data=np.zeros(4, dtype="<f2")).attrs.__setitem__("dtype", "bf16"))
refused("two_strings.h5", ["w.two", "holds 2 strings"],
        lambda f: f.create_dataset("w.two", data=np.zeros(4, dtype="<u2")).attrs.__setitem__("dtype", ["bf16", "f16"]))
refused("unknown_name.h5", ["w.q", "unknown dtype attribute 'q7'"],
        lambda f: f.create_dataset("w.q", data=np.zeros(4, dtype="<u2")).attrs.__setitem__("dtype", "q7"))
refused("numeric_attribute.h5", ["w.n", "not a string"],
        lambda f: f.create_dataset("w.n", data=np.zeros(4, dtype="<u2")).attrs.__setitem__("dtype", 5))
refused("u32.h5", ["w.u32", "32-bit unsigned integer", "no WeightBridge dtype"],
        lambda f: f.create_dataset("w.u32", data=np.zeros(4, dtype="<u4")))
refused("fp8_in_16_bits.h5", ["w.wide", "16-bit unsigned integer", "f8e4m3"],
        lambda f: f.create_dataset("w.wide", data=np.zeros(4, dtype="<u2")).attrs.__setitem__("dtype", "f8e4m3"))
# A name that is not UTF-8: tensor names are Python str and JSON strings; the message shows the byte as \xff.
refused("not_utf8.h5", ["w.\\xff", "not UTF-8"],
        lambda f: f.create_dataset(b"w.\xff", data=np.zeros(4, dtype="<f4")))

# Data kept in another file: a checkpoint must not make the reader open files nobody named.
with open(os.path.join(out, "outside.bin"), "wb") as side:
    side.write(bytes(16))
refused("external_storage.h5", ["w.ext", "other files"],
        lambda f: f.create_dataset("w.ext", shape=(4,), dtype="<f4", external=[(os.path.join(out, "outside.bin"), 0, 16)]))

with open(os.path.join(out, "manifest.json"), "w") as m:
    json.dump(manifest, m, indent=1)
