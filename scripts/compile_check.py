"""Compile every kernel translation unit for every arch its extension is built for, with
nvcc alone: no torch, no GPU. The CI runs it; a kernel that does not build for an arch
fails here rather than in a wheel build.

    python scripts/compile_check.py                 # all supported archs
    python scripts/compile_check.py --archs "9.0"   # a subset
    python scripts/compile_check.py --jobs 2 --report regs.txt

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
    args = ap.parse_args(argv)
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
