"""Small tables built on the host, copied to the GPU: also inside CUDA-graph capture.

The packed (varlen) paths build their offsets and row indices on the host and send each table
in one asynchronous copy. Inside ``torch.cuda.graph`` torch refuses that copy from pageable
memory ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU
tensor is pinned"); from pinned memory the copy is not run but recorded with the host address
it reads, and every replay reads that address again. Under capture each table is therefore
copied to pinned memory and kept, one per distinct table, for the life of the process (a graph
that reads it may live as long), so every replay copies the values of the capture. A captured
``sageattn_varlen`` replays the lengths it was captured with.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import torch

_KEPT: Dict[Tuple, torch.Tensor] = {}  # pinned tables read by captured copies; never freed


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``, without waiting for the GPU."""
    if device.type != "cuda":
        return host.to(device)
    if torch.cuda.is_current_stream_capturing():
        key = (host.dtype, tuple(host.shape), host.numpy().tobytes())
        if key not in _KEPT:
            _KEPT[key] = host.pin_memory()
        host = _KEPT[key]
    return host.to(device, non_blocking=True)  # pageable outside capture: staged by the driver at once


def rows_index(first: Sequence[int], count: Sequence[int], device: torch.device) -> torch.Tensor:
    """The rows ``first[i]`` to ``first[i] + count[i] - 1`` of every i in turn, as one int64 index
    on ``device``. Only the ``[2, len(first)]`` table is copied; the index is built there by a few
    whole-tensor operations (a call may pack thousands of sequences, and an index of every row
    copied from pageable memory can make the host wait for the GPU's queue)."""
    total = sum(count)
    table = to_device(torch.tensor([list(first), list(count)], dtype=torch.int64).reshape(2, -1), device)
    first_t, count_t = table.unbind()
    # row r of the index: its sequence's first row, plus r less the rows of the sequences before it
    shift = torch.repeat_interleave(first_t - (count_t.cumsum(0) - count_t), count_t, output_size=total)
    return shift + torch.arange(total, device=device)


def kept_tables() -> int:
    """How many tables captured copies hold (for tests)."""
    return len(_KEPT)
