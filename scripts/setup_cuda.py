"""Install the CUDA toolkit of a matrix row, and link it at the platform's CUDA home.

Run by cibuildwheel's before-build (pyproject.toml) for the row in $SAGEATTN_ROW (default:
the default profile's row); the same code on Linux (inside manylinux_2_28) and Windows:

    python scripts/setup_cuda.py [--row torch2.11-cu130] [--platform linux] [--dry-run]

Where the toolkit comes from is the row's CUDA table in cibuildwheel.toml:
- "pypi": `cuda-toolkit[nvcc,cudart,crt,cccl,nvvm]==<version>` installed with pip into a
  folder of its own; its nvidia/cu<major> tree is a full nvcc. Two things torch's
  cpp_extension needs are missing from it and are added: `lib64 -> lib` and the unversioned
  `libcudart.so` (Linux); `lib/x64` (Windows, where the libraries are looked up).
- "nvidia": NVIDIA's RHEL 8 repository (its .repo file) with dnf (Linux: nvcc, cudart-devel, cccl of the CUDA
  minor) or NVIDIA's network installer (Windows: nvcc, cudart, thrust).
Then the CUDA home (`cuda-home` of the platform, /usr/local/cuda or C:/cuda) becomes a link
to the toolkit, and nvcc's version is checked against the row. A toolkit already there with
the right version is kept (a rerun costs nothing).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matrix  # noqa: E402

RHEL_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo"
WIN_INSTALLER = ("https://developer.download.nvidia.com/compute/cuda/{version}/network_installers/"
                 "cuda_{version}_windows_network.exe")
WIN_DEFAULT_ROOT = "C:/Program Files/NVIDIA GPU Computing Toolkit/CUDA/v{minor}"
PYPI_EXTRAS = "nvcc,cudart,crt,cccl,nvvm"


class SetupError(RuntimeError):
    pass


@dataclass
class Plan:
    """What to do, as data (the unit tests read it; --dry-run prints it)."""
    commands: List[List[str]] = field(default_factory=list)
    downloads: List[tuple] = field(default_factory=list)  # (url, local file)
    toolkit: str = ""  # the folder holding bin/nvcc once the commands ran
    cuda_home: str = ""


def plan(row: matrix.Row, platform: str, cuda_home: str, python: str = sys.executable,
         store: Optional[str] = None) -> Plan:
    source = row.cuda_source(platform)
    minor, version = row.cuda, row.cuda_version
    major = minor.split(".")[0]
    p = Plan(cuda_home=cuda_home)
    if source == "pypi":
        store = store or f"{cuda_home}-pypi-{version}"
        p.commands.append([python, "-m", "pip", "install", "--disable-pip-version-check", "--target", store, f"cuda-toolkit[{PYPI_EXTRAS}]=={version}"])
        p.toolkit = f"{store}/nvidia/cu{major}"
    elif source == "nvidia" and platform == "linux":
        dash = minor.replace(".", "-")
        p.downloads.append((RHEL_REPO, "/etc/yum.repos.d/cuda-rhel8.repo"))  # no dnf plugin needed
        p.commands.append(["dnf", "install", "-y", "--setopt=install_weak_deps=False",
                           f"cuda-nvcc-{dash}", f"cuda-cudart-devel-{dash}", f"cuda-cccl-{dash}"])
        p.toolkit = f"/usr/local/cuda-{minor}"
    elif source == "nvidia" and platform == "windows":
        exe = os.path.join(os.environ.get("RUNNER_TEMP") or os.environ.get("TEMP") or ".", f"cuda_{version}_network.exe")
        p.downloads.append((WIN_INSTALLER.format(version=version), exe))
        p.commands.append([exe, "-s", f"nvcc_{minor}", f"cudart_{minor}", f"thrust_{minor}"])
        p.toolkit = WIN_DEFAULT_ROOT.format(minor=minor)
    else:
        raise SetupError(f"CUDA {minor}: unknown source {source!r} for platform {platform!r} (cibuildwheel.toml)")
    return p


def nvcc_path(toolkit: str, platform: str) -> str:
    return os.path.join(toolkit, "bin", "nvcc.exe" if platform == "windows" else "nvcc")


def installed_version(toolkit: str, platform: str) -> Optional[str]:
    nvcc = nvcc_path(toolkit, platform)
    if not os.path.exists(nvcc):
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def link_dir(target: str, link: str, platform: str) -> None:
    """link -> target (a symlink on Linux, a directory junction on Windows, which needs no
    privilege)."""
    if os.path.lexists(link):
        if os.path.islink(link) or _is_junction(link):
            os.unlink(link) if platform != "windows" else os.rmdir(link)
        else:
            raise SetupError(f"{link} exists and is not a link; move it away or set CUDA_HOME")
    os.makedirs(os.path.dirname(os.path.abspath(link)), exist_ok=True)
    if platform == "windows":
        import _winapi

        _winapi.CreateJunction(os.path.abspath(target), os.path.abspath(link))
    else:
        os.symlink(target, link)


def _is_junction(path: str) -> bool:
    return getattr(os.path, "isjunction", lambda p: False)(path)


def complete_pypi_toolkit(toolkit: str, platform: str) -> List[str]:
    """Add what the PyPI toolkit lacks for torch's cpp_extension; returns what was added."""
    added = []
    lib = os.path.join(toolkit, "lib")
    if platform == "windows":
        x64 = os.path.join(lib, "x64")
        if not os.path.isdir(x64) and glob.glob(os.path.join(lib, "cudart*.lib")):
            link_dir(lib, x64, platform)
            added.append(x64)
        return added
    lib64 = os.path.join(toolkit, "lib64")
    if not os.path.lexists(lib64):
        os.symlink("lib", lib64)
        added.append(lib64)
    cudart = os.path.join(lib, "libcudart.so")
    if not os.path.lexists(cudart):
        versioned = sorted(glob.glob(os.path.join(lib, "libcudart.so.*")), key=len)
        if not versioned:
            raise SetupError(f"no libcudart.so.* in {lib}: the cudart extra of cuda-toolkit did not install")
        os.symlink(os.path.basename(versioned[0]), cudart)
        added.append(cudart)
    return added


def run(p: Plan, row: matrix.Row, platform: str, dry_run: bool = False) -> str:
    have = installed_version(p.cuda_home, platform) if not dry_run else None
    if have == row.cuda:
        print(f"setup_cuda: CUDA {have} already at {p.cuda_home}")
        return p.cuda_home
    if dry_run:
        for d in p.downloads:
            print("download", *d)
        for c in p.commands:
            print(" ".join(c))
        print(f"link {p.cuda_home} -> {p.toolkit}")
        return p.cuda_home
    if installed_version(p.toolkit, platform) != row.cuda:
        for url, dest in p.downloads:
            print(f"setup_cuda: downloading {url} -> {dest}", flush=True)
            urllib.request.urlretrieve(url, dest)
        for c in p.commands:
            print("setup_cuda: " + " ".join(c), flush=True)
            subprocess.run(c, check=True)
    if row.cuda_source(platform) == "pypi":
        for a in complete_pypi_toolkit(p.toolkit, platform):
            print(f"setup_cuda: added {a}")
    if os.path.abspath(p.toolkit) != os.path.abspath(p.cuda_home):
        link_dir(p.toolkit, p.cuda_home, platform)
    got = installed_version(p.cuda_home, platform)
    if got != row.cuda:
        raise SetupError(f"after set-up, {nvcc_path(p.cuda_home, platform)} reports CUDA {got}; row {row.id} needs {row.cuda}")
    print(f"setup_cuda: CUDA {got} ({row.cuda_source(platform)}) at {p.cuda_home} -> {p.toolkit}")
    return p.cuda_home


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Install the CUDA toolkit of a build matrix row.")
    ap.add_argument("--row", help="row id (default: $SAGEATTN_ROW, else the default profile's)")
    ap.add_argument("--platform", choices=matrix.PLATFORMS, default="windows" if sys.platform == "win32" else "linux")
    ap.add_argument("--cuda-home", help="where to link the toolkit (default: the platform's cuda-home)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    m = matrix.Matrix.load()
    row = m.row(args.row) if args.row else matrix.current_row()
    home = args.cuda_home or os.environ.get("CUDA_HOME") or m.platform(args.platform)["cuda-home"]
    try:
        run(plan(row, args.platform, home), row, args.platform, args.dry_run)
    except (SetupError, subprocess.CalledProcessError, OSError) as exc:
        print(f"setup_cuda: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
