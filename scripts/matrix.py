"""The build matrix tool: rows of a profile, the GitHub Actions matrix, a row's environment.

Everything it knows comes from cibuildwheel.toml at the repository root. Used by the workflow
(`gha`, `env`), by the cibuildwheel hooks and setup.py (`current_row`), and by maintainers:

    python scripts/matrix.py profiles                  # every profile and its job count
    python scripts/matrix.py rows --profile stable     # the rows of a profile, as a table
    python scripts/matrix.py gha --profile default     # {"include": [...]} for a job matrix
    python scripts/matrix.py env --row torch2.11-cu130 --platform linux [--cache-dir DIR]
    python scripts/matrix.py tag --torch 2.11.0+cu130 --cuda 13.0   # -> 2110.130

Needs only the standard library (tomli on Python 3.10).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX_FILE = os.path.join(ROOT, "cibuildwheel.toml")
ROW_ENV = "SAGEATTN_ROW"  # names the row a cibuildwheel run builds; unset: the default profile's
PYTORCH_INDEX = "https://download.pytorch.org/whl/cu{digits}"
PLATFORMS = ("linux", "windows")


class MatrixError(ValueError):
    pass


def _toml(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: the build requirements install tomli
        import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def digits(version: str, parts: int) -> str:
    """'2.11.0+cu130', 3 -> '2110'; '13.0.2', 2 -> '130'."""
    nums = re.match(r"^(\d+(?:\.\d+)*)", version)
    if not nums:
        raise MatrixError(f"not a version: {version!r}")
    fields = nums.group(1).split(".")
    if len(fields) < parts:
        fields += ["0"] * (parts - len(fields))
    return "".join(fields[:parts])


def build_tag(torch_version: str, cuda_version: str) -> str:
    """The PEP 427 build tag of a wheel built against ``torch_version`` and CUDA ``cuda_version``:
    torch 2.11.0(+cu130) and CUDA 13.0 give '2110.130'."""
    if not cuda_version:
        raise MatrixError(f"torch {torch_version} has no CUDA (torch.version.cuda is None): a CPU-only torch cannot build the kernels")
    return f"{digits(torch_version, 3)}.{digits(cuda_version, 2)}"


def _load_build_module():
    """sageattention/_build.py from the source tree, without importing the package (which
    needs torch): it defines the variant name the installed package prints in its messages."""
    spec = importlib.util.spec_from_file_location("_sage_build", os.path.join(ROOT, "sageattention", "_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


variant = _load_build_module().variant  # 'torch2.11-cu130': row id and index folder

ABI3_FLOOR = "3.10"  # the oldest Python any of our wheels serves (pyproject.toml's requires-python)
LIMITED_API = "0x030A0000"  # Py_LIMITED_API for ABI3_FLOOR: the API level of every extension


def _minor(python: str) -> int:
    m = re.fullmatch(r"3\.(\d+)", python)
    if not m:
        raise MatrixError(f"not a Python 3 version: {python!r}")
    return int(m.group(1))


def abi3_python(torch_requires_python: Optional[str]) -> str:
    """The oldest Python a wheel serves: the lower bound of its torch's Requires-Python
    ('>=3.11' -> '3.11'), never below ABI3_FLOOR. A wheel for torch 2.15, which needs 3.11, is
    tagged cp311-abi3: pip on 3.10 then never picks a wheel whose torch it cannot install."""
    bounds = re.findall(r">=?\s*3\.(\d+)", torch_requires_python or "")
    return f"3.{max([_minor(ABI3_FLOOR)] + [int(b) for b in bounds])}"


def python_tag(python: str) -> str:
    """'3.11' -> 'cp311': the interpreter part of an abi3 wheel's tag."""
    return f"cp3{_minor(python)}"


def _python_range(spec: str) -> List[str]:
    m = re.fullmatch(r"3\.(\d+)-3\.(\d+)", spec)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise MatrixError(f"python range {spec!r}: write it as '3.10-3.14'")
    if int(m.group(1)) < _minor(ABI3_FLOOR):
        raise MatrixError(f"python range {spec!r}: our wheels serve Python {ABI3_FLOOR} and newer; start it there")
    return [f"3.{n}" for n in range(int(m.group(1)), int(m.group(2)) + 1)]


@dataclass(frozen=True)
class Row:
    id: str
    torch: str  # minor, "2.11"
    torch_version: str  # "2.11.0"
    cuda: str  # minor, "13.0"
    cuda_version: str  # "13.0.2"
    pythons: Tuple[str, ...]  # ("3.10", ..., "3.14")
    archs: str  # TORCH_CUDA_ARCH_LIST
    platforms: Tuple[str, ...]
    cuda_sources: Tuple[Tuple[str, str], ...]  # (platform, "pypi" | "nvidia")
    torch_pypi_cuda: Tuple[Tuple[str, str], ...]  # (platform, CUDA of PyPI's torch wheel)

    @property
    def build_tag(self) -> str:
        return build_tag(self.torch_version, self.cuda)

    @property
    def abi3_python(self) -> str:
        """The oldest Python the row's wheels serve: the lowest of its torch's Pythons."""
        return self.pythons[0]

    def env_mismatch(self, torch_version: str, torch_cuda: Optional[str], nvcc: Optional[str] = None) -> Optional[str]:
        """None when a build env (its torch, torch's CUDA, and nvcc when given) is this row's;
        else what differs. setup_torch.py, setup.py and the repair hook all ask this."""
        diffs = []
        if torch_version.split("+")[0] != self.torch_version:
            diffs.append(f"torch {torch_version}, not {self.torch_version}")
        if (torch_cuda or "") != self.cuda:
            diffs.append(f"torch's CUDA {torch_cuda or 'none'}, not {self.cuda}")
        if nvcc is not None and nvcc != self.cuda:
            diffs.append(f"nvcc {nvcc}, not {self.cuda}")
        return "; ".join(diffs) or None

    def torch_source(self, platform: str) -> str:
        """'pypi' when PyPI's torch for this platform is built with this row's CUDA, else the
        PyTorch index URL for the row's CUDA."""
        if dict(self.torch_pypi_cuda).get(platform) == self.cuda:
            return "pypi"
        return PYTORCH_INDEX.format(digits=digits(self.cuda, 2))

    def cuda_source(self, platform: str) -> str:
        return dict(self.cuda_sources)[platform]


@dataclass(frozen=True)
class Job:
    row: Row
    platform: str
    python: str  # "3.10": the Python the wheel is built under
    identifier: str  # cibuildwheel's build identifier, "cp310-manylinux_x86_64"


class Matrix:
    _cache: Dict[str, "Matrix"] = {}

    def __init__(self, data: dict):
        self.data = data
        self.platforms: Dict[str, dict] = data.get("platforms", {})
        self.rows: List[Row] = [self._row(r) for r in data.get("row", [])]
        ids = [r.id for r in self.rows]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise MatrixError(f"cibuildwheel.toml: rows listed twice: {', '.join(dup)}")
        self.by_id = {r.id: r for r in self.rows}
        profiles = data.get("profiles", {})
        for name in ("default", "stable"):
            if name not in profiles:
                raise MatrixError(f"cibuildwheel.toml: [profiles] needs {name!r}")
        if len(profiles["default"]) != 1:
            raise MatrixError(f"cibuildwheel.toml: profile 'default' must name exactly one row, not {profiles['default']}")
        for name, ids in profiles.items():
            for i in ids:
                if i not in self.by_id:
                    raise MatrixError(f"cibuildwheel.toml: profile {name!r} names row {i!r}, which is not a row; rows: {', '.join(self.by_id)}")
        self.named_profiles: Dict[str, List[str]] = dict(profiles)

    @classmethod
    def load(cls, path: str = MATRIX_FILE) -> "Matrix":
        if path not in cls._cache:
            cls._cache[path] = cls(_toml(path))
        return cls._cache[path]

    def platform(self, name: str) -> dict:
        if name not in self.platforms:
            raise MatrixError(f"platform {name!r} is not in cibuildwheel.toml; platforms: {', '.join(self.platforms)}")
        return self.platforms[name]

    def _row(self, r: dict) -> Row:
        where = f"cibuildwheel.toml row {r}"
        torch_minor, cuda_minor = r.get("torch"), r.get("cuda")
        t = self.data.get("torch", {}).get(torch_minor)
        c = self.data.get("cuda", {}).get(cuda_minor)
        if t is None:
            raise MatrixError(f"{where}: torch {torch_minor!r} has no [torch.\"{torch_minor}\"] table")
        if c is None:
            raise MatrixError(f"{where}: CUDA {cuda_minor!r} has no [cuda.\"{cuda_minor}\"] table")
        if not t["version"].startswith(torch_minor + "."):
            raise MatrixError(f"cibuildwheel.toml: [torch.\"{torch_minor}\"] version {t['version']!r} is not a {torch_minor} release")
        platforms = tuple(r.get("platforms", list(self.platforms)))
        for p in platforms:
            self.platform(p)
            if p not in c["source"]:
                raise MatrixError(f"{where}: CUDA {cuda_minor} has no source for platform {p!r}")
        return Row(
            id=variant(t["version"], cuda_minor),
            torch=torch_minor,
            torch_version=t["version"],
            cuda=cuda_minor,
            cuda_version=c["version"],
            pythons=tuple(_python_range(t["python"])),
            archs=r.get("archs", c["archs"]),
            platforms=platforms,
            cuda_sources=tuple(sorted(c["source"].items())),
            torch_pypi_cuda=tuple(sorted(t.get("pypi", {}).items())),
        )

    # --- profiles -----------------------------------------------------------------------
    def profile_names(self) -> List[str]:
        torches = sorted({r.torch for r in self.rows}, key=lambda v: tuple(map(int, v.split("."))))
        pythons = sorted({p for r in self.rows for p in r.pythons}, key=lambda v: tuple(map(int, v.split("."))))
        return (list(self.named_profiles) + ["all"]
                + [f"pytorch{t.replace('.', '')}" for t in torches]
                + [f"python{p.replace('.', '')}" for p in pythons])

    def jobs(self, profile: str, platforms: Sequence[str] = PLATFORMS) -> List[Job]:
        """The jobs of ``profile``: one per row and platform, each building one wheel."""
        python: Optional[str] = None
        if profile in self.named_profiles:
            rows = [self.by_id[i] for i in self.named_profiles[profile]]
        elif profile == "all":
            rows = list(self.rows)
        elif re.fullmatch(r"pytorch\d+", profile) and profile in self.profile_names():
            rows = [r for r in self.rows if "pytorch" + r.torch.replace(".", "") == profile]
        elif re.fullmatch(r"python3\d+", profile) and profile in self.profile_names():
            python = f"3.{profile[len('python3'):]}"
            rows = [r for r in self.rows if python in r.pythons]
        else:
            raise MatrixError(f"unknown profile {profile!r}; profiles: {', '.join(self.profile_names())}")
        return [self.job(r, p, python or r.pythons[0]) for r in rows for p in platforms if p in r.platforms]

    def job(self, row: Row, platform: str, python: str) -> Job:
        ident = self.platform(platform)["identifier"].format(py=python.replace(".", ""))
        return Job(row, platform, python, ident)

    def default_row(self) -> Row:
        return self.by_id[self.named_profiles["default"][0]]

    def row(self, row_id: str) -> Row:
        if row_id not in self.by_id:
            raise MatrixError(f"no row {row_id!r} in cibuildwheel.toml; rows: {', '.join(self.by_id)}")
        return self.by_id[row_id]


def current_row(env=os.environ) -> Row:
    """The row this build is for: $SAGEATTN_ROW, else the default profile's row."""
    m = Matrix.load()
    return m.row(env[ROW_ENV]) if env.get(ROW_ENV) else m.default_row()


def host_path(path: str, platform: str) -> str:
    """A host folder as the build sees it: cibuildwheel mounts the host's / at /host in the
    Linux container; Windows builds run on the host."""
    if platform == "linux":
        return "/host" + os.path.abspath(path)
    return path


def job_env(job: Job, cache_dir: Optional[str] = None) -> Dict[str, str]:
    """What a CI job exports before `cibuildwheel --platform <platform>`."""
    env = {"CIBW_BUILD": job.identifier, ROW_ENV: job.row.id}
    if cache_dir:
        base = host_path(cache_dir, job.platform)
        sep = "/" if job.platform == "linux" else os.sep
        env["PIP_CACHE_DIR"] = base + sep + "pip"
        env["SCCACHE_DIR"] = base + sep + "sccache"
    return env


def gha_matrix(profile: str) -> dict:
    m = Matrix.load()
    include = []
    for j in m.jobs(profile):
        include.append({
            "row": j.row.id, "platform": j.platform, "runner": m.platform(j.platform)["runner"],
            "python": j.python, "identifier": j.identifier, "torch": j.row.torch_version,
            "cuda": j.row.cuda_version, "build_tag": j.row.build_tag,
        })
    return {"include": include}


def _table(jobs: List[Job]) -> str:
    head = ["row", "platform", "identifier", "torch", "torch from", "CUDA", "CUDA from", "archs", "build tag"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for j in jobs:
        r = j.row
        lines.append("| " + " | ".join([r.id, j.platform, j.identifier, r.torch_version, r.torch_source(j.platform),
                                         r.cuda_version, r.cuda_source(j.platform), r.archs, r.build_tag]) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("profiles", help="every profile and its number of jobs")
    p = sub.add_parser("rows", help="the jobs of a profile as a markdown table")
    p.add_argument("--profile", default="default")
    p = sub.add_parser("gha", help="the GitHub Actions job matrix of a profile (JSON)")
    p.add_argument("--profile", default="default")
    p = sub.add_parser("env", help="KEY=VALUE lines for a job (append to $GITHUB_ENV)")
    p.add_argument("--row", required=True)
    p.add_argument("--platform", required=True, choices=PLATFORMS)
    p.add_argument("--python", help="build under this Python (default: the row's lowest)")
    p.add_argument("--cache-dir", help="host folder for pip downloads and sccache")
    p = sub.add_parser("tag", help="the build tag for a torch and CUDA version")
    p.add_argument("--torch", required=True)
    p.add_argument("--cuda", required=True)
    args = ap.parse_args(argv)
    try:
        m = Matrix.load()
        if args.cmd == "profiles":
            for name in m.profile_names():
                jobs = m.jobs(name)
                rows = len({j.row.id for j in jobs})
                print(f"{name:<12} {rows:>3} rows  {len(jobs):>3} jobs")
        elif args.cmd == "rows":
            print(_table(m.jobs(args.profile)))
        elif args.cmd == "gha":
            print(json.dumps(gha_matrix(args.profile)))
        elif args.cmd == "env":
            row = m.row(args.row)
            if args.platform not in row.platforms:
                raise MatrixError(f"row {row.id} is not built for {args.platform}")
            python = args.python or row.pythons[0]
            if python not in row.pythons:
                raise MatrixError(f"row {row.id} supports Python {row.pythons[0]}-{row.pythons[-1]}, not {python}")
            for k, v in job_env(m.job(row, args.platform, python), args.cache_dir).items():
                print(f"{k}={v}")
        elif args.cmd == "tag":
            print(build_tag(args.torch, args.cuda))
    except MatrixError as exc:
        print(f"matrix.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
