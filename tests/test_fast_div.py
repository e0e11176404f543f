"""FastDiv (csrc/kernels/common.cuh: division by a divisor fixed at launch, as a multiply-high,
an add and a shift) against integer division on the host: tests/cpp/fast_div.cu, built with
nvcc. No GPU needed; nvcc is (CI has it)."""

import os
import subprocess

import pytest

from helpers import nvcc_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_fast_div_matches_integer_division(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, CUDA_HOME): the check compiles csrc/kernels/common.cuh with it")
    exe = tmp_path / "fast_div"
    build = subprocess.run([nvcc, "-std=c++17", "-O2", "-I", os.path.join(ROOT, "csrc", "kernels"),
                            os.path.join(ROOT, "tests", "cpp", "fast_div.cu"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 failed" in run.stdout and "checks" in run.stdout, run.stdout
