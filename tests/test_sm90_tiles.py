"""The Hopper kernel's work-tile schedule on the CPU: tests/cpp/sm90_tiles.cu, built with nvcc
against csrc/kernels/attn_sm90_tiles.cuh (the code the kernel and its host side use), walks
every tile of ~36,000 calls (dense and packed, causal or not, the three tile shapes) and checks
that each query row lies in exactly one tile, that consumer 0 has a query row in every tile,
the key-tile counts, the causal order and D=64's tail order. No GPU needed; nvcc is (CI has it)."""

import os
import subprocess

import pytest

from helpers import nvcc_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sm90_tile_schedule_on_the_cpu(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, CUDA_HOME): the schedule check compiles the kernel's tile code with it")
    exe = tmp_path / "sm90_tiles"
    build = subprocess.run([nvcc, "-std=c++17", "-O1", "-DSAGE_SM90", "-I", os.path.join(ROOT, "csrc", "kernels"),
                            os.path.join(ROOT, "tests", "cpp", "sm90_tiles.cu"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failed checks" in run.stdout and "calls checked" in run.stdout, run.stdout
