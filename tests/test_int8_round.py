"""The two spellings of the INT8 rounding in csrc/kernels/common.cuh (int8_code, which
quant_qkv.cu uses, and int8_round, quant_int8.cu's plain form of the reference's arithmetic)
give the same code on all 2^32 float inputs: tests/cpp/int8_round.cu, built with nvcc. Built
on the CPU (CI), run on a GPU."""

import os
import subprocess

import pytest
import torch

from helpers import nvcc_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "cpp", "int8_round.cu")


def _build(tmp_path, arch, compile_only=False):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, CUDA_HOME): the rounding check is a CUDA program built with it")
    out = tmp_path / ("int8_round.o" if compile_only else "int8_round")
    cmd = [nvcc, "-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-I",
           os.path.join(ROOT, "csrc", "kernels"), SRC, "-o", str(out)] + (["-c"] if compile_only else [])
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def test_int8_round_check_builds(tmp_path):
    assert _build(tmp_path, "90a", compile_only=True).stat().st_size > 0


@pytest.mark.gpu
def test_int8_code_equals_int8_round_on_every_float(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible: the rounding check runs all 2^32 inputs on one")
    major, minor = torch.cuda.get_device_capability()
    exe = _build(tmp_path, f"{major}{minor}")
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "inputs 4294967296 mismatches 0" in run.stdout, run.stdout
