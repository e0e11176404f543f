"""The public functions are forward-only: a backward through them raises instead of going wrong.

The compiled ops have no autograd formula. For such an op torch's autograd fallback lets a
backward run through it with a warning ("may lead to silently incorrect behavior") and whatever
gradient comes out (none for q, k, v through quantized int8/e4m3 tensors; with a probe op of the
same shape on the CPU, a gradient through the scales only), so a loss that also reaches other
parameters (a residual stream, a LoRA adapter) would train on a wrong gradient. The Triton op
raises torch's generic error instead, and calls that sageattn hands to SDPA would, on their own,
be differentiable: what a backward did would depend on the GPU, the build and the lengths.

:func:`inference_only` runs a call whose q, k or v requires grad (grad mode on) without grad
and gives its outputs a backward node that raises, naming the function.
Calls under ``torch.no_grad()`` / ``torch.inference_mode()`` or on tensors that need no grad
(the usual inference) are not touched. Under torch.compile (dynamo would trace the Function's
backward, which raises) a call that needs grad raises at once: dynamo then breaks the graph there
and runs the call eagerly, as above, or with ``fullgraph=True`` fails to compile with this error.
"""

from __future__ import annotations

import functools

import torch


def _message(fn: str) -> str:
    return (f"{fn} has no backward: sageattention's kernels are for inference (quantized, forward "
            "only). Run the forward under torch.no_grad() or torch.inference_mode(); to train, use "
            "torch.nn.functional.scaled_dot_product_attention")


class _NoBackward(torch.autograd.Function):
    """Runs the call (autograd runs a Function's forward without grad); q, k, v are its inputs
    only so that a backward reaches this node. The outputs are made here, not passed in, so they
    are not views of the node's inputs and may be changed in place as any other output."""

    @staticmethod
    def forward(ctx, fn, run, q, k, v):
        ctx.fn = fn
        return run()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_message(ctx.fn))


def _needs_grad(q, k, v) -> bool:
    # (on every call: a few attribute reads, no generator)
    return torch.is_grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
                                        or getattr(v, "requires_grad", False))


def inference_only(func):
    """Wraps a public function ``func(q, k, v, ...)`` (see the module's text)."""

    @functools.wraps(func)
    def call(q, k, v, *args, **kwargs):
        if not _needs_grad(q, k, v):
            return func(q, k, v, *args, **kwargs)
        if torch.compiler.is_compiling():  # dynamo breaks the graph here and runs this call eagerly
            raise RuntimeError(_message(func.__name__))
        return _NoBackward.apply(func.__name__, lambda: func(q, k, v, *args, **kwargs), q, k, v)

    return call
