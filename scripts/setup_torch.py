"""Install the torch of a matrix row into the build environment, and check what arrived.

Run by cibuildwheel's before-build (pyproject.toml), after scripts/setup_cuda.py:

    python scripts/setup_torch.py [--row torch2.11-cu130] [--platform linux] [--dry-run]

torch comes from PyPI when PyPI's wheel of that torch is built with the row's CUDA on this
platform (cibuildwheel.toml, [torch."X.Y"] pypi), else from PyTorch's index for the row's
CUDA (https://download.pytorch.org/whl/cuXYZ). Afterwards torch.__version__ and
torch.version.cuda must be the row's: a CPU wheel, or another CUDA flavour, stops the build
here instead of producing a wheel whose build tag lies.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matrix  # noqa: E402


class SetupError(RuntimeError):
    pass


def install_command(row: matrix.Row, platform: str, python: str = sys.executable) -> List[str]:
    cmd = [python, "-m", "pip", "install", "--disable-pip-version-check", f"torch=={row.torch_version}"]
    source = row.torch_source(platform)
    if source != "pypi":
        cmd += ["--index-url", source]  # torch's own dependencies are mirrored there too
    return cmd


def installed(python: str = sys.executable) -> Tuple[str, str]:
    code = "import torch; print(torch.__version__); print(torch.version.cuda)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise SetupError(f"torch does not import after installing it:\n{out.stderr[-2000:]}")
    version, cuda = out.stdout.split()[-2:]
    return version, ("" if cuda == "None" else cuda)


def check(row: matrix.Row, version: str, cuda: str) -> None:
    if row.env_mismatch(version, cuda):
        raise SetupError(
            f"row {row.id} needs torch {row.torch_version} built with CUDA {row.cuda}; the installed torch is "
            f"{version} with CUDA {cuda or 'none'}. Check [torch.\"{row.torch}\"] pypi in cibuildwheel.toml "
            f"(where torch comes from) and the pip configuration (an index or find-links serving another build)"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Install the torch of a build matrix row.")
    ap.add_argument("--row", help="row id (default: $SAGEATTN_ROW, else the default profile's)")
    ap.add_argument("--platform", choices=matrix.PLATFORMS, default="windows" if sys.platform == "win32" else "linux")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    row = matrix.Matrix.load().row(args.row) if args.row else matrix.current_row()
    cmd = install_command(row, args.platform)
    print("setup_torch: " + " ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    try:
        subprocess.run(cmd, check=True)
        version, cuda = installed()
        check(row, version, cuda)
    except (SetupError, subprocess.CalledProcessError) as exc:
        print(f"setup_torch: {exc}", file=sys.stderr)
        return 1
    print(f"setup_torch: torch {version} (CUDA {cuda}) for row {row.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
