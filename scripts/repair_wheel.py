"""cibuildwheel's repair-wheel-command: audit, set the build tag, check. Also the wheel checker.

    python scripts/repair_wheel.py --dest-dir DIR WHEEL     # the hook (pyproject.toml)
    python scripts/repair_wheel.py --check [--row ID] WHEEL...   # validate finished wheels

The hook, the same code on Linux and Windows:
1. reads torch.__version__ and torch.version.cuda of the build env and refuses to go on when
   they are not the matrix row's ($SAGEATTN_ROW, cibuildwheel.toml) or not what the wheel's
   build info recorded at compile time;
2. repairs: `auditwheel repair` (Linux, to $AUDITWHEEL_PLAT: manylinux_2_28_x86_64 in the
   manylinux_2_28 image) or `delvewheel repair` (Windows), both told to leave torch's and
   CUDA's libraries out: torch provides them at run time, and a second copy would clash;
3. sets the PEP 427 build tag "<torch>.<cuda>" (2110.130) with `wheel tags --build`;
4. checks the result with `packaging`: file name, WHEEL (Build, Tag: cp3X-abi3 with 3.X the
   oldest Python of the wheel's torch, recorded in the build info), METADATA
   (Requires-Dist torch==X.Y.*), no torch or CUDA library inside, the build info.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import fnmatch
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matrix  # noqa: E402

PROJECT = "sageattention"
# libraries torch (or the driver) provides at run time; never copied into our wheel
LINUX_EXCLUDE = ("libtorch*.so*", "libc10*.so*", "libshm*.so*", "libcudart.so*", "libcuda.so*", "libnv*.so*", "libcu*.so*")
WINDOWS_EXCLUDE = ("torch*.dll", "c10*.dll", "shm*.dll", "cudart64*.dll", "nvcuda.dll", "cu*.dll", "nv*.dll")


class RepairError(RuntimeError):
    pass


def platform_name() -> str:
    return "windows" if sys.platform == "win32" else "linux"


def repair_command(platform: str, wheel: str, out_dir: str, torch_lib: str, cuda_home: Optional[str],
                   env: Dict[str, str], python: str = sys.executable) -> List[str]:
    """The auditwheel / delvewheel command line for ``wheel``."""
    if platform == "linux":
        # the manylinux images ship auditwheel on the PATH (not in the build env)
        auditwheel = shutil.which("auditwheel", path=env.get("PATH"))
        cmd = ([auditwheel] if auditwheel else [python, "-m", "auditwheel"])
        cmd += ["repair", "-w", out_dir, "--plat", env.get("AUDITWHEEL_PLAT") or "auto"]
        for pattern in LINUX_EXCLUDE:
            cmd += ["--exclude", pattern]
        return cmd + [wheel]
    if platform == "windows":
        # delvewheel takes DLL names, not patterns: name every DLL torch and the toolkit ship
        names = set()
        for folder in filter(None, [torch_lib, cuda_home and os.path.join(cuda_home, "bin")]):
            names.update(os.path.basename(p) for p in glob.glob(os.path.join(folder, "*.dll")))
        names.update(n for n in WINDOWS_EXCLUDE if "*" not in n)
        return [python, "-m", "delvewheel", "repair", "-w", out_dir, "--add-path", torch_lib,
                "--no-dll", ";".join(sorted(names)), wheel]
    raise RepairError(f"no repair step for platform {platform!r}")


def read_dist_info(path: str) -> Dict[str, object]:
    """WHEEL, METADATA and the build info of a wheel file."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        dist = next((n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL")), None)
        if dist is None:
            raise RepairError(f"{path}: no .dist-info/WHEEL")
        parse = email.parser.Parser()
        wheel_meta = parse.parsestr(z.read(f"{dist}/WHEEL").decode())
        metadata = parse.parsestr(z.read(f"{dist}/METADATA").decode())
        info = None
        if f"{PROJECT}/_build_info.py" in names:
            tree = ast.parse(z.read(f"{PROJECT}/_build_info.py").decode())
            for node in tree.body:
                if isinstance(node, ast.Assign) and node.targets[0].id == "BUILD":
                    info = ast.literal_eval(node.value)
    return {"names": names, "wheel": wheel_meta, "metadata": metadata, "build_info": info}


def check_wheel(path: str, row: Optional[matrix.Row] = None, platform: Optional[str] = None) -> List[str]:
    """Problems with a finished wheel; [] when it is right."""
    from packaging.requirements import Requirement
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    problems: List[str] = []
    fname = os.path.basename(path)
    try:
        name, version, build, tags = parse_wheel_filename(fname)
    except InvalidWheelFilename as exc:
        return [f"{fname}: not a valid wheel file name: {exc}"]
    d = read_dist_info(path)
    meta, wmeta, info = d["metadata"], d["wheel"], d["build_info"]
    if name != PROJECT:
        problems.append(f"{fname}: project {name}, expected {PROJECT}")
    if meta["Version"] != str(version):
        problems.append(f"{fname}: METADATA Version {meta['Version']} differs from the file name's {version}")
    if info is None or not info.get("archs"):
        problems.append(f"{fname}: no build info with compiled kernels (sageattention/_build_info.py)")
        return problems
    tag = matrix.build_tag(info["torch"], info["cuda"])
    if not build:
        problems.append(f"{fname}: no build tag; expected {tag}")
    elif f"{build[0]}{build[1]}" != tag:
        problems.append(f"{fname}: build tag {build[0]}{build[1]}, but the wheel was compiled against torch "
                        f"{info['torch']} + CUDA {info['cuda']} ({tag})")
    if wmeta.get("Build") != tag:
        problems.append(f"{fname}: WHEEL says Build: {wmeta.get('Build')}, expected {tag}")
    wheel_tags = {str(t) for t in tags}
    listed = set(wmeta.get_all("Tag") or [])
    if listed != wheel_tags:
        problems.append(f"{fname}: WHEEL Tag lines {sorted(listed)} differ from the file name's {sorted(wheel_tags)}")
    if wmeta.get("Root-Is-Purelib", "").lower() != "false":
        problems.append(f"{fname}: Root-Is-Purelib should be false for a wheel with compiled kernels")
    abi3 = info.get("abi3", matrix.ABI3_FLOOR)  # wheels built before the key was recorded: 3.10
    want = matrix.python_tag(abi3)
    for t in tags:
        if t.abi != "abi3" or t.interpreter != want:
            problems.append(f"{fname}: tag {t} is not {want}-abi3 (its torch {info['torch']} serves Python >= {abi3})")
        if platform == "linux" and not t.platform.startswith("manylinux_"):
            problems.append(f"{fname}: platform {t.platform} is not a manylinux tag (auditwheel did not run?)")
        if platform == "windows" and t.platform != "win_amd64":
            problems.append(f"{fname}: platform {t.platform}, expected win_amd64")
    major, minor = info["torch"].split(".")[:2]
    pins = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    torch_pins = [str(r.specifier) for r in pins if r.name == "torch"]
    if torch_pins != [f"=={major}.{minor}.*"]:
        problems.append(f"{fname}: Requires-Dist for torch is {torch_pins}, expected ['=={major}.{minor}.*']")
    bundled = [n for n in d["names"] if any(fnmatch.fnmatch(os.path.basename(n), p)
                                            for p in LINUX_EXCLUDE + WINDOWS_EXCLUDE)]
    if bundled:
        problems.append(f"{fname}: holds torch or CUDA libraries: {bundled}")
    for ext in info["archs"]:  # "_qattn_sm80" inside sageattention, or "pkg._module"
        path = ext.replace(".", "/") if "." in ext else f"{PROJECT}/{ext}"
        if not any(n.startswith(f"{path}.") for n in d["names"]):
            problems.append(f"{fname}: build info lists {ext}, but the wheel has no {path}.* module")
    if row is not None:
        if tag != row.build_tag:
            problems.append(f"{fname}: built against torch {info['torch']} + CUDA {info['cuda']} ({tag}); row {row.id} is {row.build_tag}")
        want = {f"sm_{a.replace('.', '')}" for a in row.archs.replace("+PTX", "").split(";")}
        got = {a.replace("a", "").replace("+PTX", "") for archs in info["archs"].values() for a in archs}
        if want != got:
            problems.append(f"{fname}: compiled for {sorted(got)}; row {row.id} lists {sorted(want)}")
        if abi3 != row.abi3_python:
            problems.append(f"{fname}: serves Python >= {abi3}; row {row.id} starts at Python {row.abi3_python}")
    return problems


def set_build_tag(wheel: str, tag: str, python: str = sys.executable) -> str:
    """`wheel tags --build TAG --remove`: renames the file and rewrites WHEEL's Build field."""
    out = subprocess.run([python, "-m", "wheel", "tags", "--build", tag, "--remove", wheel],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return os.path.join(os.path.dirname(wheel), out[-1])


def torch_in_env() -> Dict[str, str]:
    import torch

    return {"version": torch.__version__, "cuda": torch.version.cuda or "",
            "lib": os.path.join(os.path.dirname(torch.__file__), "lib")}


def repair(wheel: str, dest_dir: str, row: matrix.Row, platform: str, env: Dict[str, str]) -> str:
    t = torch_in_env()
    have = matrix.build_tag(t["version"], t["cuda"]) if t["cuda"] else f"{t['version']} (CPU)"
    if row.env_mismatch(t["version"], t["cuda"]):
        raise RepairError(f"build env has torch {t['version']} with CUDA {t['cuda'] or 'none'} ({have}); "
                          f"matrix row {row.id} is {row.build_tag}: refusing to tag this wheel")
    info = read_dist_info(wheel)["build_info"]
    if not info or matrix.build_tag(info["torch"], info["cuda"]) != have:
        raise RepairError(f"{wheel}: its build info {info and (info['torch'], info['cuda'])} does not match the env's torch ({have})")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = repair_command(platform, wheel, tmp, t["lib"], env.get("CUDA_HOME"), env)
        print("repair_wheel: " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        (repaired,) = glob.glob(os.path.join(tmp, "*.whl"))
        tagged = set_build_tag(repaired, row.build_tag)
        problems = check_wheel(tagged, row, platform)
        if problems:
            raise RepairError("the repaired wheel is wrong:\n  " + "\n  ".join(problems))
        os.makedirs(dest_dir, exist_ok=True)
        final = os.path.join(dest_dir, os.path.basename(tagged))
        shutil.move(tagged, final)
    print(f"repair_wheel: {os.path.basename(final)}")
    return final


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Repair, tag and check sageattention wheels.")
    ap.add_argument("wheels", nargs="+")
    ap.add_argument("--dest-dir", help="repair into this folder (the cibuildwheel hook)")
    ap.add_argument("--check", action="store_true", help="only check finished wheels")
    ap.add_argument("--row", help="row id (default: $SAGEATTN_ROW, else the default profile's row)")
    ap.add_argument("--platform", choices=matrix.PLATFORMS, help="expected platform (default: from the file name)")
    args = ap.parse_args(argv)
    m = matrix.Matrix.load()
    row = m.row(args.row) if args.row else matrix.current_row()
    try:
        if args.check:
            bad = 0
            for w in args.wheels:
                plat = args.platform or ("windows" if w.endswith("win_amd64.whl") else "linux")
                problems = check_wheel(w, row if (args.row or os.environ.get(matrix.ROW_ENV)) else None, plat)
                print(f"{'FAIL' if problems else 'ok  '} {os.path.basename(w)}")
                for p in problems:
                    print(f"     {p}")
                bad += bool(problems)
            return 1 if bad else 0
        if not args.dest_dir or len(args.wheels) != 1:
            ap.error("the hook takes one wheel and --dest-dir")
        repair(args.wheels[0], args.dest_dir, row, platform_name(), dict(os.environ))
    except (RepairError, subprocess.CalledProcessError, matrix.MatrixError) as exc:
        print(f"repair_wheel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
