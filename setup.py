"""Build script: the optional CUDA extensions.

Three extensions, each compiled only for the archs its instructions exist on
(scripts/cuda_archs.py, FAMILIES):

- ``sageattention._qattn_sm80``: INT8 QK^T + fp16/bf16 PV on mma.sync (sm80 and newer);
- ``sageattention._qattn_sm89``: INT8 QK^T + fp8 PV on mma.sync (sm89 and newer; its
  fp16-accumulating fp8 MMA needs nvcc 12.8);
- ``sageattention._qattn_sm90``: INT8 QK^T + fp8 PV on wgmma with TMA, for sm_90a only (the
  Hopper kernel; arch-specific code runs on no other GPU).

Each holds the fused quantization kernels and register torch custom ops (TORCH_LIBRARY, no
pybind11), built against the Python limited API: one abi3 wheel serves every Python >= 3.10.

Environment:
  TORCH_CUDA_ARCH_LIST   archs to build, e.g. "8.0;8.6;8.9;9.0;12.0" ("+PTX" adds PTX for
                         that arch). Unset: the GPUs of this machine.
  SAGEATTN_SKIP_CUDA_BUILD=1   build nothing (the pure-Python package with the Triton kernel).
  MAX_JOBS               parallel compile jobs (ninja), NVCC_THREADS  nvcc --threads per job.
"""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import cuda_archs  # noqa: E402  (scripts/cuda_archs.py: arch parsing shared with the compile check)

PY_LIMITED = "cp310"
PY_LIMITED_HEX = "0x030A0000"


def extensions():
    if os.environ.get("SAGEATTN_SKIP_CUDA_BUILD", "0") not in ("", "0") or "sdist" in sys.argv or "egg_info" in sys.argv:
        return [], {}
    try:
        from torch.utils import cpp_extension
    except ImportError as exc:
        raise RuntimeError(
            "building the CUDA kernels needs torch in the build environment: install with "
            "`pip install --no-build-isolation ...`, or set SAGEATTN_SKIP_CUDA_BUILD=1 for the "
            "Triton-only package"
        ) from exc

    nvcc_version = cuda_archs.nvcc_version(cpp_extension.CUDA_HOME)
    archs = cuda_archs.parse(os.environ.get("TORCH_CUDA_ARCH_LIST") or cuda_archs.local_archs())
    threads = os.environ.get("NVCC_THREADS", "2")
    exts = []
    for family in cuda_archs.FAMILIES:
        family_archs = cuda_archs.for_family(family, archs, nvcc_version)
        if not family_archs:
            continue
        defines = [f"-DSAGE_EXT={family.ext}", f"-DSAGE_OPS={family.ops}"] + [f"-D{d}" for d in family.defines]
        exts.append(
            cpp_extension.CUDAExtension(
                name=f"sageattention.{family.ext}",
                sources=family.sources(),
                py_limited_api=True,
                extra_compile_args={
                    "cxx": ["-O3", f"-DPy_LIMITED_API={PY_LIMITED_HEX}"] + defines,
                    "nvcc": ["-O3", "-lineinfo", f"--threads={threads}"]
                    + defines
                    + family.gencode(family_archs),
                },
            )
        )
    cmdclass = {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}
    return exts, cmdclass


ext_modules, cmdclass = extensions()
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": PY_LIMITED}} if ext_modules else {},
)
