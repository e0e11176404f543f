"""The two spellings of the INT8 rounding in csrc/kernels/common.cuh (int8_code, which
quant_qkv.cu uses, and int8_round, quant_int8.cu's plain form of the reference's arithmetic)
give the same code on all 2^32 float inputs: tests/cpp/int8_round.cu, built with nvcc. Built
on the CPU (CI), run on a GPU."""

import pytest
import torch

from helpers import build_cpp_check, run_cpp_check

WHY = "the rounding check is a CUDA program built with it"


def _gencode(arch):
    return ["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def test_int8_round_check_builds(tmp_path):
    assert build_cpp_check(tmp_path, "int8_round.cu", _gencode("90a"), WHY, compile_only=True).stat().st_size > 0


@pytest.mark.gpu
def test_int8_code_equals_int8_round_on_every_float(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible: the rounding check runs all 2^32 inputs on one")
    major, minor = torch.cuda.get_device_capability()
    out = run_cpp_check(build_cpp_check(tmp_path, "int8_round.cu", _gencode(f"{major}{minor}"), WHY))
    assert "inputs 4294967296 mismatches 0" in out, out
