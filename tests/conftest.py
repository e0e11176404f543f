"""Test set-up: GPU tests are marked ``gpu`` and skipped with a reason when no GPU is visible.

Without a GPU, the Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set
here before anything imports them), so kernel tests still run on the CPU, on small shapes.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


BLACKWELL = ((10, 0), (12, 0), (12, 1))  # the archs of sageattention3_blackwell's kernels


def _blackwell_skip_reason():
    if not HAS_CUDA:
        return "Blackwell kernel test: no CUDA GPU visible on this machine"
    cap = torch.cuda.get_device_capability()
    if cap not in BLACKWELL:
        return (f"Blackwell kernel test: needs sm_100/sm_120/sm_121, this GPU ({torch.cuda.get_device_name()}) "
                f"is sm_{cap[0]}{cap[1]}")
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with a reason without one)")
    config.addinivalue_line("markers", "blackwell: needs a Blackwell GPU (skipped with a reason without one)")
    # checked here as well as where the tests are split: under xdist the split runs in the workers,
    # where a usage error is reported as a worker crash (an INTERNALERROR) instead of its message
    _shard_spec(config)
    if not HAS_CUDA:  # the kernel tests run in Triton's interpreter: say at once if it cannot run here
        try:
            from sageattention._checks import installed_interpreter_problem
        except Exception:  # the tests that import the package say why
            return
        problem = installed_interpreter_problem()
        if problem:
            raise pytest.UsageError(f"without a GPU the kernel tests run in Triton's CPU interpreter: {problem}")


def _what_runs():
    """What this run can test: on a GPU whose CUDA kernels were not built the suite still passes,
    on Triton alone, with the kernel tests skipped (each with its reason)."""
    if not HAS_CUDA:
        return ["sageattention: no CUDA GPU; GPU tests skip, Triton kernels run in its CPU interpreter"]
    try:
        from sageattention import dispatch

        cap = torch.cuda.get_device_capability()
        states = dispatch.report(torch.device("cuda"))
    except Exception as exc:  # the tests that import the package say the rest
        return [f"sageattention: backends not known ({type(exc).__name__}: {exc})"]
    ready = [name for name, state in states.items() if state == "available"]
    return ([f"sageattention: {torch.cuda.get_device_name()} (sm{cap[0]}{cap[1]}), "
             f"backends available: {', '.join(ready) or 'none'}"]
            + [f"  {name}: {state}" for name, state in states.items() if state != "available"])


def pytest_report_header(config):
    return _what_runs()


def pytest_terminal_summary(terminalreporter):
    """Again at the end, where ``-q`` runs (which print no header) show it."""
    if terminalreporter.verbosity < 0:
        for line in _what_runs():
            terminalreporter.write_line(line)


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only the I-th of N interleaved parts of the collected tests (0 <= I < N), so that "
                          "a suite longer than one device call runs in N calls; the parts together are the suite")


def _shard_spec(config):
    """``--shard``'s (I, N), or None without it; a bad spec is a usage error."""
    spec = config.getoption("--shard")
    if spec is None:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise pytest.UsageError(f"--shard must be I/N with 0 <= I < N, got {spec!r}")
    return i, n


def _shard(config, items):
    spec = _shard_spec(config)
    if spec is None:
        return
    i, n = spec
    keep, drop = [], []
    for j, item in enumerate(items):
        (keep if j % n == i else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    _shard(config, items)
    skip_gpu = None if HAS_CUDA else pytest.mark.skip(reason="GPU test: no CUDA GPU visible on this machine")
    why = _blackwell_skip_reason()
    skip_bw = pytest.mark.skip(reason=why) if why else None
    for item in items:
        if skip_bw and "blackwell" in item.keywords:
            item.add_marker(skip_bw)
        elif skip_gpu and "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    """Where kernel tests run: the GPU, else the CPU through Triton's interpreter."""
    return torch.device("cuda") if HAS_CUDA else torch.device("cpu")


@pytest.fixture(autouse=True)
def _give_back_cached_gpu_memory():
    """Under pytest-xdist every worker's caching allocator keeps what its largest test
    reserved, so workers that once ran a big test starve the others (14 workers on an H100:
    4.4-9.7 GiB each, CUDA out of memory in the >2^31-element and varlen tests). A test that
    leaves more than 2 GiB reserved gives it back."""
    yield
    if HAS_CUDA and torch.cuda.is_initialized() and torch.cuda.memory_reserved() > (2 << 30):
        torch.cuda.empty_cache()
