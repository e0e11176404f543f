"""Build logic without a GPU or torch's CUDA: arch parsing, per-extension arch lists,
nvcc refusals, gencode flags (scripts/cuda_archs.py, used by setup.py and the compile check),
and the source distribution (MANIFEST.in)."""

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import cuda_archs as ca  # noqa: E402
import compile_check  # noqa: E402


def test_parse_accepts_torch_spellings():
    archs = ca.parse("8.0;8.6 sm_90a,89+PTX;12.0")
    assert [str(a) for a in archs] == ["8.0", "8.6", "8.9+PTX", "9.0", "12.0"]


@pytest.mark.parametrize("bad", ["7.5", "sm_70", "banana", "11.0"])
def test_parse_refuses_unsupported_archs(bad):
    with pytest.raises(ca.ArchError, match="not supported"):
        ca.parse(bad)


def test_parse_refuses_empty():
    with pytest.raises(ca.ArchError, match="names no arch"):
        ca.parse(" ; ")


def test_each_extension_gets_only_its_archs():
    archs = ca.parse("8.0;8.6;8.9;9.0;12.0")
    fams = {f.ext: f for f in ca.FAMILIES}
    assert [a.version for a in ca.for_family(fams["_qattn_sm80"], archs, (13, 0))] == ["8.0", "8.6", "8.9", "9.0", "12.0"]
    assert [a.version for a in ca.for_family(fams["_qattn_sm89"], archs, (13, 0))] == ["8.9", "9.0", "12.0"]
    assert ca.for_family(fams["_qattn_sm89"], ca.parse("8.0;8.6"), (13, 0)) == []
    # arch-specific (sm_90a) code: 9.0 and nothing newer
    assert [a.version for a in ca.for_family(fams["_qattn_sm90"], archs, (13, 0))] == ["9.0"]
    assert ca.for_family(fams["_qattn_sm90"], ca.parse("8.9;12.0"), (13, 0)) == []


def test_blackwell_families_get_their_archs_with_nvcc_12_8():
    fams = {f.ext: f for f in ca.FAMILIES}
    archs = ca.parse("8.0;8.6;8.9;9.0;10.0;12.0;12.1")
    assert [a.version for a in ca.for_family(fams["_fp4_sm100"], archs, (13, 0))] == ["10.0"]
    assert [a.version for a in ca.for_family(fams["_fp4_sm120"], archs, (13, 0))] == ["12.0", "12.1"]
    assert len(ca.for_family(fams["_fp4_quant"], archs, (13, 0))) == 7  # plain arithmetic: every arch
    assert fams["_fp4_sm120"].gencode(ca.parse("12.0")) == ["-gencode=arch=compute_120a,code=sm_120a"]
    assert fams["_fp4_sm100"].gencode(ca.parse("10.0")) == ["-gencode=arch=compute_100a,code=sm_100a"]
    # a row without 10.0/12.x gets the quantization only; a CUDA 12.6 row gets none of the three
    assert ca.for_family(fams["_fp4_sm100"], ca.parse("8.0;9.0"), (13, 0)) == []
    for ext in ("_fp4_quant", "_fp4_sm100", "_fp4_sm120"):
        assert ca.for_family(fams[ext], ca.parse("8.0;9.0"), (12, 6)) == []
        assert "needs nvcc >= 12.8" in ca.skip_reason(fams[ext], (12, 6))
        assert fams[ext].module == f"sageattention3_blackwell.{ext}" == fams[ext].build_key
        assert fams[ext].sources()[0] == "csrc/binding/ops_fp4.cpp"
    assert fams["_qattn_sm80"].build_key == "_qattn_sm80" and fams["_qattn_sm80"].module == "sageattention._qattn_sm80"


def test_old_nvcc_skips_a_family_but_refuses_an_arch():
    fp8 = next(f for f in ca.FAMILIES if f.ext == "_qattn_sm89")
    # nvcc 12.6 has no fp16-accumulating fp8 MMA: the fp8 extension is not built, and says why
    assert ca.for_family(fp8, ca.parse("8.9;9.0"), (12, 6)) == []
    assert "needs nvcc >= 12.8" in ca.skip_reason(fp8, (12, 6)) and ca.skip_reason(fp8, (12, 8)) is None
    # an arch this nvcc cannot target at all stays a build error, never a kernel that traps at run time
    fp16 = next(f for f in ca.FAMILIES if f.ext == "_qattn_sm80")
    with pytest.raises(ca.ArchError, match="cannot build sm_120"):
        ca.for_family(fp16, ca.parse("12.0"), (12, 6))
    assert ca.for_family(fp16, ca.parse("8.0;9.0"), (12, 6))


def test_gencode_flags_honour_ptx():
    flags = ca.gencode_flags(ca.parse("8.0;9.0+PTX"))
    assert flags == ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
                     "-gencode=arch=compute_90,code=compute_90"]


def test_sm90_family_targets_sm90a():
    sm90 = next(f for f in ca.FAMILIES if f.ext == "_qattn_sm90")
    assert sm90.gencode(ca.parse("9.0+PTX")) == ["-gencode=arch=compute_90a,code=sm_90a",
                                                  "-gencode=arch=compute_90a,code=compute_90a"]


def test_generated_wgmma_header_is_current():
    import subprocess
    import sys

    gen = os.path.join(ca.ROOT, "scripts", "gen_wgmma.py")
    r = subprocess.run([sys.executable, gen, "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_sources_exist_and_kernels_include_no_torch():
    root = ca.ROOT
    for fam in ca.FAMILIES:
        for src in fam.sources():
            assert os.path.exists(os.path.join(root, src)), src
    kdir = os.path.join(root, ca.KERNELS)
    for name in os.listdir(kdir):
        text = open(os.path.join(kdir, name)).read()
        assert "#include <torch" not in text and "#include <ATen" not in text and "#include <c10" not in text, name


def test_compile_check_covers_every_kernel_file_and_arch():
    archs = ca.parse(compile_check.ALL_ARCHS)
    jobs = compile_check.jobs_for(archs, (13, 0))
    kernel_files = {f for f in os.listdir(os.path.join(ca.ROOT, ca.KERNELS)) if f.endswith(".cu")}
    assert {os.path.basename(s) for _, s, _ in jobs} == kernel_files
    for fam in ca.FAMILIES:
        want = {(s, a.version) for a in ca.for_family(fam, archs, (13, 0)) for s in fam.sources(with_binding=False)}
        got = {(s, a.version) for f, s, a in jobs if f is fam}
        assert got == want


def test_compile_check_covers_every_binding_with_its_defines():
    """Each extension's binding is checked once, with the defines and names setup.py gives it,
    and every binding file is some extension's."""
    jobs = compile_check.binding_jobs()
    assert [f for f, _ in jobs] == list(ca.FAMILIES)
    for fam, defines in jobs:
        assert defines == [f"-DSAGE_EXT={fam.ext}", f"-DSAGE_OPS={fam.ops}"] + [f"-D{d}" for d in fam.defines]
    bindings = {f for f in os.listdir(os.path.join(ca.ROOT, "csrc", "binding")) if f.endswith(".cpp")}
    assert {os.path.basename(f.binding) for f, _ in jobs} == bindings


def test_ptxas_summary_parsing():
    log = ("ptxas info    : Compiling entry function '_Zk1' for 'sm_90'\n"
           "    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers\n")
    assert compile_check.summarize(log) == [("_Zk1", 255, 12)]


def test_python_constants_match_the_kernels():
    """The Python side's copies of kernel constants (the reference config and the op calls
    use them) equal the values in the CUDA sources."""
    import re

    sys.path.insert(0, ca.ROOT)
    from sageattention import _cuda

    def const(path, name, kind="int", pattern=r"(\d+)"):
        text = open(os.path.join(ca.ROOT, ca.KERNELS, path)).read()
        m = re.search(rf"constexpr {kind} {name} = {pattern};", text)
        assert m, f"{name} not found in {path}"
        return int(m.group(1))

    assert const("quant_qkv.cu", "kKSampleRows") == _cuda.K_SAMPLE_ROWS
    # kStatChains = kStatThreads / (kStatChannels / 8): the token chains of the statistics
    threads, channels = const("quant_qkv.cu", "kStatThreads"), const("quant_qkv.cu", "kStatChannels")
    assert re.search(r"constexpr int kStatChains = kStatThreads / \(kStatChannels / 8\);",
                     open(os.path.join(ca.ROOT, ca.KERNELS, "quant_qkv.cu")).read())
    assert threads // (channels // 8) == _cuda.K_STAT_CHAINS
    assert const("quant_qkv.cu", "kVAmaxMargin", "float", r"(\d+)\.f") == _cuda.V_AMAX_MARGIN
    assert const("launch.h", "kSm90BlockK") == _cuda.SM90_BLOCK_K
    assert const("launch.h", "kAttnWarpQ") == _cuda.WARP_Q
    assert const("launch.h", "kAttnBlockQ") == _cuda.BLOCK_Q
    assert const("launch.h", "kAttnBlockK") == _cuda.BLOCK_K


# --- the source distribution --------------------------------------------------------------------

# what building a wheel reads: setup.py imports scripts/, compiles csrc/, reads cibuildwheel.toml
SDIST_MUST_HOLD = ("csrc/", "scripts/", "sageattention/", "sageattention3_blackwell/", "tests/cpp/")
SDIST_TOP_FILES = {"setup.py", "pyproject.toml", "cibuildwheel.toml", "MANIFEST.in", "README.md", "CONTRIBUTING.md",
                   "LICENSE"}


def _tracked_files():
    """The files git tracks in this checkout (their working-tree versions); a skip that says why
    outside a git checkout (an unpacked sdist has no history to compare with)."""
    git = shutil.which("git")
    if not git or not os.path.isdir(os.path.join(ca.ROOT, ".git")):
        pytest.skip("not a git checkout: the sdist is compared with `git ls-files`")
    out = subprocess.run([git, "ls-files", "-z"], cwd=ca.ROOT, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and os.path.exists(os.path.join(ca.ROOT, f))]


def test_sdist_carries_every_build_input(tmp_path):
    """`python -m build --sdist` on a copy of the tracked files (as a fresh clone has them), then
    the Triton-only wheel built from that sdist alone: the sdist holds every tracked file that a
    wheel build reads, and none of the benchmark records."""
    tracked = _tracked_files()
    src = tmp_path / "src"
    for f in tracked:
        if f.startswith("bench/results/"):
            continue  # 15 MB of records the sdist leaves out; copying them is all this would test
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ca.ROOT, f), src / f)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CIBW_", "SAGEATTN_"))}
    env["SAGEATTN_SKIP_CUDA_BUILD"] = "1"
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                        str(src)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("sageattention-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile() and "/" in m.name}
        tar.extractall(tmp_path / "unpacked", filter="data")
    want = {f for f in tracked if f.startswith(SDIST_MUST_HOLD) or f in SDIST_TOP_FILES}
    assert want <= members, f"missing from the sdist: {sorted(want - members)}"
    assert not [m for m in members if m.startswith("bench/results/")]

    (unpacked,) = (tmp_path / "unpacked").iterdir()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-q", "-w", str(tmp_path / "wheel"), str(unpacked)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = (tmp_path / "wheel").glob("sageattention-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    py = {f for f in tracked if f.startswith(("sageattention/", "sageattention3_blackwell/")) and f.endswith(".py")}
    assert py <= names, f"missing from the wheel built from the sdist: {sorted(py - names)}"
    # the license text beside the metadata that names it (Apache-2.0 asks that copies carry it),
    # wherever the checkout tracks it (a copy of the tree with older git metadata may not)
    licenses = [n for n in names if ".dist-info/" in n and n.endswith("/LICENSE")]
    assert bool(licenses) == ("LICENSE" in tracked), (licenses, "LICENSE" in tracked)
