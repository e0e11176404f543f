"""The Hopper kernel's work-tile schedule on the CPU: tests/cpp/sm90_tiles.cu, built with nvcc
against csrc/kernels/attn_sm90_tiles.cuh (the code the kernel and its host side use), walks
every tile of ~36,000 calls (dense and packed, causal or not, the three tile shapes) and checks
that each query row lies in exactly one tile, that consumer 0 has a query row in every tile,
the key-tile counts, the causal order and D=64's tail order. No GPU needed; nvcc is (CI has it)."""

from helpers import build_cpp_check, run_cpp_check


def test_sm90_tile_schedule_on_the_cpu(tmp_path):
    exe = build_cpp_check(tmp_path, "sm90_tiles.cu", ["-O1", "-DSAGE_SM90"],
                          "the schedule check compiles the kernel's tile code with it")
    out = run_cpp_check(exe)
    assert "0 failed checks" in out and "calls checked" in out, out
