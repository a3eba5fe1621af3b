"""flash-cann's NPU call paths captured into torch.npu graphs (torch_npu's ACL graphs) on
the fake NPU, whose capture mode fails on any host read of an npu tensor
(tests/npu_standins/fake_npu/fake_npu_capture.h).

First the capture mode itself: each kind of host read fails inside a capture (naming the
operation, and failing capture_end even if caught) and works outside; replay re-runs the
recorded device work on new inputs. Then flash-cann under it: the npu backend (the
extension and the op package's aclnn API, faked) for the plain forward and backward and
each feature, the public API's conveniences that read a tensor on the host, and the
Triton backend's NPU host (its launches recorded, not run). The npu backend's
packed-sequence (TND), KV-cache and vLLM cases run once the spec's npu backend lists
varlen / kvcache; until then they skip, naming the missing feature.

This checks flash-cann's host code and the stand-in's model of a capture, not torch_npu
or CANN: on an NPU a capture is untested.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from native_build import needs
from npu_extension_build import FAKE, build_extension, scenario_env

pytestmark = needs("g++", "gcc")

FORWARD, BACKWARD = "aclnnFlashCannAttention", "aclnnFlashCannAttentionGrad"
CAPTURE_FAILS = "RuntimeError: fake torch_npu: the NPU graph capture was invalidated by: "
ACTIVE = "Current npuStreamCaptureStatus: npuStreamCaptureStatusActive"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    build = build_extension(tmp_path_factory)
    env = dict(scenario_env(build, "capture.jsonl"), FAKE_ACLNN_INT_VALUES="1")
    done = subprocess.run([sys.executable, str(FAKE / "capture_scenarios.py")], env=env,
                          capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def _listed(result: dict) -> dict:
    """The case's result, or a skip naming the features the npu backend lacks."""
    if "unlisted" in result:
        pytest.skip(f"the npu backend does not list {', '.join(result['unlisted'])} yet "
                    f"(the spec's backends.npu.features)")
    return result


def _captured_launches(log: list[dict]) -> list[str]:
    return [entry["call"] for entry in log if entry.get("captured")]


@pytest.mark.parametrize("read, operation", [
    ("item", "aten::_local_scalar_dense (Tensor.item(), int(), float(), bool()"),
    ("int", "aten::_local_scalar_dense"),
    ("bool", "aten::_local_scalar_dense"),
    ("equal", "aten::equal"),
    ("cpu", "a copy of an npu tensor to the host (Tensor.cpu(), .tolist()"),
    ("tolist", "a copy of an npu tensor to the host"),
    ("nonzero", "aten::nonzero"),
    ("repeat_interleave", "aten::repeat_interleave.Tensor"),
    ("mask_index", "aten::nonzero"),
    ("print", "aten::masked_select"),
    ("synchronize", "torch.npu.synchronize()"),
    ("stream_synchronize", "torch.npu.synchronize()"),
    ("accelerator_synchronize", "synchronize (device)"),
    ("host_to_device", "a copy from host memory into an npu tensor"),
])
def test_a_host_read_fails_the_capture_and_works_outside(results, read, operation):
    """Each rule of the capture mode fires: the read raises inside the capture naming the
    operation, capture_end fails although the error was caught, and outside a capture
    the same read works."""
    rule = results["rules"][read]
    assert rule["outside"] is None
    assert rule["inside"].startswith(f"RuntimeError: fake torch_npu: {operation}"), rule
    assert rule["inside"].endswith(ACTIVE), rule
    assert rule["capture_end"] == CAPTURE_FAILS + rule["inside"].removeprefix("RuntimeError: ")


def test_device_work_that_reads_nothing_is_captured(results):
    assert results["rules_allowed"] == {"integer_index": None, "sized_repeat_interleave": None,
                                        "is_capturing": [False, True]}
    assert results["default_stream"]["error"] == (
        "RuntimeError: NPU graphs must be captured on a non-default stream. (However, after "
        "capture, it's ok to replay them on the default stream.)")


def test_replay_reruns_the_recorded_work_on_new_inputs(results):
    """A static input refilled after the capture: the replay's outputs and in-place update
    are eager's on the new values (mul, add, an integer index, a clone, an add_)."""
    replay = results["replay_ops"]
    assert replay["replayed"] == replay["eager"]
    assert replay["input"] == replay["eager_input"]
    assert replay["tasks"] == 5


@pytest.mark.parametrize("case", ["plain", "window", "softcap", "alibi", "dropout", "sinks"])
def test_npu_forward_and_backward_are_captured(results, case):
    """flash_attn_func and loss.backward() on the npu backend, each feature alone: no
    host read; the forward's and the Grad op's aclnn launches go into the graph."""
    result = _listed(results[f"npu_{case}"])
    assert result["error"] is None
    assert _captured_launches(result["log"]) == [FORWARD, BACKWARD]


def test_npu_forward_with_a_padding_mask_is_captured(results):
    result = results["npu_bnsd_masked"]
    assert result["error"] is None
    assert _captured_launches(result["log"]) == [FORWARD]


def test_each_dropout_replay_draws_its_seed_on_the_device(results):
    """The seed is drawn by a device op inside the graph: each replay's kernels read a new
    one (the forward and its backward the same), none frozen at capture."""
    result = _listed(results["npu_dropout_replays"])
    assert result["error"] is None
    seeds = []
    for replay in result["replays"]:
        assert [c["call"] for c in replay] == [FORWARD, BACKWARD]
        assert all(c["replay"] and c["workspace"] for c in replay)
        (forward, backward) = (c["int_values"]["rng_state"] for c in replay)
        assert forward == backward and forward[1] == 0
        seeds.append(forward[0])
    assert seeds[0] != seeds[1]


@pytest.mark.parametrize("case, launches", [
    ("npu_tnd", [FORWARD, BACKWARD]),
    ("npu_decode", None),
    ("npu_decode_paged", None),
    ("npu_decode_rotary_leftpad", None),
    ("npu_vllm", None),
    ("npu_seqused_k", None),
])
def test_npu_packed_and_kvcache_calls_are_captured(results, case, launches):
    """TND forward and backward (cu_seqlens on the device), KV-cache decoding with append
    (contiguous; paged with window, softcap, ALiBi, sinks; rotary and cache_leftpad),
    vLLM's paged varlen call into its out= and packed keys with seqused_k: no host read,
    and at least one aclnn launch captured (the decode kernel's name is its engineer's)."""
    result = _listed(results[case])
    assert result["error"] is None
    captured = _captured_launches(result["log"])
    assert captured == launches if launches else captured


def test_a_replayed_packed_step_reads_the_offsets_of_replay_time(results):
    """TND forward and backward captured with placeholder cu_seqlens; the real offsets
    written into the same tensors afterwards; the replayed kernels read them (eager's
    values), not the capture's."""
    result = _listed(results["npu_tnd_replay"])
    assert result["error"] is None
    assert [c["call"] for c in result["replay"]] == [FORWARD, BACKWARD]
    assert [c["int_values"] for c in result["replay"]] == \
        [c["int_values"] for c in result["eager"]]


@pytest.mark.parametrize("backend", ["npu", "triton"])
def test_a_replayed_decode_step_matches_eager(results, backend):
    """A paged decode step with append, captured with placeholder cache_seqlens; the
    step's inputs set after the capture; the replay leaves the caches as eager does (on
    Triton's host the append is device ops, which write where the device values say) and,
    on the npu backend, its kernels read the integer inputs (lengths, block table) eager's
    read. (Should the npu kernel take over the append, the stand-in's kernel writes
    nothing: the caches then stay as they were in both.)"""
    result = _listed(results[f"{backend}_decode_replay"])
    assert result["error"] is None
    assert result["caches_equal"] == [True, True]
    if backend == "triton":
        assert result["caches_changed"] == [True, True]  # the append wrote something
    else:
        assert result["replay"], "nothing replayed"
        assert [(c["call"], c["int_values"]) for c in result["replay"]] == \
            [(c["call"], c["int_values"]) for c in result["eager"]]


def test_api_host_conveniences_are_refused_by_name_under_capture(results):
    """A 0-d tensor for max_seqlen_q is read outside a capture and refused inside one,
    naming the argument; a window_size tensor and npu_fusion_attention's TND lists
    likewise."""
    api = results["api_max_seqlen"]
    assert api["outside"] is None
    assert api["inside"] == (
        "RuntimeError: flash_cann: max_seqlen_q (a 0-d tensor on npu) would be read on the "
        "host, which waits for the device; a graph capture forbids that "
        "(torch.npu.is_current_stream_capturing() is True): pass max_seqlen_q as a Python "
        "int, the bound the graph's launches are sized for")
    assert api["window_inside"].startswith(
        "RuntimeError: flash_cann: window_size (a tensor on npu) would be read on the host")
    assert api["rotary_packed"] is None  # apply_rotary_emb reads nothing on the device
    # torch_npu.npu_fusion_attention's signature takes host lists: refused up front.
    assert api["fusion_tnd_inside"].startswith(
        "RuntimeError: flash_cann: actual_seq_qlen / actual_seq_kvlen (host lists in "
        "torch_npu's signature, copied to the device) would be read on the host")


TRAINING = ["fwd", "preprocess", "dkdv", "dq"]


@pytest.mark.parametrize("case, launched", [
    *((f"triton_{name}", TRAINING)
      for name in ("plain", "window", "softcap", "alibi", "dropout", "sinks", "tnd")),
    ("triton_decode", ["decode"]), ("triton_decode_paged", ["decode"]),
    ("triton_decode_rotary_leftpad", ["decode"]), ("triton_vllm", ["decode"]),
    ("triton_seqused_k", ["decode"]),
])
def test_triton_npu_host_is_captured(results, case, launched):
    """The Triton backend's NPU host (backends/triton/npu.py) under capture, every
    feature, packed sequences and the decode kernel: no host read before its launches."""
    result = results[case]
    assert result["error"] is None
    assert result["launched"] == launched


def test_the_cann_shells_read_no_input_values_on_the_host():
    """What the stand-in cannot see: CANN's host side. An OpDef input marked ValueDepend is
    copied to the host for the tiling function (TilingContext::GetInputTensor /
    GetOptionalInputTensor read it) -- a synchronisation at every call, which breaks a
    capture (Huawei's FusedInferAttentionScore marks actual_seq_lengths so, hence
    torch_npu's NPUGraph.update). flash-cann's tiling reads shapes and attributes only:
    cu_seqlens, cache_seqlens and block tables are the kernels' to read."""
    root = Path(__file__).resolve().parents[1] / "op_host"
    found = [f"{path.relative_to(root.parent)}:{number}: {line.strip()}"
             for path in sorted(root.rglob("*")) if path.suffix in (".cpp", ".h")
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bValueDepend\s*\(|\bGet(Optional)?InputTensor\s*\(", line)]
    assert not found, "host reads of input values in the CANN shells:\n" + "\n".join(found)


def test_capturing_reads_the_device_modules_probe(monkeypatch):
    """contract.capture itself, with no device: a device type is captured exactly while
    its torch module's is_current_stream_capturing() says so; the CPU never is, nor a
    device type whose module has no such probe; refuse_host_read raises only then,
    naming what would be read, the probe, and what to pass instead."""
    import torch

    from flash_cann.contract import capture

    state = {"capturing": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    cuda = torch.device("cuda")
    assert capture.capturing(cuda) is False
    capture.refuse_host_read(cuda, "max_seqlen_q (a 0-d tensor)", "pass an int")
    state["capturing"] = True
    assert capture.capturing(cuda) is True
    with pytest.raises(RuntimeError, match=re.escape(
            "flash_cann: max_seqlen_q (a 0-d tensor) would be read on the host, which waits "
            "for the device; a graph capture forbids that "
            "(torch.cuda.is_current_stream_capturing() is True): pass an int")):
        capture.refuse_host_read(cuda, "max_seqlen_q (a 0-d tensor)", "pass an int")
    assert capture.capturing(torch.device("cpu")) is False
    assert not hasattr(torch, "meta")  # a device type without a module, so without a probe
    assert capture.capturing(torch.device("meta")) is False
    capture.refuse_host_read(torch.device("meta"), "x", "y")
