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


def hand_over_text(s: "dispatch.HandOver") -> str:
    """The calls a choice with hand-over limits ``s`` (dispatch.HAND_OVER) sends to SDPA, in words:
    two lines, the limits and the return_lse rule."""
    wide = f"head dims above {s.head_dim_above}; " if s.head_dim_above < dispatch.MAX_HEAD_DIM else ""
    g = dispatch.GQA_GROUP
    aligned = (f" ({s.length_192_gqa_aligned} where Nq and Nk are multiples of {dispatch.CUDNN_TILE})"
               if s.length_192_gqa_aligned > s.length_192_gqa else "")
    d64 = f" ({s.length_gqa_d64} at D = 64)" if s.length_gqa_d64 != s.length_gqa else ""
    non_causal = ("" if s.length_unaligned == s.length_gqa == s.length_gqa_d64 == s.length_gqa_aligned == s.length else
                  f" (non-causal at D <= 128: {s.length_unaligned} where Nq or Nk is not a multiple of "
                  f"{dispatch.CUDNN_TILE}; with {g} or more query heads per K/V head {s.length_gqa}{d64}, "
                  f"{dispatch.on_tile(s.length_gqa, s.length_gqa_aligned, True)} where both are)")
    split_pairs = [f"off the tile without GQA {_count(s.pairs_unaligned)}"] if s.pairs_unaligned != s.pairs else []
    if s.pairs_gqa != s.pairs:
        split_pairs.append(f"with {g} or more query heads per K/V head {_count(s.pairs_gqa)}")
    non_causal_pairs = f" (non-causal at D <= 128 {', '.join(split_pairs)})" if split_pairs else ""
    long_pairs = (f", from {s.length_causal_long} keys at D <= 128 {_count(s.pairs_causal_long)}"
                  if s.pairs_causal_long < s.pairs_causal else "")
    return (f"  to SDPA (cuDNN first): {wide}"
            f"calls with L = 2 Nq Nk / (Nq + Nk) below {s.length}{non_causal}, causal {s.length_causal} "
            f"({s.length_causal_d64} at D = 64, {s.length_causal_padded_d64} at D < 64, "
            f"{s.length_causal_padded} at 64 < D < 128), {s.length_192} at 128 < D <= 192 (causal "
            f"{s.length_causal_192}, and B*H*Nq*Nk below {_count(s.pairs_192)}; with "
            f"{g} or more query heads per K/V head {s.length_192_gqa}{aligned}, causal "
            f"{s.length_causal_192_gqa}, and {_count(s.pairs_192_gqa)}; causal calls there at least "
            "the causal limits below), "
            f"{s.length_padded} at 192 < D < 256 causal or not, "
            f"or B*H*Nq*Nk below {_count(s.pairs)}{non_causal_pairs}, causal {_count(s.pairs_causal)}{long_pairs} "
            f"({_count(s.pairs_causal_gqa)} with {g} or more query heads per K/V head) "
            "(causal: Nk taken as at most Nq, Nq > Nk by the non-causal limits); "
            "no call at a head dim that is not a multiple of 8 (SDPA runs those on flash, slower)\n"
            f"  with return_lse only head dims that are multiples of 8 up to {s.lse_head_dim} "
            f"(cuDNN {dispatch._cudnn_version()}), two keys or more (o and the LSE from torch's cuDNN "
            "attention); the others run the kernel")


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
