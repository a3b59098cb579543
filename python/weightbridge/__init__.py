"""WeightBridge: moves model weights from RL trainer ranks to rollout (inference) ranks.

Each side gives WeightBridge its parameters (name -> torch.Tensor, in its own layout) and its own
load_weights; connect learns both layouts by probing those loaders, plans the transfer once, and every
send_weights replays the plan in C++ with one-sided writes. Communicators are mpi4py ones.

    # trainer ranks                                  # rollout ranks (every rank of every engine)
    sender = weightbridge.SenderAdapter(             receiver = weightbridge.ReceiverAdapter(
        world, trainer_comm, params,                     world, engine_comm, params, model.load_weights)
        checkpoint_tensors, model.load_weights)      while True:
    sender.connect()                                     result = receiver.poll_requests()
    for step in range(1, steps + 1):                     if result.event == weightbridge.Event.SHUTDOWN:
        train_step()                                         break
        sender.send_weights(step)                        generate_step()
    sender.shutdown()

See help(weightbridge.SenderAdapter), help(weightbridge.ReceiverAdapter) and help(weightbridge.AdapterOptions).
"""

from ._error import Error
from ._weightbridge import (
    AdapterOptions,
    AdapterStats,
    ErrorCode,
    Event,
    Fp8Engine,
    LinkTraffic,
    TraceSpan,
    PollResult,
    ReceiverAdapter,
    SenderAdapter,
    StallInterval,
    Status,
    TensorInfo,
    TransferSummary,
    UpdateRecord,
    __version__,
    error_code_name,
    read_tensor_list,
)

__all__ = [
    "AdapterOptions",
    "AdapterStats",
    "Error",
    "ErrorCode",
    "Event",
    "Fp8Engine",
    "LinkTraffic",
    "TraceSpan",
    "PollResult",
    "ReceiverAdapter",
    "SenderAdapter",
    "StallInterval",
    "Status",
    "TensorInfo",
    "TransferSummary",
    "UpdateRecord",
    "__version__",
    "error_code_name",
    "read_tensor_list",
]
