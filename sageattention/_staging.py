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

from itertools import accumulate
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
    on ``device``. Only a ``[2, len(first)]`` table is copied and the index is built there: an
    index of every row copied from pageable memory made the host wait for the GPU's queue once
    it held ~256 KB (an H200,
    bench/results/2026-11-29-NVIDIA_H200-557d942-varlen-many-sequences.md)."""
    before = list(accumulate(count, initial=0))  # where each sequence's rows start in the index
    total = before.pop()
    table = to_device(torch.tensor([list(first), before], dtype=torch.int64).reshape(2, -1), device)
    first_t, before_t = table.unbind()
    r = torch.arange(total, device=device)
    # the sequence of index row r: the last one that starts at or before r (one with no rows
    # starts where the next begins, so it is never the last)
    seq = torch.searchsorted(before_t, r, right=True) - 1
    return first_t[seq] + (r - before_t[seq])


def kept_tables() -> int:
    """How many tables captured copies hold (for tests)."""
    return len(_KEPT)
