"""Which CUDA archs each extension is built for, and the nvcc flags for them.

Shared by setup.py and the nvcc-only compile check (scripts/compile_check.py), so both
build exactly the same translation units for the same archs. Needs no torch.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = "csrc/kernels"

# arch -> lowest nvcc (major, minor) that builds our code for it
SUPPORTED: Dict[str, Tuple[int, int]] = {
    "8.0": (11, 8),
    "8.6": (11, 8),
    "8.7": (11, 8),
    "8.9": (11, 8),
    "9.0": (12, 0),
    "10.0": (12, 8),
    "12.0": (12, 8),
    "12.1": (12, 9),
}


@dataclass(frozen=True)
class Arch:
    version: str  # "8.9"
    ptx: bool = False  # "+PTX": also embed PTX for this arch

    @property
    def sm(self) -> str:
        return self.version.replace(".", "")

    def __str__(self) -> str:
        return self.version + ("+PTX" if self.ptx else "")


@dataclass(frozen=True)
class Family:
    ext: str  # extension module name inside the package
    ops: str  # torch op namespace
    min_arch: Tuple[int, int]
    min_nvcc: Tuple[int, int]  # the family's instructions need at least this nvcc
    kernel_files: Tuple[str, ...]
    defines: Tuple[str, ...]
    why: str
    max_arch: Optional[Tuple[int, int]] = None  # arch-specific code: built for no newer arch
    arch_suffix: str = ""  # "a": the arch-specific target (sm_90a), which wgmma/setmaxnreg need
    package: str = "sageattention"  # the Python package the extension module lives in
    binding: str = "csrc/binding/ops.cpp"

    @property
    def module(self) -> str:
        return f"{self.package}.{self.ext}"

    @property
    def build_key(self) -> str:
        """Its key in the build info (sageattention/_build_info.py): the bare name inside
        sageattention, the dotted module path for another package."""
        return self.ext if self.package == "sageattention" else self.module

    def gencode(self, archs: Sequence["Arch"]) -> List[str]:
        return gencode_flags(archs, self.arch_suffix)

    def sources(self, with_binding: bool = True) -> List[str]:
        files = [f"{KERNELS}/{f}" for f in self.kernel_files]
        return ([self.binding] if with_binding else []) + files


FAMILIES: Tuple[Family, ...] = (
    Family(
        ext="_qattn_sm80",
        ops="sageattention_sm80",
        min_arch=(8, 0),
        min_nvcc=(11, 8),
        kernel_files=("quant_int8.cu", "attn_dispatch.cu", "attn_fp16_d64.cu", "attn_fp16_d128.cu", "attn_fp16_d256.cu"),
        defines=("SAGE_FP16_PV",),
        why="INT8 QK^T and fp16/bf16 PV on mma.sync",
    ),
    Family(
        ext="_qattn_sm89",
        ops="sageattention_sm89",
        min_arch=(8, 9),
        min_nvcc=(12, 8),
        kernel_files=("quant_int8.cu", "quant_fp8.cu", "quant_qkv.cu", "attn_dispatch.cu", "attn_fp8_d64.cu", "attn_fp8_d128.cu",
                      "attn_fp8_d256.cu"),
        defines=("SAGE_FP8",),
        why="the fp16-accumulating fp8 MMA (mma.sync ... f16.e4m3.e4m3.f16) is PTX ISA 8.7, nvcc 12.8",
    ),
    Family(
        ext="_qattn_sm90",
        ops="sageattention_sm90",
        min_arch=(9, 0),
        min_nvcc=(12, 0),
        kernel_files=("quant_int8.cu", "quant_fp8.cu", "quant_qkv.cu", "attn_sm90_host.cu", "attn_sm90_d64.cu",
                      "attn_sm90_d96.cu", "attn_sm90_d128.cu", "attn_sm90_d192.cu", "attn_sm90_d256.cu"),
        defines=("SAGE_FP8", "SAGE_SM90"),
        why="wgmma with fp8 operands and TMA for sm_90a",
        max_arch=(9, 0),
        arch_suffix="a",
    ),
    # sageattention3_blackwell (FP4 microscaling attention): built into the same wheel when the
    # nvcc has the Blackwell instructions (12.8) and the arch list holds 10.0 or 12.x
    Family(
        ext="_fp4_quant",
        ops="sageattn3_fp4",
        min_arch=(8, 0),
        min_nvcc=(12, 8),
        kernel_files=("quant_fp4.cu",),
        defines=("SAGE_FP4_QUANT",),
        why="FP4 quantization for the Blackwell kernels (plain arithmetic: it runs, and is tested, on any GPU)",
        package="sageattention3_blackwell",
        binding="csrc/binding/ops_fp4.cpp",
    ),
    Family(
        ext="_fp4_sm100",
        ops="sageattn3_sm100",
        min_arch=(10, 0),
        min_nvcc=(12, 8),
        kernel_files=("attn_fp4_sm100.cu",),
        defines=("SAGE_FP4_SM100",),
        why="tcgen05 block-scaled FP4 MMA and tensor memory of sm_100a, PTX ISA 8.7 (nvcc 12.8)",
        max_arch=(10, 0),
        arch_suffix="a",
        package="sageattention3_blackwell",
        binding="csrc/binding/ops_fp4.cpp",
    ),
    Family(
        ext="_fp4_sm120",
        ops="sageattn3_sm120",
        min_arch=(12, 0),
        min_nvcc=(12, 8),
        kernel_files=("attn_fp4_sm120.cu",),
        defines=("SAGE_FP4_SM120",),
        why="warp-level block-scaled FP4 MMA (mma.sync kind::mxf4nvf4) of sm_120a, PTX ISA 8.7 (nvcc 12.8)",
        max_arch=(12, 1),
        arch_suffix="a",
        package="sageattention3_blackwell",
        binding="csrc/binding/ops_fp4.cpp",
    ),
)


class ArchError(ValueError):
    pass


def parse(spec: str) -> List[Arch]:
    """Parse a TORCH_CUDA_ARCH_LIST value ("8.0;8.6 9.0+PTX", "sm_90a", "89")."""
    out: Dict[str, Arch] = {}
    for item in re.split(r"[;,\s]+", spec.strip()):
        if not item:
            continue
        ptx = item.upper().endswith("+PTX")
        core = item[:-4] if ptx else item
        core = re.sub(r"^(sm_|compute_)", "", core).rstrip("af")
        if re.fullmatch(r"\d{2,3}", core):
            core = f"{core[:-1]}.{core[-1]}"
        if core not in SUPPORTED:
            raise ArchError(
                f"TORCH_CUDA_ARCH_LIST: arch {item!r} is not supported; supported: {', '.join(SUPPORTED)}"
            )
        prev = out.get(core)
        out[core] = Arch(core, ptx or (prev.ptx if prev else False))
    if not out:
        raise ArchError("TORCH_CUDA_ARCH_LIST names no arch; e.g. TORCH_CUDA_ARCH_LIST='8.0;8.6;8.9;9.0;12.0'")
    return sorted(out.values(), key=lambda a: tuple(int(x) for x in a.version.split(".")))


def _key(version: str) -> Tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def for_family(family: Family, archs: Sequence[Arch], nvcc: Tuple[int, int]) -> List[Arch]:
    """The archs of ``archs`` that ``family`` is built for; raises if nvcc cannot build one.

    A family whose instructions this nvcc lacks altogether (``skip_reason``) gets no arch: the
    extension is not built, the build says so, the build info and `python -m sageattention`
    show it, and dispatch never offers its kernels."""
    if skip_reason(family, nvcc):
        return []
    chosen = [a for a in archs if _key(a.version) >= family.min_arch
              and (family.max_arch is None or _key(a.version) <= family.max_arch)]
    for a in chosen:
        need = SUPPORTED[a.version]
        if nvcc < need:
            raise ArchError(
                f"nvcc {nvcc[0]}.{nvcc[1]} cannot build sm_{a.sm} (it needs nvcc >= {need[0]}.{need[1]}). "
                "Use a newer CUDA toolkit or drop the arch from TORCH_CUDA_ARCH_LIST"
            )
    return chosen


def skip_reason(family: Family, nvcc: Tuple[int, int]) -> Optional[str]:
    if nvcc < family.min_nvcc:
        return (f"{family.ext} not built: it needs nvcc >= {family.min_nvcc[0]}.{family.min_nvcc[1]} "
                f"({family.why}); this nvcc is {nvcc[0]}.{nvcc[1]}")
    return None


def gencode_flags(archs: Sequence[Arch], suffix: str = "") -> List[str]:
    """nvcc flags for ``archs``; suffix "a" targets the arch-specific variant (sm_90a)."""
    flags = []
    for a in archs:
        sm = a.sm + suffix
        flags.append(f"-gencode=arch=compute_{sm},code=sm_{sm}")
        if a.ptx:
            flags.append(f"-gencode=arch=compute_{sm},code=compute_{sm}")
    return flags


def nvcc_version(cuda_home: Optional[str] = None) -> Tuple[int, int]:
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else "nvcc"
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ArchError(f"cannot run {nvcc} --version: {exc}") from exc
    m = re.search(r"release (\d+)\.(\d+)", text)
    if not m:
        raise ArchError(f"cannot read the nvcc version from: {text!r}")
    return int(m.group(1)), int(m.group(2))


def local_archs() -> str:
    """The archs of this machine's GPUs, for a build without TORCH_CUDA_ARCH_LIST."""
    import torch

    if not torch.cuda.is_available():
        raise ArchError(
            "no GPU here and TORCH_CUDA_ARCH_LIST is not set: set it to the archs to build, e.g. "
            "TORCH_CUDA_ARCH_LIST='8.0;8.6;8.9;9.0;12.0', or set SAGEATTN_SKIP_CUDA_BUILD=1 for the "
            "Triton-only package"
        )
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return ";".join(f"{a}.{b}" for a, b in sorted(caps))
