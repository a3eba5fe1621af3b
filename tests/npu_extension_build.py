"""Test helper: flash-cann's NPU extension built against the real torch-npu wheel, with
the NPU stand-ins it runs on (tests/npu_standins/fake_npu), once per test session for
every module that runs it (test_npu_extension.py, test_npu_capture.py), and the
environment of a stand-in scenario process."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from flash_cann.backends.npu import aclnn
from flash_cann.backends.npu.opp_paths import LIBRARY

from torch_npu_wheel import torch_npu_wheel

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "framework" / "csrc"
STANDINS = Path(__file__).resolve().parent / "npu_standins"
FAKE = STANDINS / "fake_npu"

_built: dict[str, Path] = {}


def run_or_fail(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"{' '.join(map(str, cmd))}\n{done.stdout}{done.stderr}")


def build_extension(tmp_path_factory) -> Path:
    """The build directory: the extension (ext/), the fake libtorch_npu.so (fake/), the
    fake op package (vendors/flash_cann) and another vendor's library (vendors/other)."""
    if "out" not in _built:
        _built["out"] = _build(tmp_path_factory)
    return _built["out"]


def _build(tmp_path_factory) -> Path:
    wheel = torch_npu_wheel()
    out = tmp_path_factory.mktemp("npu_extension")
    generated = out / "generated"
    aclnn.write_headers(generated)
    torch_lib = Path(torch.__file__).parent / "lib"
    cxx = ["g++", "-std=c++17", "-fPIC", "-O0", "-Wall", "-Wextra", "-Werror",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
           *[f"-isystem{p}" for p in torch.utils.cpp_extension.include_paths()],
           f"-isystem{wheel / 'include'}", f"-I{CSRC}", f"-I{generated}"]
    # One translation unit for the two torch-heavy sources keeps CI (2 cores) fast.
    unity = out / "launcher_unity.cpp"
    unity.write_text("".join(f'#include "{CSRC / name}"\n'
                             for name in ("aclnn_call.cpp", "flash_cann_npu.cpp")))
    package = out / "vendors" / "flash_cann" / "op_api" / "lib"
    other = out / "vendors" / "other" / "op_api" / "lib"
    for d in (package, other, out / "ext" / "flash_cann_npu", out / "fake"):
        d.mkdir(parents=True)
    (out / "other_vendor.c").write_text("int another_vendors_op(void) { return 0; }\n")
    jobs = [cxx + ["-c", str(unity), "-o", str(out / "launcher.o")],
            cxx + ["-c", str(CSRC / "opapi_library.cpp"), "-o", str(out / "opapi.o")],
            cxx + ["-c", str(FAKE / "fake_torch_npu.cpp"), "-o", str(out / "fake.o")],
            ["gcc", "-std=c11", "-fPIC", "-O0", "-Wall", "-Wextra", "-Werror", "-shared",
             str(FAKE / "fake_cust_opapi.c"), "-o", str(package / "libcust_opapi.so")],
            # Another vendor's op library: loads, lacks our symbols.
            ["gcc", "-shared", "-fPIC", str(out / "other_vendor.c"), "-o",
             str(other / "libcust_opapi.so")]]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(run_or_fail, jobs))
    torch_libs = [f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"]
    # The fake takes the real library's soname, so the extension loads it in its place.
    run_or_fail(["g++", "-shared", "-Wl,-soname,libtorch_npu.so", str(out / "fake.o"), "-o",
                 str(out / "fake" / "libtorch_npu.so"), *torch_libs])
    # --no-undefined against the real libtorch_npu.so: every torch_npu symbol the
    # extension needs is one the real library exports.
    run_or_fail(["g++", "-shared", "-Wl,--no-undefined", str(out / "launcher.o"),
                 str(out / "opapi.o"), "-o", str(out / "ext" / "flash_cann_npu" / "_launcher.so"),
                 f"-L{wheel / 'lib'}", "-ltorch_npu", f"-Wl,-rpath,{out / 'fake'}", *torch_libs,
                 "-ldl"])
    (out / "not_a_library.so").write_text("not ELF")
    return out


def scenario_env(build: Path, log: str) -> dict:
    """The environment of a scenario process on the fake NPU: the fake torch_npu and the
    extension importable, the fake op package found after another vendor's library,
    aclnn calls logged to ``log``, no failure injected."""
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(FAKE), str(build / "ext"), str(ROOT / "python")]),
               FAKE_TORCH_NPU_LIB=str(build / "fake" / "libtorch_npu.so"),
               FAKE_ACLNN_LOG=str(build / log),
               ASCEND_CUSTOM_OPP_PATH=":".join(str(build / "vendors" / v)
                                               for v in ("other", "flash_cann")),
               BAD_LIBRARIES=":".join([str(build / "not_a_library.so"),
                                       str(build / "vendors" / "other" / LIBRARY)]))
    for name in ("ASCEND_OPP_PATH", "FAKE_NPU_CORE_CONTROL", "FAKE_ACLNN_FAIL",
                 "FAKE_ACLNN_INT_VALUES"):
        env.pop(name, None)
    return env
