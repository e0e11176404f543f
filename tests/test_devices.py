"""Tensors on a GPU that is not the current one. A process with two GPUs calls sageattention with
tensors on cuda:1 while cuda:0 is current (the default): every kernel must run on the tensors'
GPU and leave the current device (and its current stream) as they were. Each call is compared,
bit for bit, with the same call on cuda:0 (the same kernels on the same kind of GPU give the same
bits). Equal bits alone would not show a kernel launched on the wrong GPU: once torch has copied
between the two it enables peer access, and a kernel on cuda:0 then reads and writes cuda:1's
memory and gets the same result. So the profiler is asked where the kernels ran.
Marked ``gpu``; each test skips with its reason on a machine with fewer than two GPUs.
"""

import threading

import pytest
import torch

import sageattention as sa
from helpers import assert_close_to_fp32, capture, cu_seqlens, make_qkv, public_functions, sdpa_fp32

pytestmark = pytest.mark.gpu


def _two_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        pytest.skip(f"needs two CUDA GPUs, this machine has {n}")
    if torch.cuda.get_device_name(0) != torch.cuda.get_device_name(1):
        pytest.skip(f"bit-for-bit comparison needs two GPUs of one kind, got {torch.cuda.get_device_name(0)} "
                    f"and {torch.cuda.get_device_name(1)}")
    assert torch.cuda.current_device() == 0, "these tests call with cuda:0 current"


def _same(a, b):
    """Equal bits, tensor by tensor (a result may be o or (o, lse))."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a.cpu(), b.cpu())


def _devices(res):
    return {t.device for t in (res if isinstance(res, tuple) else (res,))}


def _run_where(call):
    """``call()``'s result and the set of GPU indices its kernels ran on (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        res = call()
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
    where = {e.device_index for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA}
    return res, where


# (batch, heads, N, causal): on H100-class GPUs sageattn hands the first two to SDPA and runs the
# quantized kernel on the last (16 heads x 4096^2 is at its pair floor); elsewhere all run ours
SHAPES = [(2, 4, 300, False), (1, 4, 1000, True), (1, 16, 4096, False)]
FUNCS = public_functions() if torch.cuda.is_available() else {"sageattn": sa.sageattn}


@pytest.mark.parametrize("lse", [False, True], ids=["o", "lse"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{h}x{n}{'-causal' if c else ''}" for b, h, n, c in SHAPES])
@pytest.mark.parametrize("fn", sorted(FUNCS))
def test_every_function_runs_on_the_tensors_gpu(fn, shape, lse):
    """Each public function, with q, k, v on cuda:1: the result is on cuda:1, the bits are those
    of the call on cuda:0, the current device and its current stream are unchanged."""
    _two_gpus()
    b, h, n, causal = shape
    qkv = make_qkv(b, h, h // 2, n, n, 128, torch.bfloat16, "HND", "cpu", k_bias=1.0, seed=n)
    q0, k0, v0 = (t.to("cuda:0") for t in qkv)
    q1, k1, v1 = (t.to("cuda:1") for t in qkv)
    want = FUNCS[fn](q0, k0, v0, is_causal=causal, return_lse=lse)
    stream0 = torch.cuda.current_stream(0)
    got, where = _run_where(lambda: FUNCS[fn](q1, k1, v1, is_causal=causal, return_lse=lse))
    assert where == {1}, f"{fn} ran kernels on GPUs {sorted(where)}"
    assert torch.cuda.current_device() == 0 and torch.cuda.current_stream(0) == stream0
    assert _devices(got) == {torch.device("cuda:1")}
    assert _same(got, want), fn
    o = got[0] if lse else got
    assert_close_to_fp32(o, sdpa_fp32(q1, k1, v1, "HND", causal), cos=0.998, l1=0.06)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_side_stream_of_the_other_gpu(layout):
    """A call on cuda:1 under a side stream of cuda:1 (`with torch.cuda.stream(s)`, which also
    makes cuda:1 current while it lasts): the kernels on cuda:1, cuda:0's bits, cuda:0 current after."""
    _two_gpus()
    q, k, v = make_qkv(1, 16, 16, 4096, 4096, 64, torch.float16, layout, "cuda:1", seed=5)
    want = sa.sageattn(q.to("cuda:0"), k.to("cuda:0"), v.to("cuda:0"), tensor_layout=layout)
    s = torch.cuda.Stream(device="cuda:1")
    s.wait_stream(torch.cuda.current_stream(1))

    def call():
        with torch.cuda.stream(s):
            return sa.sageattn(q, k, v, tensor_layout=layout)

    got, where = _run_where(call)
    assert where == {1}, f"kernels ran on GPUs {sorted(where)}"
    assert torch.cuda.current_device() == 0
    assert _same(got, want)


@pytest.mark.parametrize("offsets_on", ["cpu", "cuda:1"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_on_the_other_gpu(offsets_on, causal):
    """sageattn_varlen with packed q, k, v on cuda:1 (offsets on the CPU or on cuda:1): cuda:0's
    bits, the output and LSE on cuda:1."""
    _two_gpus()
    lens = [2048, 100, 5, 1500]
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(sum(lens), h, 128, generator=g).to(torch.bfloat16) for h in (8, 2, 2))
    cu = cu_seqlens(lens)

    def call(dev, cu_dev):
        return sa.sageattn_varlen(q.to(dev), k.to(dev), v.to(dev), cu.to(cu_dev), cu.to(cu_dev), max(lens),
                                  max(lens), is_causal=causal, return_lse=True)

    want = call("cuda:0", "cpu" if offsets_on == "cpu" else "cuda:0")
    q, k, v = (t.to("cuda:1") for t in (q, k, v))  # before the profiled call: the copies run on cuda:1
    got, where = _run_where(lambda: call("cuda:1", offsets_on))
    assert where == {1}, f"kernels ran on GPUs {sorted(where)}"
    assert torch.cuda.current_device() == 0
    assert _devices(got) == {torch.device("cuda:1")}
    assert _same(got, want)


def test_compiled_on_the_other_gpu():
    """torch.compile(fullgraph=True) around sageattn, traced and run with tensors on cuda:1:
    the eager bits, on cuda:1, its kernels on cuda:1 once compiled."""
    _two_gpus()
    torch._dynamo.reset()
    compiled = torch.compile(sa.sageattn, fullgraph=True)
    for n, causal in ((300, False), (4096, True)):
        q, k, v = make_qkv(1, 16, 16, n, n, 128, torch.bfloat16, "HND", "cuda:1", k_bias=1.0, seed=n)
        compiled(q, k, v, is_causal=causal, return_lse=True)  # traced and compiled here
        got, where = _run_where(lambda: compiled(q, k, v, is_causal=causal, return_lse=True))
        assert where == {1}, f"kernels ran on GPUs {sorted(where)}"
        assert _devices(got) == {torch.device("cuda:1")}
        assert _same(got, sa.sageattn(q, k, v, is_causal=causal, return_lse=True)), (n, causal)
    assert torch.cuda.current_device() == 0


def test_cuda_graph_captured_on_the_other_gpu():
    """sageattn captured in a CUDA graph on cuda:1 (capture needs its device current), replayed
    on new inputs: eager's bits, the replay's kernels on cuda:1."""
    _two_gpus()

    def inputs(seed):
        return make_qkv(1, 16, 16, 4096, 4096, 128, torch.bfloat16, "HND", "cuda:1", k_bias=1.0, seed=seed)

    q, k, v = inputs(1)
    with torch.cuda.device(1):
        graph, o = capture(lambda *a: sa.sageattn(*a), q, k, v)
    for seed in (2, 3):
        new = inputs(seed)
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        _, where = _run_where(graph.replay)
        assert where == {1}, f"the replay ran kernels on GPUs {sorted(where)}"
        assert _same(o, sa.sageattn(*new)), f"replay with seed {seed}"


def test_two_threads_two_gpus():
    """Two host threads, one per GPU, calling sageattn over and over at once (the kernels'
    per-device caches and the dispatch's are filled concurrently): each call the bits of the same
    call made alone."""
    _two_gpus()
    shapes = [(1, 16, 4096, False), (2, 4, 300, True), (1, 16, 4096, True), (1, 8, 2000, False)]
    inputs = {dev: [make_qkv(b, h, h, n, n, 128, torch.bfloat16, "HND", dev, k_bias=1.0, seed=i)
                    for i, (b, h, n, _) in enumerate(shapes)] for dev in ("cuda:0", "cuda:1")}
    alone = [sa.sageattn(*qkv, is_causal=c).cpu() for qkv, (_, _, _, c) in zip(inputs["cuda:0"], shapes)]
    failures = []

    def worker(dev):
        try:
            for rep in range(8):
                for i, (qkv, (_, _, _, c)) in enumerate(zip(inputs[dev], shapes)):
                    o = sa.sageattn(*qkv, is_causal=c)
                    if o.device != torch.device(dev) or not torch.equal(o.cpu(), alone[i]):
                        failures.append((dev, rep, i))
        except Exception as e:  # reported below, with the thread's device
            failures.append((dev, repr(e)))

    threads = [threading.Thread(target=worker, args=(dev,)) for dev in ("cuda:0", "cuda:1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


@pytest.mark.parametrize("which", ["k", "v"])
def test_inputs_on_two_gpus_are_refused(which):
    """q on cuda:0 and k or v on cuda:1: an error naming the devices, from every function."""
    _two_gpus()
    q, k, v = make_qkv(1, 2, 2, 64, 64, 64, torch.float16, "HND", "cuda:0")
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which].to("cuda:1")
    for fn, f in FUNCS.items():
        with pytest.raises(ValueError, match="must be on one device.*cuda:0.*cuda:1"):
            f(args["q"], args["k"], args["v"])


def test_varlen_offsets_on_the_other_gpu_are_refused():
    """Offsets on cuda:1 for q on cuda:0: an error naming the argument and both devices."""
    _two_gpus()
    q = torch.randn(40, 2, 64, device="cuda:0", dtype=torch.float16)
    cu = torch.tensor([0, 17, 40], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k is on cuda:1 but q is on cuda:0"):
        sa.sageattn_varlen(q, q, q, cu, cu.to("cuda:1"), 23, 23)


def test_the_kernel_check_sees_a_launch_on_the_current_gpu():
    """The profiler check above can fail: a call with its work on cuda:1 that also launches one
    kernel on the current GPU is seen on both."""
    _two_gpus()
    x = torch.ones(4, device="cuda:1")
    res, where = _run_where(lambda: (x + 1, torch.ones(4, device="cuda:0") * 2))
    assert where == {0, 1} and res[0].device == torch.device("cuda:1")
