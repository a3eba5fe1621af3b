"""TEST-ONLY: flash_cann's NPU call paths captured into torch.npu graphs on the fake NPU
(fake_npu_capture.h), where any host read of an npu tensor fails the capture. Prints one
JSON object. Run by tests/test_npu_capture.py in a fresh process, with the environment
of scenarios.py (FAKE_TORCH_NPU_LIB, FAKE_ACLNN_LOG, ASCEND_CUSTOM_OPP_PATH) and
FAKE_ACLNN_INT_VALUES=1 (the fake aclnn library logs what its integer inputs hold).

Each case runs in a capture of its own and reports the error (None if the capture went
through), the aclnn calls it logged, and the graph's task count; the cases of a feature
the npu backend does not list (the spec's backends.npu.features) are reported as
"unlisted" instead. The Triton-on-NPU host (backends/triton/npu.py) is captured too,
its launches recorded instead of run (there is no triton-ascend here).
"""

import json
import os

import torch

import flash_cann
from flash_cann.api import rotary as rotary_module
from flash_cann.backends.triton import npu as triton_npu
from flash_cann.contract.spec import load

import torch_npu  # noqa: E402,F401  (the fake; renames PrivateUse1 to "npu")

LOG = os.environ["FAKE_ACLNN_LOG"]
open(LOG, "w").close()
NPU_FEATURES = set(load().backends["npu"].features)
results = {}


def log_lines():
    with open(LOG) as f:
        lines = [json.loads(line) for line in f]
    open(LOG, "w").close()
    return lines


def error_of(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 -- the message is what is tested
        return f"{type(err).__name__}: {err}"
    return None


def on_npu(*shape, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to("npu")


def capture(fn):
    """fn() captured on a side stream; (graph, its result, error or None)."""
    graph, result = torch.npu.NPUGraph(), {}
    try:
        with torch.npu.graph(graph):
            result["value"] = fn()
    except Exception as err:  # noqa: BLE001
        return graph, None, f"{type(err).__name__}: {err}"
    return graph, result["value"], None


def case(name, fn, needs=()):
    """Capture fn; record its error, aclnn log and task count under ``name``."""
    missing = sorted(set(needs) - NPU_FEATURES)
    if missing:
        results[name] = {"unlisted": missing}
        return None
    log_lines()
    graph, value, error = capture(fn)
    results[name] = {"error": error, "log": log_lines(), "tasks": graph.tasks()}
    return graph, value


def aclnn_launches(log):
    return [entry for entry in log if entry["call"].startswith("aclnn")
            and "GetWorkspaceSize" not in entry["call"]]


# ---------------------------------------------------------------------------------------
# The capture mode's rules: each host read fails inside a capture and works outside.
# ---------------------------------------------------------------------------------------
x = torch.arange(6, dtype=torch.float32).to("npu")
repeats = torch.full((6,), 2).to("npu")
READS = {
    "item": lambda: x[1].item(),
    "int": lambda: int(x[2]),
    "bool": lambda: bool(x[0]),
    "cpu": lambda: x.cpu(),
    "tolist": lambda: x.tolist(),
    "nonzero": lambda: x.nonzero(),
    "repeat_interleave": lambda: torch.repeat_interleave(x, repeats),
    "mask_index": lambda: x[x > 2],
    "equal": lambda: torch.equal(x, x),
    "print": lambda: str(x),
    "synchronize": lambda: torch.npu.synchronize(),
    "accelerator_synchronize": lambda: torch.accelerator.synchronize(),
    "stream_synchronize": lambda: torch.npu.current_stream().synchronize(),
    "host_to_device": lambda: torch.tensor([1.0, 2.0]).to("npu"),
}
results["rules"] = {}
for name, read in READS.items():
    outside = error_of(read)
    graph = torch.npu.NPUGraph()
    with torch.npu.stream(torch.npu.Stream()):
        graph.capture_begin()
        inside = error_of(read)
        end = error_of(graph.capture_end)  # a caught error still fails the capture
    results["rules"][name] = {"outside": outside, "inside": inside, "capture_end": end}
rows = torch.tensor([0, 2]).to("npu")
results["rules_allowed"] = {  # device work that reads nothing on the host
    "integer_index": capture(lambda: x[rows] * 2)[2],
    "sized_repeat_interleave": capture(
        lambda: torch.repeat_interleave(x, repeats, output_size=12))[2],
    "is_capturing": [torch.npu.is_current_stream_capturing(),
                     capture(torch.npu.is_current_stream_capturing)[1]],
}
results["default_stream"] = {"error": error_of(lambda: torch.npu.NPUGraph().capture_begin())}

# Replay re-runs the recorded device work on the same memory: the static input is
# refilled (outside the capture), the graph replayed, and its outputs match eager's.
static_in = torch.zeros(4).to("npu")
index = torch.tensor([0, 2]).to("npu")
graph, outputs, _ = capture(lambda: ((static_in * 2 + 1)[index].clone(),
                                     static_in.add_(1) is static_in))
fresh = torch.tensor([1.0, 2.0, 3.0, 4.0])
static_in.copy_(fresh.to("npu"))
graph.replay()
results["replay_ops"] = {"replayed": outputs[0].cpu().tolist(), "input": static_in.cpu().tolist(),
                         "eager": ((fresh * 2 + 1)[[0, 2]]).tolist(),
                         "eager_input": (fresh + 1).tolist(), "tasks": graph.tasks()}

# ---------------------------------------------------------------------------------------
# The npu backend (the CANN package through aclnn) under capture.
# ---------------------------------------------------------------------------------------


def forward_backward(**features):
    q = on_npu(1, 6, 4, 8, seed=1).requires_grad_()
    k, v = on_npu(1, 6, 2, 8, seed=2).requires_grad_(), on_npu(1, 6, 2, 8, seed=3).requires_grad_()
    sinks = features.pop("sinks", None)

    def step():
        out = flash_cann.flash_attn_func(q, k, v, causal=True, sinks=sinks, **features)
        out.sum().backward()
        return out
    return step


slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).to("npu")
FEATURE_CASES = {
    "plain": ({}, ()),
    "window": ({"window_size": (3, 0)}, ("window",)),
    "softcap": ({"softcap": 20.0}, ("softcap",)),
    "alibi": ({"alibi_slopes": slopes}, ("alibi",)),
    "dropout": ({"dropout_p": 0.2}, ("dropout",)),
    "sinks": ({"sinks": torch.zeros(4).to("npu").requires_grad_()}, ("sinks",)),
}
for name, (features, needs) in FEATURE_CASES.items():
    case(f"npu_{name}", forward_backward(**features), needs)

# The layouts of the op itself, forward only: BNSD with a padding mask, BSH.
q, k, v = on_npu(2, 4, 8, 16), on_npu(2, 2, 12, 16), on_npu(2, 2, 12, 16)
mask = torch.ones(2, 12, dtype=torch.bool).to("npu")
case("npu_bnsd_masked", lambda: flash_cann.attention(q, k, v, causal=True, key_padding_mask=mask))

# Dropout: each replay draws a fresh seed on the device, which the replayed kernel reads.
made = case("npu_dropout_replays", forward_backward(dropout_p=0.2), ("dropout",))
if made is not None and results["npu_dropout_replays"]["error"] is None:
    graph, _ = made
    replays = []
    for _ in range(2):
        graph.replay()
        replays.append(log_lines())
    results["npu_dropout_replays"]["replays"] = replays

# Packed sequences (TND): cu_seqlens on the device, max_seqlen_* Python ints.
cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32).to("npu")
tq = on_npu(8, 4, 16, seed=4).requires_grad_()
tk, tv = on_npu(8, 2, 16, seed=5).requires_grad_(), on_npu(8, 2, 16, seed=6).requires_grad_()


def tnd_step():
    out = flash_cann.flash_attn_varlen_func(tq, tk, tv, cu, cu, 5, 5, causal=True,
                                            window_size=(4, 0), softcap=10.0)
    out.sum().backward()
    return out


case("npu_tnd", tnd_step, ("varlen",))


def tnd_replay():
    """A TND forward and backward captured with placeholder offsets, replayed after the
    real ones were written into the same cu_seqlens: its kernels read those, as eager's."""
    real = cu.clone()
    log_lines()
    tnd_step()
    eager = aclnn_launches(log_lines())
    cu.copy_(torch.tensor([0, 8, 8, 8], dtype=torch.int32).to("npu"))  # at capture
    graph, _, error = capture(tnd_step)
    cu.copy_(real)
    log_lines()
    if error is None:
        graph.replay()
    return {"error": error, "replay": aclnn_launches(log_lines()), "eager": eager}


results["npu_tnd_replay"] = tnd_replay() if "varlen" in NPU_FEATURES else {"unlisted": ["varlen"]}

# KV-cache decode: a contiguous cache with append (GQA), a paged one (page 4) with append,
# window, softcap, ALiBi and sinks.
def decode_inputs(paged, seed=0):
    cache = (on_npu(6, 4, 2, 16, seed=7), on_npu(6, 4, 2, 16, seed=8)) if paged else \
        (on_npu(2, 12, 2, 16, seed=7), on_npu(2, 12, 2, 16, seed=8))
    return dict(q=on_npu(2, 1, 4, 16, seed=9), k_cache=cache[0], v_cache=cache[1],
                k=on_npu(2, 1, 2, 16, seed=10 + seed), v=on_npu(2, 1, 2, 16, seed=11 + seed),
                cache_seqlens=torch.tensor([3, 6], dtype=torch.int32).to("npu"),
                block_table=torch.tensor([[5, 0, 2], [1, 4, 3]], dtype=torch.int32).to("npu")
                if paged else None)


def decode_call(inputs, **features):
    return flash_cann.flash_attn_with_kvcache(**inputs, causal=True, return_softmax_lse=True,
                                              **features)


contiguous, paged = decode_inputs(False), decode_inputs(True)
decode_sinks = torch.zeros(4).to("npu")
DECODE_FEATURES = dict(window_size=(5, 0), softcap=20.0, alibi_slopes=slopes, sinks=decode_sinks)
case("npu_decode", lambda: decode_call(contiguous), ("kvcache",))
case("npu_decode_paged", lambda: decode_call(paged, **DECODE_FEATURES),
     ("kvcache", "window", "softcap", "alibi", "sinks"))

# With rotary embeddings (positions from cache_seqlens, on the device) and cache_leftpad.
rotary = dict(rotary_cos=torch.rand(16, 4).to("npu"), rotary_sin=torch.rand(16, 4).to("npu"),
              cache_leftpad=torch.tensor([1, 2], dtype=torch.int32).to("npu"))
case("npu_decode_rotary_leftpad", lambda: decode_call(contiguous, **rotary), ("kvcache",))

# vLLM's call: TND queries (a prefill of 3 rows and a decode row) over a paged cache with
# seqused_k (no append), into vLLM's preallocated out; and packed keys with seqused_k.
vllm_q, vllm_cu = on_npu(4, 4, 16, seed=12), torch.tensor([0, 3, 4], dtype=torch.int32).to("npu")
vllm_used = torch.tensor([7, 9], dtype=torch.int32).to("npu")
vllm_out = torch.empty_like(vllm_q)
packed_k, packed_v = on_npu(10, 2, 16, seed=13), on_npu(10, 2, 16, seed=14)
packed_cu_k = torch.tensor([0, 6, 10], dtype=torch.int32).to("npu")


def vllm_step():
    return flash_cann.flash_attn_varlen_func(
        vllm_q, paged["k_cache"], paged["v_cache"], cu_seqlens_q=vllm_cu, max_seqlen_q=3,
        seqused_k=vllm_used, max_seqlen_k=12, block_table=paged["block_table"], causal=True,
        out=vllm_out)


def seqused_step():
    return flash_cann.flash_attn_varlen_func(
        vllm_q, packed_k, packed_v, vllm_cu, packed_cu_k, 3, 6, seqused_k=vllm_used - 3,
        causal=True)


case("npu_vllm", vllm_step, ("varlen", "kvcache"))
case("npu_seqused_k", seqused_step, ("varlen", "kvcache"))


# Replay of a paged decode step against eager on the same inputs: the append writes the
# same cache entries, and the replayed kernel reads the cache_seqlens, block table and
# lengths that the step's inputs hold at replay (set after the capture), as eager's did.
def snapshot(inputs):
    return {name: t.clone() if isinstance(t, torch.Tensor) else t for name, t in inputs.items()}


def decode_replay():
    start = decode_inputs(True, seed=100)  # new keys and values for the cache
    eager = snapshot(start)
    log_lines()
    decode_call(eager)
    eager_log = aclnn_launches(log_lines())
    static = snapshot(start)
    static["cache_seqlens"] = torch.zeros(2, dtype=torch.int32).to("npu")  # at capture
    graph, _, error = capture(lambda: decode_call(static))
    for name, t in start.items():  # the step's real inputs, set outside the capture
        if isinstance(t, torch.Tensor):
            static[name].copy_(t)
    log_lines()
    if error is None:
        graph.replay()
    return {"error": error, "replay": aclnn_launches(log_lines()), "eager": eager_log,
            "caches_equal": [bool(torch.equal(static[n].cpu(), eager[n].cpu()))
                             for n in ("k_cache", "v_cache")],
            "caches_changed": [not bool(torch.equal(start[n].cpu(), eager[n].cpu()))
                               for n in ("k_cache", "v_cache")]}


results["npu_decode_replay"] = (decode_replay() if "kvcache" in NPU_FEATURES
                                else {"unlisted": ["kvcache"]})

# The public API's host conveniences: a 0-d max_seqlen tensor is read outside a capture
# and refused inside one (naming max_seqlen_q); likewise a window_size tensor.
zero_d, window = torch.tensor(5).to("npu"), torch.tensor([2, 0]).to("npu")
with flash_cann.use_backend("triton"):
    results["api_max_seqlen"] = {
        "inside": capture(lambda: flash_cann.flash_attn_varlen_func(
            tq, tk, tv, cu, cu, zero_d, 5))[2],
        "window_inside": capture(lambda: flash_cann.flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            window_size=window))[2],
        # flash-attn's apply_rotary_emb on packed sequences, max_seqlen given (a check
        # that reads cu_seqlens only where that is free: CPU tensors).
        "rotary_packed": capture(lambda: rotary_module.apply_rotary_emb(
            tq, rotary["rotary_cos"], rotary["rotary_sin"], cu_seqlens=cu, max_seqlen=5))[2],
        "fusion_tnd_inside": capture(lambda: flash_cann.npu_fusion_attention(
            tq, tk, tv, 4, "TND", actual_seq_qlen=[3, 3, 8], actual_seq_kvlen=[3, 3, 8]))[2]}

# ---------------------------------------------------------------------------------------
# The Triton backend's NPU host (backends/triton/npu.py) under capture: the launches are
# recorded instead of run (no triton-ascend here), everything before them is captured.
# ---------------------------------------------------------------------------------------
launched = []
triton_npu.ai_cores = lambda device: 24
triton_npu.launch = lambda step: launched.append(step.name)


def triton_case(name, fn):
    launched.clear()
    graph, _, error = capture(fn)
    results[name] = {"error": error, "launched": list(launched), "tasks": graph.tasks()}


with flash_cann.use_backend("triton"):
    results["api_max_seqlen"]["outside"] = error_of(lambda: flash_cann.flash_attn_varlen_func(
        tq, tk, tv, cu, cu, zero_d, 5))
    for name, (features, _) in FEATURE_CASES.items():
        triton_case(f"triton_{name}", forward_backward(**features))
    triton_case("triton_tnd", tnd_step)
    triton_case("triton_decode", lambda: decode_call(contiguous))
    triton_case("triton_decode_paged", lambda: decode_call(paged, **DECODE_FEATURES))
    triton_case("triton_decode_rotary_leftpad", lambda: decode_call(contiguous, **rotary))
    triton_case("triton_vllm", vllm_step)
    triton_case("triton_seqused_k", seqused_step)
    results["triton_decode_replay"] = decode_replay()

print(json.dumps(results), flush=True)
# As triton_scenarios.py: leave without the interpreter's teardown.
os._exit(0)
