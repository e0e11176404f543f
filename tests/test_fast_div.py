"""FastDiv (csrc/kernels/common.cuh: division by a divisor fixed at launch, as a multiply-high,
an add and a shift) against integer division on the host: tests/cpp/fast_div.cu, built with
nvcc. No GPU needed; nvcc is (CI has it)."""

from helpers import build_cpp_check, run_cpp_check


def test_fast_div_matches_integer_division(tmp_path):
    exe = build_cpp_check(tmp_path, "fast_div.cu", ["-O2"], "the check compiles csrc/kernels/common.cuh with it")
    out = run_cpp_check(exe)
    assert " 0 failed" in out and "checks" in out, out
