"""``python -m sageattention``: what this installation can run here."""

import platform

import torch

from . import __version__, _build, dispatch


def main() -> None:
    print(f"sageattention {__version__}")
    print(f"python        {platform.python_version()} ({platform.system()} {platform.machine()})")
    print(f"torch         {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(_build.describe())
    ok, why = dispatch.triton_status()
    if ok:
        import triton

        print(f"triton        {triton.__version__}")
    else:
        print(f"triton        not available: {why}")
    if not torch.cuda.is_available():
        print("GPU           none visible: sageattention's kernels need an NVIDIA GPU (sm80+)")
        return
    for i in range(torch.cuda.device_count()):
        cap = torch.cuda.get_device_capability(i)
        print(f"GPU {i}         {torch.cuda.get_device_name(i)} (sm{cap[0]}{cap[1]})")
    dev = torch.device("cuda", torch.cuda.current_device())
    print("backends on", dev)
    for name, state in dispatch.report(dev).items():
        print(f"  {name:<10} {state}")
    try:
        choice = dispatch.choose(dev)
        print(f"sageattn uses {choice.backend}")
        s = choice.hand_over
        if s is not None:  # dispatch.HAND_OVER
            print(hand_over_text(s))
        else:
            print("  every call, no hand-over to SDPA (none measured for this GPU: dispatch.HAND_OVER)")
    except RuntimeError as exc:
        print(f"sageattn      unavailable: {exc}")
    print(f"sageattn3_blackwell (FP4) {fp4_status(torch.cuda.get_device_capability(dev))}")


def _count(n: int) -> str:
    """A limit on B*H*Nq*Nk as written in dispatch.py: 2^29, 3*2^28."""
    k = (n & -n).bit_length() - 1  # trailing zero bits
    return f"2^{k}" if n == 1 << k else f"{n >> k}*2^{k}"


#: The rows of the hand-over table: a label and a head dim of the class it stands for
#: (tests/test_dispatch.py checks that every multiple of 8 has its class's limits).
HEAD_DIM_CLASSES = (("D < 64", 32), ("D = 64", 64), ("64 < D < 128", 96), ("D = 128", 128),
                    ("128 < D <= 192", 160), ("192 < D < 256", 224), ("D = 256", 256))
#: The columns: a heading and call_limits' (causal, gqa, aligned) for it.
CALL_KINDS = (("on tile", (False, False, True)), ("off tile", (False, False, False)),
              ("GQA on tile", (False, True, True)), ("GQA off tile", (False, True, False)),
              ("causal", (True, False, True)), ("causal GQA", (True, True, True)))


def hand_over_table(s: "dispatch.HandOver") -> list:
    """``[(label, cells)]``, one per :data:`HEAD_DIM_CLASSES` row, each cell ``(length, pairs)``
    from dispatch.call_limits for a :data:`CALL_KINDS` column, or None where every call goes to
    SDPA (head dims above ``s.head_dim_above``)."""
    return [(label, [None if d > s.head_dim_above else dispatch.call_limits(s, d, *kind) for _, kind in CALL_KINDS])
            for label, d in HEAD_DIM_CLASSES]


def hand_over_text(s: "dispatch.HandOver") -> str:
    """The calls a choice with hand-over limits ``s`` (dispatch.HAND_OVER) sends to SDPA, in words:
    a table of :func:`hand_over_table`, what its columns mean, then the return_lse rule."""
    g, tile = dispatch.GQA_GROUP, dispatch.CUDNN_TILE
    lines = ["  to SDPA (cuDNN first): calls with L = 2 Nq Nk / (Nq + Nk) below the first number of their "
             "cell, or B*H*Nq*Nk below the second",
             "    " + f"{'head dim':<16}" + "".join(f"{name:<15}" for name, _ in CALL_KINDS).rstrip()]
    for label, cells in hand_over_table(s):
        text = (f"every call (head dims above {s.head_dim_above})" if cells[0] is None else
                "".join(f"{f'{n} {_count(p)}':<15}" for n, p in cells).rstrip())
        lines.append(f"    {label:<16}{text}")
    lines.append(f"    non-causal on or off the tile: Nq and Nk multiples of {tile} (cuDNN's tile) or not; "
                 f"GQA: {g} or more query heads per K/V head")
    lines.append("    causal calls with more keys than queries as if Nk = Nq, with fewer by the non-causal limits")
    long = [dispatch.call_limits(s, 128, True, gqa, True, True)[1] for gqa in (False, True)]
    short = [dispatch.call_limits(s, 128, True, gqa, True)[1] for gqa in (False, True)]
    if long != short:
        gqa = "" if long[1] == long[0] else f" ({_count(long[1])} with GQA)"
        lines.append(f"    causal from {s.length_causal_long} queries at D <= 128: B*H*Nq*Nk below {_count(long[0])}{gqa}")
    if s.grid_base:
        lines.append(f"    off the tile, not GQA, D <= 128, from {_count(s.pairs_unaligned)} up to {_count(s.pairs)}: "
                     f"also where the rounds of work tiles on {s.sms} SMs predict the kernel slower "
                     "(dispatch.grid_slower)")
    if s.long_q:
        lines.append(f"    non-causal, 64 < D <= 128, {dispatch.SM90_NC3_ROUNDS_KEYS} to {dispatch.SM90_NC3_KEYS - 1} keys and "
                     f"{s.long_q}x as many queries or more: by the second number of their cell alone (B*H*Nq*Nk), "
                     "whatever the length")
    lines.append("    head dims that are not multiples of 8: never (SDPA runs those on flash, slower)")
    lines.append(f"  with return_lse only head dims that are multiples of 8 up to {s.lse_head_dim} "
                 f"(cuDNN {dispatch._cudnn_version() or 'not found'}), two keys or more (o and the LSE from torch's cuDNN "
                 "attention); the others run the kernel")
    return "\n".join(lines)


def fp4_status(cap) -> str:
    """Whether sageattention3_blackwell's kernels can run on a GPU of compute capability ``cap``."""
    from sageattention3_blackwell import _kernels

    module = _kernels.attention_module(cap)
    if module is None:
        return f"not for sm{cap[0]}{cap[1]}: its kernels are for sm100/sm120/sm121 (emulation.attention runs anywhere)"
    for m in (_kernels.QUANT, module):
        ok, why = _kernels.available(m)
        if not ok:
            return f"unavailable: {why}"
    return f"available ({module})"


if __name__ == "__main__":
    main()
