"""Local-memory traffic inside the Hopper kernel's key loop, per instance, from SASS (no GPU).

ptxas's "bytes spill" counts a kernel's spills wherever they are; what costs is a spill inside
the key loop, run once per key tile. This compiles one instantiation file for sm_90a, splits the
SASS by function, takes each function's innermost backward branch whose body issues wgmma
(HGMMA/IGMMA/QGMMA), and counts the instructions of that body and its local loads and stores.

    python bench/loop_spill.py csrc/kernels/attn_sm90_d128.cu [more .cu] [-D NAME=VALUE ...]

Prints one line per kernel: template arguments, instructions per loop body, LDL, STL.
(bench/NOTES.md, "K scales in the turn", used it: 15 local instructions per key tile to none.)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

GEMM = re.compile(r"\b[HIQ]GMMA\b")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


def sass_of(src: str, defines: list[str], nvcc: str = "nvcc") -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        cmd = [nvcc, "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-DSAGE_SM90", "-DSAGE_FP8",
               f"-I{os.path.dirname(os.path.abspath(src))}", "-o", cubin, src] + [f"-D{d}" for d in defines]
        subprocess.run(cmd, check=True)
        return subprocess.run(["cuobjdump", "-sass", cubin], check=True, capture_output=True, text=True).stdout


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """{mangled name: [(address, instruction text)]}."""
    out: dict[str, list[tuple[int, str]]] = {}
    name = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        m = INSN.search(line)
        if m and name:
            out[name].append((int(m.group(1), 16), m.group(2)))
    return out


def key_loop(insns: list[tuple[int, str]]) -> tuple[int, int, int] | None:
    """(instructions, LDL, STL) of the smallest loop body (a backward branch's range) that
    issues wgmma, or None."""
    best = None
    for addr, text in insns:
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [t for a, t in insns if target <= a <= addr]
        if not any(GEMM.search(t) for t in body):
            continue
        if best is None or len(body) < len(best):
            best = body
    if best is None:
        return None
    return len(best), sum(t.startswith("LDL") or " LDL" in t for t in best), sum(t.startswith("STL") or " STL" in t for t in best)


def demangled_args(name: str) -> str:
    m = re.search(r"attn_sm90_kernelI(.*)EEvN", name)
    if not m:
        return name
    args = m.group(1).replace("13__nv_bfloat16", "bf16,").replace("6__half", "fp16,")
    args = re.sub(r"Li(\d+)E", r"\1,", args).replace("Lb0E", "0,").replace("Lb1E", "1,")
    return "<" + args.rstrip(",") + ">"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="+")
    ap.add_argument("-D", dest="defines", action="append", default=[])
    args = ap.parse_args(argv)
    print("kernel <D, NC, out, CL, VX, VL, DA>\tinstructions per key tile\tLDL\tSTL")
    for src in args.sources:
        for name, insns in functions(sass_of(src, args.defines)).items():
            loop = key_loop(insns)
            if loop is not None:
                print(f"{demangled_args(name)}\t{loop[0]}\t{loop[1]}\t{loop[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
