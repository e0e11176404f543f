"""Build script: the optional CUDA extensions.

Six extensions, each compiled only for the archs its instructions exist on
(scripts/cuda_archs.py, FAMILIES):

- ``sageattention._qattn_sm80``: INT8 QK^T + fp16/bf16 PV on mma.sync (sm80 and newer);
- ``sageattention._qattn_sm89``: INT8 QK^T + fp8 PV on mma.sync (sm89 and newer; its
  fp16-accumulating fp8 MMA needs nvcc 12.8);
- ``sageattention._qattn_sm90``: INT8 QK^T + fp8 PV on wgmma with TMA, for sm_90a only (the
  Hopper kernel; arch-specific code runs on no other GPU);
- ``sageattention3_blackwell._fp4_quant`` (every arch), ``._fp4_sm100`` (sm_100a) and
  ``._fp4_sm120`` (sm_120a, sm_121a): the FP4 microscaling attention of the second package in
  this wheel, built when nvcc >= 12.8.

Each holds the fused quantization kernels and register torch custom ops (TORCH_LIBRARY, no
pybind11), built against the Python limited API: one abi3 wheel serves every Python from the
oldest its torch supports (torch's Requires-Python, at least 3.10): cp310-abi3, or cp311-abi3
for torch 2.15.

With the kernels, the wheel requires the torch minor it was built against
(``Requires-Dist: torch==X.Y.*``) and carries ``sageattention/_build_info.py`` (torch, CUDA,
archs, commit, date), which the package checks at import time.

Environment:
  TORCH_CUDA_ARCH_LIST   archs to build, e.g. "8.0;8.6;8.9;9.0;12.0" ("+PTX" adds PTX for
                         that arch). Unset: the GPUs of this machine (inside cibuildwheel:
                         the matrix row's list, cibuildwheel.toml).
  SAGEATTN_SKIP_CUDA_BUILD=1   build nothing (the pure-Python package with the Triton kernel).
  MAX_JOBS, NVCC_THREADS parallel compile jobs (ninja) and nvcc --threads per job; unset:
                         sized to the cores and memory (scripts/build_env.py).
  SAGEATTN_COMPILER_CACHE  auto (default: sccache when on the PATH) | sccache | off.
  SAGEATTN_COMMIT, SAGEATTN_INDEX_URL  recorded in the build info (default: git HEAD; none).
"""

import datetime
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "scripts"))
import build_env  # noqa: E402  (scripts/build_env.py: CUDA_HOME, archs, jobs, sccache)
import cuda_archs  # noqa: E402  (scripts/cuda_archs.py: arch parsing shared with the compile check)
import matrix  # noqa: E402  (scripts/matrix.py: the matrix row, and the wheel's Python tag)
import setuptools  # noqa: E402

_SETUPTOOLS_ERROR = build_env.setuptools_error(setuptools.__version__)
if _SETUPTOOLS_ERROR:  # before setup() reads pyproject.toml
    raise RuntimeError(_SETUPTOOLS_ERROR)


RUNTIME_DEPS = [
    "triton>=3.0; sys_platform == 'linux'",
    "triton-windows>=3.2; sys_platform == 'win32'",
]


def extensions():
    """(ext_modules, build info) for the CUDA extensions; ([], None) for the Triton-only package."""
    if os.environ.get("SAGEATTN_SKIP_CUDA_BUILD", "0") not in ("", "0") or "sdist" in sys.argv or "egg_info" in sys.argv:
        return [], None
    build_env.configure()  # before cpp_extension reads CUDA_HOME / PYTORCH_NVCC / CXX
    try:
        from torch.utils import cpp_extension
    except ImportError as exc:
        raise RuntimeError(
            "building the CUDA kernels needs torch in the build environment: install with "
            "`pip install --no-build-isolation ...`, or set SAGEATTN_SKIP_CUDA_BUILD=1 for the "
            "Triton-only package"
        ) from exc

    import torch

    nvcc_version = cuda_archs.nvcc_version(cpp_extension.CUDA_HOME)
    abi3 = matrix.abi3_python(torch_requires_python())
    if os.environ.get("CIBUILDWHEEL") == "1":
        check_row(torch, nvcc_version, abi3)
    archs = cuda_archs.parse(os.environ.get("TORCH_CUDA_ARCH_LIST") or cuda_archs.local_archs())
    threads = os.environ.get("NVCC_THREADS", "2")
    exts, built = [], {}
    for family in cuda_archs.FAMILIES:
        family_archs = cuda_archs.for_family(family, archs, nvcc_version)
        if cuda_archs.skip_reason(family, nvcc_version):
            print(f"sageattention build: {cuda_archs.skip_reason(family, nvcc_version)}", file=sys.stderr)
        if not family_archs:
            continue
        defines = [f"-DSAGE_EXT={family.ext}", f"-DSAGE_OPS={family.ops}"] + [f"-D{d}" for d in family.defines]
        exts.append(
            cpp_extension.CUDAExtension(
                name=family.module,
                sources=family.sources(),
                py_limited_api=True,
                extra_compile_args={
                    # the API level stays at our floor (3.10), the value torch's cpp_extension
                    # also defines (a second value would only warn, and lose); the wheel's tag
                    # may name a later Python (abi3 above)
                    "cxx": ["-O3", f"-DPy_LIMITED_API={matrix.LIMITED_API}"] + defines,
                    "nvcc": ["-O3", "-lineinfo", f"--threads={threads}"]
                    + defines
                    + family.gencode(family_archs),
                },
            )
        )
        built[family.build_key] = [f"sm_{a.sm}{family.arch_suffix}" + ("+PTX" if a.ptx else "") for a in family_archs]
    info = {
        "torch": torch.__version__.split("+")[0],
        "cuda": torch.version.cuda,
        "nvcc": "%d.%d" % nvcc_version,
        "abi3": abi3,
        "archs": built,
    }
    return exts, info


def torch_requires_python():
    """The Requires-Python of the installed torch distribution ('>=3.10'); None for a torch
    without metadata (a source checkout), which gives the project's own floor."""
    from importlib import metadata

    try:
        return metadata.metadata("torch").get("Requires-Python")
    except metadata.PackageNotFoundError:
        return None


def check_row(torch, nvcc_version, abi3):
    """Inside cibuildwheel: the torch and nvcc of this env must be the matrix row's, and the
    oldest Python this torch supports the first of the row's Python range."""
    row = matrix.current_row()
    differs = row.env_mismatch(torch.__version__, torch.version.cuda, "%d.%d" % nvcc_version)
    if differs:
        raise RuntimeError(
            f"build env does not match matrix row {row.id}: it has {differs}. "
            "Run scripts/setup_torch.py and scripts/setup_cuda.py for the row"
        )
    if abi3 != row.abi3_python:
        raise RuntimeError(
            f"torch {torch.__version__} supports Python {abi3} and newer (its Requires-Python: "
            f"{torch_requires_python()!r}), but matrix row {row.id} starts at Python {row.abi3_python}: "
            f"fix the python range of [torch.\"{row.torch}\"] in cibuildwheel.toml"
        )


def git_commit():
    if os.environ.get("SAGEATTN_COMMIT"):
        return os.environ["SAGEATTN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def build_date():
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch else \
        datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def build_info_command(info):
    """build_py that also writes sageattention/_build_info.py (read by sageattention._build)."""

    class BuildPyWithInfo(build_py):
        def run(self):
            super().run()
            if self.dry_run:
                return
            data = dict(info or {"torch": None, "cuda": None, "nvcc": None, "archs": {}})
            data.update(commit=git_commit(), date=build_date(), index_url=os.environ.get("SAGEATTN_INDEX_URL"))
            path = os.path.join(self.build_lib, "sageattention", "_build_info.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write('"""Written by setup.py when this wheel was built; read by sageattention._build."""\n\n')
                f.write(f"BUILD = {data!r}\n")

    return BuildPyWithInfo


ext_modules, info = extensions()
cmdclass = {"build_py": build_info_command(info)}
if ext_modules:
    from torch.utils import cpp_extension

    class BuildExtensionChecked(cpp_extension.BuildExtension.with_options(use_ninja=True)):
        """torch's BuildExtension, then a check of how each extension links libstdc++."""

        def build_extension(self, ext):
            super().build_extension(ext)
            if sys.platform.startswith("linux"):
                if not build_env.readelf_available():
                    if not getattr(self, "_warned_readelf", False):
                        self._warned_readelf = True
                        print("warning: readelf not found (binutils): the check that each extension links the "
                              "shared libstdc++ is skipped", file=sys.stderr)
                    return
                path = self.get_ext_fullpath(ext.name)
                error = build_env.static_libstdcxx_error(path)
                if error:
                    os.remove(path)  # not left "up to date": the next build links it again
                    raise RuntimeError(error)

    cmdclass["build_ext"] = BuildExtensionChecked
    major, minor = info["torch"].split(".")[:2]
    requires = [f"torch=={major}.{minor}.*"] + RUNTIME_DEPS  # the C++ ABI ties a build to one torch minor
else:
    requires = ["torch>=2.4"] + RUNTIME_DEPS
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    install_requires=requires,
    options={"bdist_wheel": {"py_limited_api": matrix.python_tag(info["abi3"])}} if ext_modules else {},
)
