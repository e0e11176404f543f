"""What this installation was built with, and the import-time torch/CUDA check.

A wheel with the CUDA kernels carries ``_build_info.py`` (written by setup.py): the torch and
CUDA it was compiled against, the archs of each extension, the commit and the date. Its
kernels link torch's C++ ABI, which changes with every torch minor, and CUDA's runtime of one
major version: under another torch they fail with "undefined symbol" or "DLL load failed".
``check()`` turns that into a message naming what is installed, what the wheel needs and
which wheel to get. A source checkout or the Triton-only package has no kernels to check.
"""

from __future__ import annotations

import re
from typing import Optional

# this module imports nothing but the standard library at the top (torch only inside check()),
# so the build scripts can load it from the source tree before torch is installed

try:
    from ._build_info import BUILD
except ImportError:  # a source checkout / editable install: nothing was compiled into a wheel
    BUILD = None

DEFAULT_INDEX = "<the index your wheel came from>"


class BuildMismatchError(ImportError):
    pass


def _minor(version: str) -> str:
    m = re.match(r"^(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else str(version)


def has_kernels(build: Optional[dict] = BUILD) -> bool:
    return bool(build and build.get("archs"))


def variant(torch_version: str, cuda_version: Optional[str]) -> str:
    """The wheel index folder (and build matrix row id) for a torch and a CUDA:
    2.11.0+cu130 and 13.0 give 'torch2.11-cu130'. The one definition: scripts/matrix.py and
    scripts/make_index.py load this file for it."""
    if not cuda_version:
        return f"torch{_minor(torch_version)}-cpu"
    major, minor = _minor(cuda_version).split(".")
    return f"torch{_minor(torch_version)}-cu{major}{minor}"


def mismatch(torch_version: str, torch_cuda: Optional[str], build: Optional[dict] = BUILD) -> Optional[str]:
    """None when the installed torch can load this wheel's kernels, else the message."""
    if not has_kernels(build):
        return None
    want_torch, want_cuda = build["torch"], build["cuda"]
    torch_ok = _minor(torch_version) == _minor(want_torch)
    cuda_ok = bool(torch_cuda) and torch_cuda.split(".")[0] == want_cuda.split(".")[0]
    if torch_ok and cuda_ok:
        return None
    have = f"torch {torch_version} " + (f"with CUDA {torch_cuda}" if torch_cuda else "without CUDA (a CPU-only build)")
    need = variant(torch_version, torch_cuda)
    index = (build.get("index_url") or DEFAULT_INDEX).rstrip("/")
    lines = [
        f"this sageattention wheel was built for torch {_minor(want_torch)}.* with CUDA {want_cuda}, "
        f"but this environment has {have}.",
        "Its compiled kernels cannot load against this torch (they would fail with 'undefined symbol' "
        "or 'DLL load failed').",
    ]
    if torch_cuda:
        lines.append(f"Install the wheel built for your torch ({need}):\n"
                     f"    pip install --force-reinstall --no-deps sageattention --extra-index-url {index}/{need}/")
        lines.append("or install the torch this wheel was built for: "
                     f"pip install 'torch=={_minor(want_torch)}.*' (CUDA {want_cuda} build).")
    else:
        lines.append(f"Install a CUDA build of torch {_minor(want_torch)} (CUDA {want_cuda}), e.g. "
                     f"pip install 'torch=={_minor(want_torch)}.*' --index-url "
                     f"https://download.pytorch.org/whl/cu{want_cuda.replace('.', '')}")
    return "\n".join(lines)


def check() -> None:
    """Raise BuildMismatchError (an ImportError) when the installed torch cannot load our kernels."""
    if not has_kernels():
        return
    import torch

    msg = mismatch(torch.__version__, torch.version.cuda)
    if msg:
        raise BuildMismatchError(msg)


def describe(build: Optional[dict] = BUILD) -> str:
    """Lines for `python -m sageattention`."""
    if build is None:
        return "build         source checkout (no build info; kernels built in place, if any)"
    if not has_kernels(build):
        return f"build         Triton-only package (no CUDA kernels compiled), commit {build.get('commit') or '?'}"
    out = [f"build         torch {build['torch']}, CUDA {build['cuda']} (nvcc {build.get('nvcc')}), "
           f"commit {(build.get('commit') or '?')[:12]}, {build.get('date')}"]
    for ext, archs in sorted(build["archs"].items()):
        out.append(f"  {ext:<12} compiled for {' '.join(archs)}")
    return "\n".join(out)
