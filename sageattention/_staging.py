"""Small tables built on the host, copied to the GPU: also correct inside CUDA-graph capture.

The packed (varlen) paths build their offsets and row indices on the host and send each table
in one asynchronous copy. Inside ``torch.cuda.graph`` that copy is not run but recorded, with
the host address it reads, and every replay reads that address again, long after the call's
temporary table is freed and its memory reused. Under capture the table is therefore kept:
one host copy per distinct table, for the life of the process (a graph that reads it may live
as long), so each replay copies the values of the capture. A captured ``sageattn_varlen``
replays the lengths it was captured with.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

_KEPT: Dict[Tuple, torch.Tensor] = {}  # tables read by captured copies; never freed


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``, without waiting for the GPU."""
    if device.type != "cuda":
        return host.to(device)
    if torch.cuda.is_current_stream_capturing():
        key = (host.dtype, tuple(host.shape), host.numpy().tobytes())
        host = _KEPT.setdefault(key, host.clone())
    return host.to(device, non_blocking=True)  # pageable: the driver stages it at once


def kept_tables() -> int:
    """How many tables captured copies hold (for tests)."""
    return len(_KEPT)
