"""Compile every kernel translation unit for every arch its extension is built for, with
nvcc alone: no torch, no GPU. The CI runs it; a kernel that does not build for an arch
fails here rather than in a wheel build. Then check that each extension's torch binding
(csrc/binding/*.cpp, with its family's defines) compiles: the host compiler's syntax check
against the installed torch's headers (a CPU build of torch will do: the one header its CUDA
builds generate and it lacks is written to a temporary directory) and the CUDA toolkit's, with
warnings in our code as errors.

    python scripts/compile_check.py                 # all supported archs, then the bindings
    python scripts/compile_check.py --archs "9.0"   # a subset
    python scripts/compile_check.py --jobs 2 --report regs.txt
    python scripts/compile_check.py --bindings-only # the bindings alone

Prints registers and spills per kernel for each (file, arch) from ptxas.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_archs  # noqa: E402
import matrix  # noqa: E402

ALL_ARCHS = "8.0;8.6;8.9;9.0;10.0;12.0;12.1"


def jobs_for(archs, nvcc):
    """(family, file, arch) for every kernel file of every family x arch it is built for."""
    out = []
    for fam in cuda_archs.FAMILIES:
        for arch in cuda_archs.for_family(fam, archs, nvcc):
            for src in fam.sources(with_binding=False):
                out.append((fam, src, arch))
    return out


def compile_one(fam, src, arch, outdir, nvcc="nvcc"):
    obj = os.path.join(outdir, f"{fam.ext}-{os.path.basename(src)}-sm{arch.sm}.o")
    cmd = [nvcc, "-c", "-O3", "-std=c++17", "-Xptxas=-v", "-o", obj, os.path.join(cuda_archs.ROOT, src)]
    cmd += [f"-D{d}" for d in fam.defines] + fam.gencode([arch])
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr, time.time() - t0, " ".join(cmd)


def binding_jobs():
    """(family, its -D flags) for every extension: each binding file is built once per family
    that uses it, with that family's defines."""
    return [(fam, [f"-DSAGE_EXT={fam.ext}", f"-DSAGE_OPS={fam.ops}"] + [f"-D{d}" for d in fam.defines])
            for fam in cuda_archs.FAMILIES]


def cuda_include(nvcc="nvcc"):
    """The CUDA toolkit's include directory (the one holding cuda_runtime.h), or None."""
    import shutil

    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    found = shutil.which(nvcc)
    if found:
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(found))))
    for home in filter(None, homes):
        if os.path.isfile(os.path.join(home, "include", "cuda_runtime.h")):
            return os.path.join(home, "include")
    return None


def binding_flags(tmp: str, nvcc="nvcc"):
    """Include flags for a binding: torch's headers, the CUDA toolkit's and Python's as system
    headers (their warnings are not ours); the generated c10/cuda/impl/cuda_cmake_macros.h that
    a CPU build of torch does not ship, written under `tmp` when missing."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    dirs = list(include_paths())
    if not os.path.isfile(os.path.join(dirs[0], "c10", "cuda", "impl", "cuda_cmake_macros.h")):
        stub = os.path.join(tmp, "c10", "cuda", "impl")
        os.makedirs(stub, exist_ok=True)
        with open(os.path.join(stub, "cuda_cmake_macros.h"), "w") as fh:
            fh.write("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")  # what torch's CUDA wheels define
        dirs.append(tmp)
    cuda = cuda_include(nvcc)
    if cuda is None:
        raise RuntimeError("no CUDA toolkit include directory (cuda_runtime.h) found: set CUDA_HOME")
    dirs += [cuda, sysconfig.get_paths()["include"]]
    return [f for d in dirs for f in ("-isystem", d)]


def check_binding(fam, defines, flags, cxx="c++"):
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
           f"-DPy_LIMITED_API={matrix.LIMITED_API}"] + defines + flags + [os.path.join(cuda_archs.ROOT, fam.binding)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr, time.time() - t0, " ".join(cmd)


def summarize(log: str):
    """(kernel, registers, spill bytes) from ptxas -v output."""
    rows, name = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and name:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            rows.append((name, int(m.group(1)), spill))
            name = None
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default=ALL_ARCHS, help=f"TORCH_CUDA_ARCH_LIST-style list (default {ALL_ARCHS})")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--report", help="write the per-kernel register/spill table here")
    ap.add_argument("--bindings-only", action="store_true", help="only the torch bindings' syntax check")
    ap.add_argument("--cxx", default="c++", help="host C++ compiler for the bindings (default c++)")
    args = ap.parse_args(argv)
    if args.bindings_only:
        return check_bindings(args.jobs, args.nvcc, args.cxx)
    nvcc = cuda_archs.nvcc_version(os.path.dirname(os.path.dirname(args.nvcc)) if os.sep in args.nvcc else None)
    archs = cuda_archs.parse(args.archs)
    work = jobs_for(archs, nvcc)
    print(f"nvcc {nvcc[0]}.{nvcc[1]}: {len(work)} compiles ({', '.join(map(str, archs))}), {args.jobs} jobs", flush=True)
    failed, table = 0, []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, cf.ThreadPoolExecutor(args.jobs) as pool:
        futs = {pool.submit(compile_one, f, s, a, tmp, args.nvcc): (f, s, a) for f, s, a in work}
        for fut in cf.as_completed(futs):
            fam, src, arch = futs[fut]
            rc, log, secs, cmd = fut.result()
            rows = summarize(log)
            spills = sum(1 for r in rows if r[2])
            status = "ok" if rc == 0 else "FAILED"
            print(f"{status:6} {fam.ext:12} sm_{arch.sm:4} {os.path.basename(src):20} {secs:6.1f}s "
                  f"{len(rows)} kernels, max {max((r[1] for r in rows), default=0)} regs, {spills} spilling", flush=True)
            table += [(fam.ext, arch.sm, os.path.basename(src)) + r for r in rows]
            if rc:
                failed += 1
                print(cmd + "\n" + log, flush=True)
    print(f"{len(work) - failed}/{len(work)} compiled in {time.time() - t0:.0f}s")
    if args.report:
        with open(args.report, "w") as fh:
            for row in sorted(table):
                fh.write("\t".join(map(str, row)) + "\n")
    return 1 if (check_bindings(args.jobs, args.nvcc, args.cxx) or failed) else 0


def check_bindings(jobs: int, nvcc: str = "nvcc", cxx: str = "c++") -> int:
    """The syntax check of every extension's binding; returns the number that failed."""
    failed = 0
    with tempfile.TemporaryDirectory() as tmp, cf.ThreadPoolExecutor(jobs) as pool:
        flags = binding_flags(tmp, nvcc)
        futs = {pool.submit(check_binding, fam, defs, flags, cxx): fam for fam, defs in binding_jobs()}
        for fut in cf.as_completed(futs):
            fam = futs[fut]
            rc, log, secs, cmd = fut.result()
            print(f"{'ok' if rc == 0 else 'FAILED':6} {fam.ext:12} binding {os.path.basename(fam.binding):12} "
                  f"{secs:6.1f}s", flush=True)
            if rc:
                failed += 1
                print(cmd + "\n" + log, flush=True)
    print(f"{len(futs) - failed}/{len(futs)} bindings compile")
    return failed


if __name__ == "__main__":
    sys.exit(main())
