"""flash-cann's NPU extension (framework/csrc), built here and run on a fake NPU.

Built with -Wall -Wextra -Werror against torch's real C++ headers and TEST-ONLY stand-ins
for the few torch_npu / CANN declarations it uses (tests/npu_standins/include), then run
in a fresh process on a fake "npu" device (host memory) with a fake op library that
records what each aclnn call received (tests/npu_standins/fake_npu). Its aclnn
prototypes are written by hand, so this checks the extension's own logic -- argument
order and C types, aclTensor descriptions, workspace and stream, optional inputs, the
lazy NPU registration, library selection, every non-zero status turned into a message.
It does not check torch_npu, CANN or the kernels: they exist only on an Ascend server.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

import flash_cann
from flash_cann import aclnn
from flash_cann.opp_paths import LIBRARY

from native_build import needs

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "framework" / "csrc"
STANDINS = Path(__file__).resolve().parent / "npu_standins"
FAKE = STANDINS / "fake_npu"
ACL_DTYPES = {"torch.float16": 1, "torch.bfloat16": 27, "torch.float32": 0, "torch.bool": 12}
ACL_FORMAT_ND = 2
FAKE_STREAM = 0x5EED  # what the fake NPUStream::stream returns
FAKE_WORKSPACE = 4096  # what the fake stage 1 asks for

pytestmark = needs("g++", "gcc")


def _run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"{' '.join(map(str, cmd))}\n{done.stdout}{done.stderr}")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("npu_extension")
    generated = out / "generated"
    aclnn.write_headers(generated)
    torch_lib = Path(torch.__file__).parent / "lib"
    cxx = ["g++", "-std=c++17", "-fPIC", "-O0", "-Wall", "-Wextra", "-Werror",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
           *[f"-isystem{p}" for p in torch.utils.cpp_extension.include_paths()],
           f"-I{STANDINS / 'include'}", f"-I{CSRC}", f"-I{generated}"]
    # One translation unit for the two torch-heavy sources keeps CI (2 cores) fast.
    unity = out / "launcher_unity.cpp"
    unity.write_text("".join(f'#include "{CSRC / name}"\n'
                             for name in ("aclnn_call.cpp", "flash_cann_npu.cpp")))
    package = out / "vendors" / "flash_cann" / "op_api" / "lib"
    other = out / "vendors" / "other" / "op_api" / "lib"
    for d in (package, other, out / "ext" / "flash_cann_npu"):
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
        list(pool.map(_run, jobs))
    torch_libs = [f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"]
    _run(["g++", "-shared", str(out / "fake.o"), "-o", str(out / "libfake_torch_npu.so"),
          *torch_libs])
    # --no-undefined: the extension needs nothing from torch_npu beyond the stand-ins.
    _run(["g++", "-shared", "-Wl,--no-undefined", str(out / "launcher.o"), str(out / "opapi.o"),
          "-o", str(out / "ext" / "flash_cann_npu" / "_launcher.so"), f"-L{out}",
          "-lfake_torch_npu", f"-Wl,-rpath,{out}", *torch_libs, "-ldl"])
    (out / "not_a_library.so").write_text("not ELF")
    return out


@pytest.fixture(scope="module")
def results(build):
    env = dict(os.environ,
               # This checkout's package too: the subprocess must run the sources under
               # test, not whatever flash_cann the environment has installed.
               PYTHONPATH=os.pathsep.join([str(FAKE), str(build / "ext"),
                                           str(Path(flash_cann.__file__).parents[1])]),
               FAKE_TORCH_NPU_LIB=str(build / "libfake_torch_npu.so"),
               FAKE_ACLNN_LOG=str(build / "aclnn.jsonl"),
               ASCEND_CUSTOM_OPP_PATH=":".join(str(build / "vendors" / v)
                                               for v in ("other", "flash_cann")),
               BAD_LIBRARIES=":".join([str(build / "not_a_library.so"),
                                       str(build / "vendors" / "other" / LIBRARY)]))
    env.pop("ASCEND_OPP_PATH", None)
    done = subprocess.run([sys.executable, str(FAKE / "scenarios.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _calls(log, name):
    return [entry for entry in log if entry["call"] == name]


def _check_lifecycle(log, stage1, stage2):
    """Stage 1 once, stage 2 once with its workspace, executor and the current stream,
    every aclTensor destroyed."""
    assert len(_calls(log, stage1)) == 1 and _calls(log, stage1)[0]["status"] == 0
    assert _calls(log, stage2) == [{"call": stage2, "workspace": True,
                                    "workspace_size": FAKE_WORKSPACE, "executor_ok": True,
                                    "stream": FAKE_STREAM, "status": 0}]
    assert len(_calls(log, "aclCreateTensor")) == len(_calls(log, "aclDestroyTensor")) > 0


def _check_tensor(received, given, name):
    """What aclnn received for one tensor: the given one, or its dense copy."""
    if given is None:
        assert received is None, name
        return
    assert received["dims"] == given["dims"], name
    assert received["dtype"] == ACL_DTYPES[given["dtype"]], name
    assert received["format"] == ACL_FORMAT_ND, name
    if given["contiguous"]:
        assert received["data"] == given["data"], name  # storage base, no copy
        assert received["offset"] == given["offset"], name
        assert received["strides"] == given["strides"], name
        assert received["storage"] == [given["storage_elements"]], name
    else:  # a dense copy, described from its own storage
        assert received["data"] != given["data"], name
        assert received["strides"] == list(torch.empty(given["dims"]).stride()), name
        assert received["offset"] == 0 and received["storage"] == [
            int(torch.Size(given["dims"]).numel())], name


def test_extension_is_loaded_lazily_and_only_from_a_library_with_our_symbols(results, build):
    assert results["imported_before"] == {"torch_npu": False}
    error = results["bad_libraries"]["error"]
    assert error.startswith("RuntimeError: flash_cann: no candidate is the flash-cann op "
                            "package's aclnn library:")
    assert f"\n  {build / 'not_a_library.so'}: " in error  # dlopen's reason, e.g. too short
    # The forward's functions are required; the backward's are not while the package
    # has no backward kernel (npu.backward is false in the spec).
    assert (f"{build / 'vendors' / 'other' / LIBRARY}: does not export "
            f"aclnnFlashCannAttentionGetWorkspaceSize, aclnnFlashCannAttention, "
            f"aclCreateTensor") in error
    # ASCEND_CUSTOM_OPP_PATH lists "other" first: skipped, as torch_npu skips it.
    assert results["available"] == {"reason": None,
                                    "loaded": str(build / "vendors" / "flash_cann" / LIBRARY)}


def test_extension_built_from_another_spec_is_reported(results):
    reason = results["stale_extension"]["reason"]
    assert "was built from another op spec" in reason
    assert "pip install --no-build-isolation ./framework" in reason


@pytest.mark.parametrize("case", ["fwd_bnsd_gqa", "fwd_bsnd_strided_masked"])
def test_forward_reaches_aclnn_with_the_spec_arguments(results, case):
    result = results[case]
    _check_lifecycle(result["log"], "aclnnFlashCannAttentionGetWorkspaceSize",
                     "aclnnFlashCannAttention")
    stage1 = _calls(result["log"], "aclnnFlashCannAttentionGetWorkspaceSize")[0]
    for name, given in result["tensors"].items():
        _check_tensor(stage1[name], given, name)
    assert {k: stage1[k] for k in ("scale", "causal", "layout")} == result["attrs"]
    out, lse, query = (result["tensors"][n] for n in ("out", "softmax_lse", "query"))
    assert out["dims"] == query["dims"] and out["contiguous"] and out["dtype"] == query["dtype"]
    assert lse["dtype"] == "torch.float32" and lse["contiguous"]


def test_bsh_with_mqa_runs_as_a_bsnd_view(results):
    result = results["fwd_bsh_mqa"]
    stage1 = _calls(result["log"], "aclnnFlashCannAttentionGetWorkspaceSize")[0]
    assert stage1["layout"] == "BSND"
    for name in ("query", "key", "value"):
        _check_tensor(stage1[name], result["tensors"][name], name)
    assert stage1["softmax_lse"]["dims"] == [1, 4, 5]
    assert result["out_shape"] == [1, 5, 32]


def test_backward_is_refused_while_the_package_has_no_backward_kernel(results):
    assert results["bwd_refused"]["error"].startswith(
        "NotImplementedError: flash_cann: the Ascend package has no backward kernel yet")


def test_backward_through_autograd_reaches_aclnn(results):
    """With the spec's npu.backward switched on, as once the Grad kernel exists."""
    result = results["bwd_autograd"]
    log = result["log"]
    _check_lifecycle(log, "aclnnFlashCannAttentionGradGetWorkspaceSize",
                     "aclnnFlashCannAttentionGrad")
    stage1 = _calls(log, "aclnnFlashCannAttentionGradGetWorkspaceSize")[0]
    for name, given in result["tensors"].items():
        _check_tensor(stage1[name], given, name)
    assert {k: stage1[k] for k in ("scale", "causal", "layout")} == result["attrs"]


@pytest.mark.parametrize("case, stage, status, meaning", [
    ("stage1_161002", "aclnnFlashCannAttentionGetWorkspaceSize", 161002,
     "ACLNN_ERR_PARAM_INVALID: parameter check failed"),
    ("stage2_561003", "aclnnFlashCannAttention", 561003,
     "ACLNN_ERR_INNER_FIND_KERNEL_ERROR: no kernel binary matches"),
    ("stage1_unknown", "aclnnFlashCannAttentionGetWorkspaceSize", 4242,
     "not in CANN's public aclnn status table"),
])
def test_every_failing_status_is_an_exception_that_explains_it(results, case, stage, status,
                                                               meaning):
    error, log = results[case]["error"], results[case]["log"]
    assert error.startswith(f"RuntimeError: flash_cann: flash_cann::fwd on NPU: {stage} "
                            f"returned aclnn status {status} ({meaning}")
    assert ("arguments: query=Half[2, 4, 8, 16], key=Half[2, 2, 12, 16], "
            "value=Half[2, 2, 12, 16], key_padding_mask=None, scale=0.25, causal=False, "
            "layout=BNSD, out=Half[2, 4, 8, 16], softmax_lse=Float[2, 4, 8]") in error
    assert error.rstrip().endswith("CANN: fake CANN: the op rejected its arguments")
    # Nothing leaks on failure, and a failed stage 1 never reaches stage 2.
    assert len(_calls(log, "aclCreateTensor")) == len(_calls(log, "aclDestroyTensor"))
    assert bool(_calls(log, "aclnnFlashCannAttention")) == (stage == "aclnnFlashCannAttention")


def test_launcher_refuses_a_strided_output(results):
    assert ("flash_cann: flash_cann::fwd: output out must be a dense tensor in a plain NPU "
            "format") in results["strided_output"]["error"]
