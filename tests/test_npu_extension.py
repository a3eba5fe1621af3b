"""flash-cann's NPU extension (framework/csrc), built here against the real torch_npu and
run on a fake NPU.

Compiled with -Wall -Wextra -Werror against torch's C++ headers and the real torch-npu
2.13.0 wheel's headers (which ship CANN's acl/ headers; the aclnn declarations are our
own, framework/csrc/aclnn_types.h), and linked with --no-undefined against the wheel's
real libtorch_npu.so (tests/torch_npu_wheel.py). It then runs in a fresh process against
a fake libtorch_npu.so of the same soname -- an "npu" device in host memory -- and a fake
op library that records what each aclnn call received (tests/npu_standins/fake_npu). Its
aclnn prototypes are written by hand, so this checks the extension's own logic --
argument order and C types, aclTensor descriptions, workspace and stream, optional
inputs, op-plugin's stream-resource steps, the lazy NPU registration, library selection,
the backward from loss.backward() to the Grad op, every non-zero status turned into a
message. It does not check torch_npu's behaviour, CANN or the kernels: they exist only on
an Ascend server.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from flash_cann.backends.npu.opp_paths import LIBRARY

from native_build import needs
from npu_extension_build import CSRC, FAKE, build_extension, run_or_fail, scenario_env

ACL_DTYPES = {"torch.float16": 1, "torch.bfloat16": 27, "torch.float32": 0, "torch.bool": 12,
              "torch.int64": 9, "torch.int32": 3}
ACL_FORMAT_ND = 2
FAKE_STREAM = 0x5EED  # what the fake NPUStream::stream returns
FAKE_WORKSPACE = 4096  # what the fake stage 1 asks for

pytestmark = needs("g++", "gcc")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return build_extension(tmp_path_factory)


@pytest.fixture(scope="module")
def results(build):
    done = subprocess.run([sys.executable, str(FAKE / "scenarios.py")],
                          env=scenario_env(build, "aclnn.jsonl"), capture_output=True,
                          text=True, timeout=3600)
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
    # Every function of the spec's ops is required (npu.backward: the Grad op has a kernel).
    assert (f"{build / 'vendors' / 'other' / LIBRARY}: does not export "
            f"aclnnFlashCannAttentionGetWorkspaceSize, aclnnFlashCannAttention, "
            f"aclnnFlashCannAttentionGradGetWorkspaceSize, aclnnFlashCannAttentionGrad, "
            f"aclnnFlashCannAttentionKVCacheGetWorkspaceSize, aclnnFlashCannAttentionKVCache, "
            f"aclCreateTensor") in error
    # ASCEND_CUSTOM_OPP_PATH lists "other" first: skipped, as torch_npu skips it.
    assert results["available"] == {"reason": None,
                                    "loaded": str(build / "vendors" / "flash_cann" / LIBRARY)}


def test_extension_built_from_another_spec_is_reported(results):
    reason = results["stale_extension"]["reason"]
    assert "was built from another op spec" in reason
    assert "pip install --no-build-isolation ./framework" in reason


def _forward_stage1(result) -> dict:
    """The forward's first-stage aclnn call, after checking the two-stage lifecycle and
    that each tensor the scenario passed reached it as given."""
    _check_lifecycle(result["log"], "aclnnFlashCannAttentionGetWorkspaceSize",
                     "aclnnFlashCannAttention")
    stage1 = _calls(result["log"], "aclnnFlashCannAttentionGetWorkspaceSize")[0]
    for name, given in result["tensors"].items():
        _check_tensor(stage1[name], given, name)
    return stage1


@pytest.mark.parametrize("case", ["fwd_bnsd_gqa", "fwd_bsnd_strided_masked", "fwd_kv_views"])
def test_forward_reaches_aclnn_with_the_spec_arguments(results, case):
    result = results[case]
    if case == "fwd_kv_views":  # dense views of a larger storage, described as such
        value = result["tensors"]["value"]
        assert value["contiguous"] and value["offset"] > 0
        assert value["storage_elements"] == 2 * torch.Size(value["dims"]).numel()
    stage1 = _forward_stage1(result)
    assert {k: stage1[k] for k in ("scale", "causal", "layout")} == result["attrs"]
    out, lse, query = (result["tensors"][n] for n in ("out", "softmax_lse", "query"))
    assert out["dims"] == query["dims"] and out["contiguous"] and out["dtype"] == query["dtype"]
    assert lse["dtype"] == "torch.float32" and lse["contiguous"]


FEATURE_ATTRS = ("window_left", "window_right", "softcap", "dropout_p")


@pytest.mark.parametrize("case", ["fwd_window_softcap_alibi", "fwd_batch_alibi_dropout"])
def test_forward_features_reach_aclnn(results, case):
    """Window bounds (normalised: causal is the right bound), softcap and dropout_p as
    int64_t / double attributes, the ALiBi slopes and rng_state as aclTensors: fp32
    (heads_q,) slopes as the caller's tensor (not the checks' stride-0 expansion), fp32
    (batch, heads_q) slopes, int64 (2,) rng_state, each without a copy."""
    result = results[case]
    stage1 = _forward_stage1(result)
    assert {k: stage1[k] for k in result["attrs"]} == result["attrs"]


def test_the_decode_op_reaches_aclnn_with_the_appended_lengths(results):
    """fwd_kvcache on NPU tensors: FlashCannAttentionKVCache's aclnn API gets the caches
    and the block table as given, key = value = None (the contract appended already), the
    lengths as an int32 (batch,) device tensor, the spec's attributes; one stage each."""
    case = results["kvcache_paged"]
    log = case["log"]
    _check_lifecycle(log, "aclnnFlashCannAttentionKVCacheGetWorkspaceSize",
                     "aclnnFlashCannAttentionKVCache")
    call = _calls(log, "aclnnFlashCannAttentionKVCacheGetWorkspaceSize")[0]
    for name, given in case["tensors"].items():
        _check_tensor(call[name], given, name)
    assert call["cache_seqlens"]["dims"] == [2]
    assert call["cache_seqlens"]["dtype"] == ACL_DTYPES["torch.int32"]
    for name, value in case["attrs"].items():
        assert call[name] == value, name


def test_packed_sequences_reach_both_kernels_as_device_tensors(results):
    """flash_attn_varlen_func (TND): cu_seqlens_q/k reach aclnn as the caller's int32
    tensors (no copy, so no host round trip), max_seqlen_q/k as int64_t attributes, lse
    (heads_q, tokens_q); loss.backward() hands the Grad kernel the same tensors."""
    result = results["fwd_varlen"]
    stage1 = _forward_stage1(result)
    assert {k: stage1[k] for k in result["attrs"]} == result["attrs"]
    assert stage1["softmax_lse"]["dims"] == [4, 9]
    result = results["bwd_varlen"]
    stage1 = _calls(result["log"], "aclnnFlashCannAttentionGradGetWorkspaceSize")[0]
    assert {k: stage1[k] for k in result["attrs"]} == result["attrs"]
    for name, given in result["tensors"].items():
        _check_tensor(stage1[name], given, name)
    assert stage1["softmax_lse"]["dims"] == [4, 9]


def test_plain_calls_pass_the_features_defaults(results):
    stage1 = _calls(results["fwd_bnsd_gqa"]["log"], "aclnnFlashCannAttentionGetWorkspaceSize")[0]
    assert {k: stage1[k] for k in FEATURE_ATTRS} == dict(window_left=-1, window_right=-1,
                                                         softcap=0.0, dropout_p=0.0)
    assert stage1["alibi_slopes"] is None and stage1["rng_state"] is None
    assert stage1["sinks"] is None
    assert stage1["cu_seqlens_q"] is None and stage1["cu_seqlens_k"] is None
    assert (stage1["max_seqlen_q"], stage1["max_seqlen_k"]) == (0, 0)


def test_the_grad_kernel_always_gets_a_grad_sinks_output(results):
    """grad_sinks is an output of the CANN backward op with or without sinks: fp32
    (heads_q,), dense, allocated by the launcher."""
    for case, heads_q in (("bwd_loss_backward", 4), ("bwd_autograd", 2), ("bwd_features", 4)):
        stage1 = _calls(results[case]["log"], "aclnnFlashCannAttentionGradGetWorkspaceSize")[0]
        grad_sinks = stage1["grad_sinks"]
        assert grad_sinks["dims"] == [heads_q], case
        assert grad_sinks["dtype"] == ACL_DTYPES["torch.float32"], case
        assert grad_sinks["strides"] == [1] and grad_sinks["offset"] == 0, case


def test_backward_features_reach_the_grad_kernel(results):
    """loss.backward() through the op with dropout, window, softcap, ALiBi and sinks:
    the Grad op's aclnn call gets the forward's attributes, slopes, rng_state tensor and
    sinks."""
    result = results["bwd_features"]
    log = result["log"]
    _check_lifecycle(log, "aclnnFlashCannAttentionGradGetWorkspaceSize",
                     "aclnnFlashCannAttentionGrad")
    stage1 = _calls(log, "aclnnFlashCannAttentionGradGetWorkspaceSize")[0]
    assert {k: stage1[k] for k in result["attrs"]} == result["attrs"]
    _check_tensor(stage1["alibi_slopes"], result["tensors"]["alibi_slopes"], "alibi_slopes")
    _check_tensor(stage1["sinks"], result["tensors"]["sinks"], "sinks")
    assert result["sinks_grad"] == [4]  # grad_sinks reached the sinks through autograd
    rng_state = stage1["rng_state"]
    assert rng_state == result["forward_rng_state"]  # the very tensor the forward drew
    assert rng_state["dims"] == [2] and rng_state["dtype"] == ACL_DTYPES["torch.int64"]
    forward = _calls(log, "aclnnFlashCannAttentionGetWorkspaceSize")[0]
    assert {k: forward[k] for k in FEATURE_ATTRS} == {k: result["attrs"][k]
                                                      for k in FEATURE_ATTRS}


def test_bsh_with_mqa_runs_as_a_bsnd_view(results):
    result = results["fwd_bsh_mqa"]
    stage1 = _calls(result["log"], "aclnnFlashCannAttentionGetWorkspaceSize")[0]
    assert stage1["layout"] == "BSND"
    for name in ("query", "key", "value"):
        _check_tensor(stage1[name], result["tensors"][name], name)
    assert stage1["softmax_lse"]["dims"] == [1, 4, 5]
    assert result["out_shape"] == [1, 5, 32]


def test_loss_backward_reaches_the_grad_kernel_with_deterministic(results):
    """loss.backward() through flash_attn_func(deterministic=True) on NPU tensors: the Grad
    op's aclnn API gets the forward's tensors, attributes and deterministic=True."""
    result = results["bwd_loss_backward"]
    log = result["log"]
    _check_lifecycle(log, "aclnnFlashCannAttentionGradGetWorkspaceSize",
                     "aclnnFlashCannAttentionGrad")
    stage1 = _calls(log, "aclnnFlashCannAttentionGradGetWorkspaceSize")[0]
    for name, given in result["tensors"].items():
        _check_tensor(stage1[name], given, name)
    assert {k: stage1[k] for k in result["attrs"]} == result["attrs"]
    assert stage1["grad_out"]["dims"] == result["tensors"]["out"]["dims"]
    assert stage1["softmax_lse"]["dims"] == [1, 4, 4]  # (batch, heads_q, seqlen_q), fp32
    assert stage1["softmax_lse"]["dtype"] == ACL_DTYPES["torch.float32"]
    # The forward ran first (its aclnn API), then the backward, once each.
    calls = [c["call"] for c in log if c["call"].startswith("aclnn")]
    assert calls == ["aclnnFlashCannAttentionGetWorkspaceSize", "aclnnFlashCannAttention",
                     "aclnnFlashCannAttentionGradGetWorkspaceSize", "aclnnFlashCannAttentionGrad"]


def test_backward_through_autograd_reaches_aclnn(results):
    """Gradients of both outputs, a key padding mask and grad_softmax_lse fed, BNSD."""
    result = results["bwd_autograd"]
    log = result["log"]
    _check_lifecycle(log, "aclnnFlashCannAttentionGradGetWorkspaceSize",
                     "aclnnFlashCannAttentionGrad")
    stage1 = _calls(log, "aclnnFlashCannAttentionGradGetWorkspaceSize")[0]
    for name, given in result["tensors"].items():
        _check_tensor(stage1[name], given, name)
    assert {k: stage1[k] for k in result["attrs"]} == result["attrs"]


@pytest.mark.parametrize("case, stage, status", [
    ("bwd_stage1_561002", "aclnnFlashCannAttentionGradGetWorkspaceSize", 561002),
    ("bwd_stage2_561003", "aclnnFlashCannAttentionGrad", 561003),
])
def test_a_failing_grad_call_is_explained_like_the_forwards(results, case, stage, status):
    error, log = results[case]["error"], results[case]["log"]
    assert error.startswith(f"RuntimeError: flash_cann: flash_cann::bwd on NPU: {stage} "
                            f"returned aclnn status {status} (")
    assert ("layout=BNSD, deterministic=False, max_seqlen_q=0, max_seqlen_k=0, window_left=-1, "
            "window_right=-1, softcap=0, dropout_p=0, fp16_scores=False, grad_query=Half[1, 2, 4, 8], "
            "grad_key=Half[1, 2, 6, 8], "
            "grad_value=Half[1, 2, 6, 8], grad_sinks=Float[2]") in error
    assert len(_calls(log, "aclCreateTensor")) == len(_calls(log, "aclDestroyTensor"))


def test_backward_is_refused_when_the_spec_says_the_package_has_none(results):
    assert results["bwd_refused"]["error"].startswith(
        "NotImplementedError: flash_cann: the spec says the Ascend package has no backward "
        "kernel (backends.npu.backward: false)")
    assert not results["bwd_refused"]["log"]  # nothing reached aclnn


def test_each_stage_takes_the_streams_resources_when_torch_npu_asks(results):
    """op-plugin's EXEC_NPU_CMD: check_enqueue_need_use before stage 1, and
    check_dequeue_need_use inside the queued stage 2, each followed by
    aclrtUseStreamResInCurrentThread(stream) when it says so."""
    calls = [(c["call"], c.get("stream")) for c in results["core_control"]["log"]
             if c["call"] != "aclCreateTensor" and c["call"] != "aclDestroyTensor"]
    assert calls == [("aclrtUseStreamResInCurrentThread", FAKE_STREAM),
                     ("aclnnFlashCannAttentionGetWorkspaceSize", None),
                     ("aclrtUseStreamResInCurrentThread", FAKE_STREAM),
                     ("aclnnFlashCannAttention", FAKE_STREAM)]
    # Each check decides its own stage: the enqueue check stage 1's, the dequeue check stage 2's.
    for stage, before in (("enqueue", "aclnnFlashCannAttentionGetWorkspaceSize"),
                          ("dequeue", "aclnnFlashCannAttention")):
        calls = [c["call"] for c in results[f"core_control_{stage}"]["log"]
                 if c["call"] not in ("aclCreateTensor", "aclDestroyTensor")]
        assert calls[calls.index(before) - 1] == "aclrtUseStreamResInCurrentThread", stage
        assert calls.count("aclrtUseStreamResInCurrentThread") == 1, stage
    # ...and without core control (every other scenario), never.
    assert not _calls(results["fwd_bnsd_gqa"]["log"], "aclrtUseStreamResInCurrentThread")
    # A failure to take them stops the call before stage 1, and nothing leaks.
    failing = results["core_control_failing"]
    assert failing["error"] == ("RuntimeError: flash_cann: aclrtUseStreamResInCurrentThread "
                                "returned 107002")
    assert not [c for c in failing["log"] if c["call"].startswith("aclnn")]


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
            "value=Half[2, 2, 12, 16], key_padding_mask=None, cu_seqlens_q=None, "
            "cu_seqlens_k=None, alibi_slopes=None, rng_state=None, sinks=None, scale=0.25, "
            "causal=False, layout=BNSD, max_seqlen_q=0, max_seqlen_k=0, window_left=-1, "
            "window_right=-1, softcap=0, dropout_p=0, fp16_scores=False, out=Half[2, 4, 8, 16], "
            "softmax_lse=Float[2, 4, 8]") in error
    assert error.rstrip().endswith("CANN: fake CANN: the op rejected its arguments")
    # Nothing leaks on failure, and a failed stage 1 never reaches stage 2.
    assert len(_calls(log, "aclCreateTensor")) == len(_calls(log, "aclDestroyTensor"))
    assert bool(_calls(log, "aclnnFlashCannAttention")) == (stage == "aclnnFlashCannAttention")


def test_launcher_refuses_a_strided_output(results):
    assert ("flash_cann: flash_cann::fwd: output out must be a dense tensor in a plain NPU "
            "format") in results["strided_output"]["error"]


_OLD_TORCH_NPU = """
namespace c10_npu { struct NPUStream; }  // no core control: no stream-resource checks
struct Command { static void RunOpApi(const std::string &, std::function<int()>, bool = false); };
"""
_NEW_TORCH_NPU = """
namespace c10_npu {
bool check_enqueue_need_use(void *stream);
bool check_dequeue_need_use(void *stream);
}
struct Command {
  static void RunOpApi(const std::string &, std::function<int()>, bool = false);
  static void RunOpApiV2(const std::string &, const std::function<int()> &, bool = false);
};
"""


@pytest.mark.parametrize("declarations, present", [(_OLD_TORCH_NPU, False),
                                                   (_NEW_TORCH_NPU, True)], ids=["old", "new"])
def test_compile_time_detection_of_op_plugins_calls(tmp_path, declarations, present):
    """torch_npu_compat.h finds check_enqueue/dequeue_need_use and RunOpApiV2 exactly when
    the torch_npu headers declare them (the real 2.13.0 headers: the tests above)."""
    probe = tmp_path / "probe.cpp"
    probe.write_text(
        "#include <functional>\n#include <string>\n" + declarations +
        '#include "torch_npu_compat.h"\n'
        "using flash_cann_npu::compat::HasRunOpApiV2;\n"
        "using flash_cann_npu::compat::kHasStreamResourceChecks;\n"
        f"static_assert(kHasStreamResourceChecks<void *> == {str(present).lower()});\n"
        f"static_assert(HasRunOpApiV2<Command, std::function<int()>>::value == "
        f"{str(present).lower()});\n"
        "void Use() {\n"
        "  flash_cann_npu::compat::StreamResourcesNeeded(static_cast<void *>(nullptr),\n"
        "                                                flash_cann_npu::compat::Stage::kEnqueue);\n"
        "  flash_cann_npu::compat::RunOpApi<Command>(\"op\", std::function<int()>());\n"
        "}\n")
    run_or_fail(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                 f"-I{CSRC}", str(probe)])


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception),
                                         ("", pytest.skip.Exception)], ids=["CI", "elsewhere"])
def test_an_unavailable_wheel_fails_in_ci_and_skips_elsewhere(monkeypatch, tmp_path, ci, outcome):
    import torch_npu_wheel as wheel
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(wheel, "CACHE", tmp_path)
    monkeypatch.setattr(wheel.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "ERROR: No matching distribution found for torch-npu==2.13.0"))
    with pytest.raises(outcome, match="the torch-npu 2.13.0 wheel is needed: pip download "
                                      "torch-npu==2.13.0 failed: ERROR: No matching"):
        wheel.torch_npu_wheel()
