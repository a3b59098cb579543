"""The bridge from C++'s load_weights(checkpoint, params) to the engines' load_weights(weights).

connect probes every worker's loader on a probe checkpoint that C++ computes tensor by tensor. The loader
gets it the way SGLang and vLLM get a checkpoint: an iterable of (name, tensor) pairs, here a generator
that reads each tensor straight into a freshly allocated torch tensor (no further copy) as the loader
asks for it, so at most the tensors the loader keeps are alive at once.
"""

_TORCH_DTYPES = None


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _torch_dtypes(torch):
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        names = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8",
                 "u8": "uint8", "i32": "int32", "i64": "int64", "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}
        # fp8 exists from torch 2.1 on; before, FP8 tensors come as uint8 holding their codes (as FP8 engines
        # on such a torch keep their weights).
        _TORCH_DTYPES = {ours: getattr(torch, theirs) if hasattr(torch, theirs) else torch.uint8
                         for ours, theirs in names.items() if hasattr(torch, theirs) or ours.startswith("f8")}
    return _TORCH_DTYPES


def _torch_pairs(view, torch):
    dtypes = _torch_dtypes(torch)
    for name, dtype, shape in view.tensors():
        if dtype not in dtypes:
            raise TypeError(f"checkpoint tensor {name} is {dtype}, which torch {torch.__version__} lacks")
        tensor = torch.empty(shape, dtype=dtypes[dtype])
        view.read_into(name, tensor)
        yield name, tensor


def _numpy_pairs(view):
    import numpy

    dtypes = {"f16": numpy.float16, "f32": numpy.float32, "f64": numpy.float64, "i8": numpy.int8,
              "u8": numpy.uint8, "i32": numpy.int32, "i64": numpy.int64, "f8e4m3": numpy.uint8, "f8e5m2": numpy.uint8}
    for name, dtype, shape in view.tensors():
        if dtype not in dtypes:
            raise TypeError(f"checkpoint tensor {name} is {dtype}, which numpy lacks: install torch")
        array = numpy.empty(shape, dtype=dtypes[dtype])
        view.read_into(name, array)
        yield name, array


def _ran_nothing(result):
    """What a loader's return value says when it ran none of its body: a generator function (a stray
    `yield`) or a coroutine function (`async def`) returns an object that nothing here iterates or awaits.
    None when the value says nothing of the kind."""
    import inspect

    if inspect.isgenerator(result):
        result.close()
        return "a generator function"
    if inspect.iscoroutine(result):
        result.close()  # never awaited: no RuntimeWarning either
        return "a coroutine function"
    if inspect.isasyncgen(result):
        return "an asynchronous generator function"
    return None


def call_load_weights(load_weights, view):
    """Called by the C++ side (with the GIL) once per probe pass. Returns None, or what load_weights is
    when its call returned without running its body ("a generator function", ...)."""
    torch = _torch()
    if torch is None:
        return _ran_nothing(load_weights(_numpy_pairs(view)))
    # As the engines run their loaders: no autograd, so copy_ into an nn.Parameter is allowed.
    with torch.no_grad():
        return _ran_nothing(load_weights(_torch_pairs(view, torch)))
