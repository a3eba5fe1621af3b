"""The CANN shells (op_host/flash_cann_attention.cpp, the forward;
op_host/flash_cann_attention_grad.cpp, the backward) compiled against a recording stand-in
of CANN's host API (tests/cann_host): their OpDefs say what the YAML spec says, their
TilingFuncs fill exactly the planners' plans and turn refusals and inconsistent operands
into failures, and InferShape/InferDataType give the spec's output shapes and dtypes.
(The shells were also syntax-checked against the public CANN headers; they have not run on
an NPU.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flash_cann.ascend import planner
from flash_cann.contract import variant

import contract
from contract import RAW
from native_build import built, run

SPEC = RAW
DRIVER = "cann_host/op_host_stub_driver"
DTYPES = {"input": ["float16", "bfloat16"], "accumulator": ["float32", "float32"],
          "bool": ["bool", "bool"], "float32": ["float32", "float32"],
          "int64": ["int64", "int64"], "int32": ["int32", "int32"]}


def _opdefs():
    result = run(DRIVER, "opdefs")
    assert result.returncode == 0, result.stderr
    return {op["type"]: op for op in json.loads(result.stdout)}


@pytest.mark.parametrize("op", contract.CANN_OPS, ids=lambda op: op["name"])
def test_opdef_matches_spec(op):
    """The OpDef has the CANN op's arguments: the spec's, less those of features the npu
    backend does not list (and the autograd-only attributes)."""
    defs = _opdefs()
    d = defs[op["cann_op_type"]]
    inputs = contract.cann_inputs(op)
    assert [i["name"] for i in d["inputs"]] == [i["name"] for i in inputs]
    for got, want in zip(d["inputs"], inputs):
        assert got["presence"] == ("optional" if want.get("optional") else "required")
        assert got["dtypes"] == DTYPES[want["dtype"]], want["name"]
        assert got["auto_contiguous"]
    outputs = contract.cann_outputs(op)
    assert [o["name"] for o in d["outputs"]] == [o["name"] for o in outputs]
    for got, want in zip(d["outputs"], outputs):
        assert got["dtypes"] == DTYPES[want["dtype"]], want["name"]
    attrs = contract.cann_attrs(op)
    assert [a["name"] for a in d["attrs"]] == [a["name"] for a in attrs]
    for got, want in zip(d["attrs"], attrs):
        assert got["type"] == want["type"]
        assert got["presence"] == ("optional" if "default" in want else "required")
        if "default" in want:
            expected = want["default"]
            if isinstance(expected, bool):
                assert got["default"] == str(expected).lower(), want["name"]
            elif isinstance(expected, (int, float)):
                assert float(got["default"]) == expected, want["name"]
            else:
                assert got["default"] == expected, want["name"]
    assert d["has_infer_shape"] and d["has_infer_dtype"]
    assert d["socs"] == ["ascend910b", "ascend910_93"] and d["has_tiling"]


def _tiling(layout, dtype, causal, mask, q, k, cores=None):
    args = ["tiling", "FlashCannAttention", layout, dtype, str(int(causal)), str(int(mask)),
            "0.125", *map(str, q), *map(str, k)] + ([str(cores)] if cores else [])
    result = run(DRIVER, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.parametrize("layout, q, k", [
    ("BNSD", (2, 8, 1000, 64), (2, 2, 1200, 64)),
    ("BSND", (2, 1000, 8, 80), (2, 1200, 2, 80)),
])
@pytest.mark.parametrize("causal, mask", [(False, False), (True, True)])
def test_tiling_func_writes_the_planners_plan(layout, q, k, causal, mask):
    got, _ = _tiling(layout, "bf16", causal, mask, q, k)
    b, hq, sq, d = (q[0], q[1], q[2], q[3]) if layout == "BNSD" else (q[0], q[2], q[1], q[3])
    hk, sk = (k[1], k[2]) if layout == "BNSD" else (k[2], k[1])
    p = planner.plan("Ascend910B2", b, hq, sq, d, heads_kv=hk, seqlen_k=sk, dtype="bfloat16",
                     layout=layout, causal=causal, has_mask=mask, scale=0.125)
    assert got["status"] == "ok"
    assert got["tiling_key"] == p["tiling_key"] and got["block_dim"] == p["block_dim"]
    assert got["workspace"] == p["user_workspace_bytes"] + 16 * 1024 * 1024
    assert got["tiling_size"] == p["tiling"]["tiling_bytes"]
    assert (got["block_q"], got["block_k"]) == (p["tiling"]["block_q"], p["tiling"]["block_k"])
    assert got["last_row"] == b * hq * sq and got["scale"] == 0.125


def test_tiling_func_reads_the_platform():
    got, _ = _tiling("BNSD", "fp16", False, False, (1, 4, 4096, 128), (1, 4, 4096, 128), cores=7)
    assert got["block_dim"] == 7


@pytest.mark.parametrize("cores", ["24:24", "24:72"])
def test_tiling_funcs_refuse_a_platform_without_two_vector_cores_per_ai_core(cores):
    """The kernels pair each AI core with two vector cores: a platform reporting another
    ratio is refused, naming both counts."""
    aic, aiv = cores.split(":")
    message = (f"the kernel pairs each AI core with 2 vector cores (platform reports {aic} AIC, "
               f"{aiv} AIV)")
    got, stderr = _tiling("BNSD", "fp16", False, False, (1, 4, 512, 64), (1, 4, 512, 64),
                          cores=cores)
    assert got["status"] == "failed" and message in stderr
    got, stderr = _grad_tiling("BNSD", "fp16", False, False, False, (1, 4, 512, 64),
                               (1, 4, 512, 64), cores=cores)
    assert got["status"] == "failed" and message in stderr


def test_refusal_becomes_a_failed_status_with_the_reason():
    got, stderr = _tiling("BNSD", "fp16", False, False, (1, 8, 128, 300), (1, 8, 128, 300))
    assert got["status"] == "failed"
    assert "refused: head_dim 300 exceeds the kernel's maximum of 256" in stderr


def _grad_tiling(layout, dtype, causal, mask, deterministic, q, k, *, grad_lse=False,
                 cores=0, misshape=None):
    args = ["grad-tiling", layout, dtype, *(str(int(f)) for f in
                                            (causal, mask, deterministic, grad_lse)),
            "0.125", *map(str, q), *map(str, k), str(cores)] + ([misshape] if misshape else [])
    result = run(DRIVER, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.parametrize("layout, q, k", [
    ("BNSD", (2, 8, 1000, 64), (2, 2, 1200, 64)),
    ("BSND", (2, 1000, 8, 80), (2, 1200, 2, 80)),
])
@pytest.mark.parametrize("causal, mask, deterministic", [(False, False, False),
                                                         (True, True, True)])
def test_grad_tiling_func_writes_the_planners_plan(layout, q, k, causal, mask, deterministic):
    got, _ = _grad_tiling(layout, "bf16", causal, mask, deterministic, q, k, grad_lse=mask)
    b, hq, sq, d = (q[0], q[1], q[2], q[3]) if layout == "BNSD" else (q[0], q[2], q[1], q[3])
    hk, sk = (k[1], k[2]) if layout == "BNSD" else (k[2], k[1])
    p = planner.grad_plan("Ascend910B2", b, hq, sq, d, heads_kv=hk, seqlen_k=sk,
                          dtype="bfloat16", layout=layout, causal=causal, has_mask=mask,
                          deterministic=deterministic, scale=0.125)
    assert got["status"] == "ok"
    assert got["tiling_key"] == p["tiling_key"] == 20100 + 1011 * causal * deterministic
    assert got["block_dim"] == p["block_dim"] == got["used_cores"]
    assert got["workspace"] == p["user_workspace_bytes"] + 16 * 1024 * 1024
    assert got["tiling_size"] == p["tiling"]["tiling_bytes"]
    assert (got["block_q"], got["block_k"]) == (p["tiling"]["block_q"], p["tiling"]["block_k"])
    assert got["query_units"] == p["tiling"]["query_units"]
    assert (got["query_units"] > 0) == deterministic
    assert got["last_unit"] == got["units"] == p["tiling"]["units"] and got["scale"] == 0.125


def test_tiling_funcs_set_batch_schedule_mode_where_the_kernel_syncs_all_cores():
    """The backward's pre-pass and the decode's split combine wait across blocks
    (SyncAll<true>): their TilingFuncs ask for batch mode (SetScheduleMode(1): every block
    resident at once); the forward waits within an AI core only and keeps the normal mode."""
    forward, _ = _tiling("BNSD", "fp16", False, False, (1, 4, 512, 64), (1, 4, 512, 64))
    grad, _ = _grad_tiling("BNSD", "fp16", False, False, False, (1, 4, 512, 64), (1, 4, 512, 64))
    decode, stderr = _kvcache_tiling("BSND", "bf16", (2, 1, 8, 64), (6, 128, 2, 64),
                                     cache_seqlens="2", block_table="2x3")
    assert decode["status"] == "ok", stderr
    assert (forward["schedule_mode"], grad["schedule_mode"], decode["schedule_mode"]) == (0, 1, 1)


def test_grad_tiling_func_reads_the_platform():
    got, _ = _grad_tiling("BNSD", "fp16", False, False, False, (1, 4, 4096, 128),
                          (1, 4, 4096, 128), cores=7)
    assert got["block_dim"] == 7


@pytest.mark.parametrize("misshape, message", [
    ("grad_out", "grad_out must have the shape of query"),
    ("out", "out must have the shape of query"),
    ("value", "value must have the shape of key"),
    ("softmax_lse", "softmax_lse must have shape (batch, heads_q, seqlen_q) = (1, 8, 128)"),
    ("grad_softmax_lse", "grad_softmax_lse must have the shape of softmax_lse"),
    ("key_padding_mask", "key_padding_mask must have shape (batch, seqlen_k) = (1, 256)"),
])
def test_grad_tiling_func_refuses_inconsistent_operands(misshape, message):
    got, stderr = _grad_tiling("BNSD", "fp16", False, True, False, (1, 8, 128, 64),
                               (1, 8, 256, 64), grad_lse=True, misshape=misshape)
    assert got["status"] == "failed"
    assert f"[flash_cann][FlashCannAttentionGrad] {message}" in stderr


def test_grad_refusal_becomes_a_failed_status_with_the_reason():
    got, stderr = _grad_tiling("BNSD", "fp16", False, False, False, (1, 8, 128, 300),
                               (1, 8, 128, 300))
    assert got["status"] == "failed"
    assert "refused: head_dim 300 exceeds the kernel's maximum of 256" in stderr


@pytest.mark.parametrize("layout, q, k", [
    ("BNSD", (2, 8, 100, 64), (2, 2, 50, 64)),
    ("BSND", (2, 100, 8, 64), (2, 50, 2, 64)),
])
def test_grad_infer_shape_and_dtype(layout, q, k):
    result = run(DRIVER, "infer", "FlashCannAttentionGrad", layout, "bf16", *map(str, q),
                 *map(str, k))
    got = json.loads(result.stdout)
    assert got["status"] == "ok"
    # grad_sinks: fp32 (heads_q,), whether or not the sinks input is given
    heads_q = q[1] if layout == "BNSD" else q[2]
    assert got["outputs"] == [{"dtype": "bfloat16", "shape": list(s)} for s in (q, k, k)] + [
        {"dtype": "float32", "shape": [heads_q]}]


@pytest.mark.parametrize("layout, q, lse", [
    ("BNSD", (2, 8, 100, 64), [2, 8, 100]),
    ("BSND", (2, 100, 8, 64), [2, 8, 100]),
])
def test_infer_shape_and_dtype(layout, q, lse):
    result = run(DRIVER, "infer", "FlashCannAttention", layout, "bf16", *map(str, q),
                 *map(str, q))
    got = json.loads(result.stdout)
    assert got["status"] == "ok"
    assert got["outputs"] == [{"dtype": "bfloat16", "shape": list(q)},
                              {"dtype": "float32", "shape": lse}]


# The features reach the planner request: (NAME=VALUE arguments of the driver, what the
# request's variant must hold). Problem: batch 2, heads_q 4, seqlen_q 128, seqlen_k 256.
FEATURE_CASES = [
    ({}, dict(window_left=-1, window_right=-1, softcap=0, dropout_p=0, alibi=0)),
    ({"window_left": 32, "window_right": 8}, dict(window_left=32, window_right=8)),
    # window_bounds' normalisation: causal is the right bound, a bound >= seqlen_k unbounded
    ({"causal": True, "window_left": 300, "window_right": 5},
     dict(window_left=-1, window_right=-1, causal=True)),
    ({"window_left": 16, "window_right": 256}, dict(window_left=16, window_right=-1)),
    ({"window_left": 256, "window_right": 8}, dict(window_left=-1, window_right=8)),
    ({"softcap": 30.0}, dict(softcap=30.0)),
    ({"dropout_p": 0.1, "rng_state": "2"},
     dict(dropout_p=pytest.approx(0.1), dropout_threshold=variant.dropout_threshold(0.1))),
    ({"alibi_slopes": "4"}, dict(alibi=1)),
    ({"alibi_slopes": "2x4"}, dict(alibi=2)),
    ({"sinks": "4"}, dict(sinks=1)),
    ({"causal": True, "window_left": 64, "softcap": 50.0, "alibi_slopes": "2x4",
      "dropout_p": 0.25, "rng_state": "2", "sinks": "4"},
     dict(causal=True, window_left=64, window_right=-1, softcap=50.0, alibi=2, dropout_p=0.25,
          dropout_threshold=variant.dropout_threshold(0.25), sinks=1)),
]
Q_SHAPE, K_SHAPE = (2, 4, 128, 64), (2, 4, 256, 64)


def _feature_call(op, features, misshape=None):
    """Runs op's TilingFunc in the driver with ``features``; (result, stderr)."""
    features = dict(features)
    causal = features.pop("causal", False)
    named = [f"{k}={v}" for k, v in features.items()]
    if op == "fwd":
        args = ["tiling", "FlashCannAttention", "BNSD", "fp16", str(int(causal)), "0", "0.125",
                *map(str, Q_SHAPE), *map(str, K_SHAPE)]
    else:
        args = ["grad-tiling", "BNSD", "fp16", str(int(causal)), "0", "0", "0", "0.125",
                *map(str, Q_SHAPE), *map(str, K_SHAPE), "0"]
    result = run(DRIVER, *args, *named)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def _planner_features(features):
    window = (-1 if features.get("window_left", -1) >= K_SHAPE[2] else
              features.get("window_left", -1),
              -1 if features.get("causal") or features.get("window_right", -1) >= K_SHAPE[2]
              else features.get("window_right", -1))
    alibi = {None: None, "4": "head", "2x4": "batch_head"}[features.get("alibi_slopes")]
    return planner.variant(window=window, softcap=features.get("softcap", 0.0),
                           dropout_p=features.get("dropout_p", 0.0), alibi=alibi,
                           sinks="sinks" in features)


@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("features, expected", FEATURE_CASES, ids=str)
def test_tiling_func_puts_the_features_into_the_plan_request(op, features, expected):
    """The attributes and optional inputs of the features become the PlanRequest's variant
    (normalised as variant.window_bounds, the alibi mode from the slopes' rank); the
    TilingFunc then does what the planner says of that request."""
    got, stderr = _feature_call(op, features)
    request = got["request"]
    plain = dict(window_left=-1, window_right=-1, softcap=0, dropout_p=0, dropout_threshold=0,
                 alibi=0, sinks=0, causal=False)
    assert {k: request[k] for k in plain} == {**plain, **expected}
    assert (request["batch"], request["heads_q"], request["seqlen_k"]) == (2, 4, 256)
    plan = planner.plan if op == "fwd" else planner.grad_plan
    try:
        p = plan("Ascend910B2", 2, 4, 128, 64, seqlen_k=256, causal=features.get("causal", False),
                 scale=0.125, features=_planner_features(features))
    except planner.PlanRefused as refused:
        assert got["status"] == "failed"
        assert f"refused: {str(refused).split('refused: ', 1)[1]}" in stderr
    else:
        assert got["status"] == "ok" and got["tiling_key"] == p["tiling_key"]


@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("features, message", [
    ({"alibi_slopes": "3"}, "alibi_slopes must have shape (heads_q,) = (4,) or (batch, heads_q) "
                            "= (2, 4) (got (3,))"),
    ({"alibi_slopes": "4x4"}, "alibi_slopes must have shape (heads_q,) = (4,) or (batch, "
                              "heads_q) = (2, 4) (got (4, 4))"),
    ({"alibi_slopes": "2x4x1"}, "(got (2, 4, 1))"),
    ({"rng_state": "3", "dropout_p": 0.1}, "rng_state must have shape (2,): (seed, offset) "
                                           "(got (3,))"),
    ({"dropout_p": 0.1}, "dropout_p 0.1 > 0 needs the rng_state input (int64 (seed, offset))"),
    ({"sinks": "2"}, "sinks must have shape (heads_q,) = (4,) (got (2,))"),
    ({"sinks": "2x4"}, "sinks must have shape (heads_q,) = (4,) (got (2, 4))"),
    ({"window_left": -2}, "window_left and window_right must be >= -1 (-1: unbounded) "
                          "(got -2, -1)"),
    # causal replaces the right bound, but a bad one is refused first
    ({"causal": True, "window_right": -3}, "(got -1, -3)"),
    ({"softcap": -1.0}, "refused: softcap must be finite and >= 0 (0: off)"),
    ({"dropout_p": 1.0, "rng_state": "2"}, "refused: dropout_p must be in [0, 1)"),
], ids=str)
def test_tiling_func_refuses_bad_feature_arguments_by_name(op, features, message):
    got, stderr = _feature_call(op, features)
    assert got["status"] == "failed"
    assert message in stderr
    if not message.startswith("refused"):  # the shell's own check: no request reached the planner
        assert got["request"] is None


# Layout TND: query (tokens, heads, head_dim); the problem's batch is cu_seqlens' length
# - 1 (its shape, never its values) and seqlen_q/k are max_seqlen_q/k.
TND_Q, TND_K = ("300", "4", "64", "_"), ("500", "2", "64", "_")
TND_FEATURES = {"cu_seqlens_q": "4", "cu_seqlens_k": "4", "max_seqlen_q": 120,
                "max_seqlen_k": 260}


def _packed_call(op, causal=False, mask=False, **changes):
    features = {k: v for k, v in {**TND_FEATURES, **changes}.items() if v is not None}
    named = [f"{k}={v}" for k, v in features.items()]
    if op == "fwd":
        args = ["tiling", "FlashCannAttention", "TND", "bf16", str(int(causal)), str(int(mask)),
                "0.125", *TND_Q, *TND_K]
    else:
        args = ["grad-tiling", "TND", "bf16", str(int(causal)), str(int(mask)), "1", "1", "0.125",
                *TND_Q, *TND_K, "0"]
    result = run(DRIVER, *args, *named)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("causal", [False, True])
def test_tiling_func_plans_packed_sequences_from_shapes(op, causal):
    """TND: the request holds batch = len(cu_seqlens) - 1, max_seqlen_q/k and the token
    counts (no value of cu_seqlens is read on the host), and the TilingFunc writes what the
    planner makes of it."""
    got, stderr = _packed_call(op, causal)
    request = got["request"]
    assert (request["layout"], request["batch"], request["heads_q"]) == (2, 3, 4)
    assert (request["seqlen_q"], request["seqlen_k"]) == (120, 260)
    assert (request["tokens_q"], request["tokens_k"]) == (300, 500)
    features = planner.variant(tokens=(300, 500))
    if op == "fwd":
        p = planner.plan("Ascend910B2", 3, 4, 120, 64, heads_kv=2, seqlen_k=260, dtype="bfloat16",
                         layout="TND", causal=causal, scale=0.125, features=features)
    else:
        p = planner.grad_plan("Ascend910B2", 3, 4, 120, 64, heads_kv=2, seqlen_k=260,
                              dtype="bfloat16", layout="TND", causal=causal, deterministic=True,
                              scale=0.125, features=features)
    assert got["status"] == "ok", stderr
    assert got["tiling_key"] == p["tiling_key"] and got["block_dim"] == p["block_dim"]
    assert got["workspace"] == p["user_workspace_bytes"] + 16 * 1024 * 1024


@pytest.mark.parametrize("op", ["fwd", "bwd"])
@pytest.mark.parametrize("changes, message", [
    ({"cu_seqlens_k": None}, "layout TND needs cu_seqlens_q and cu_seqlens_k (int32, batch + 1)"),
    ({"cu_seqlens_q": "1", "cu_seqlens_k": "1"},
     "cu_seqlens_q must have shape (batch + 1,) with batch >= 1 (got (1,))"),
    ({"cu_seqlens_k": "5"}, "cu_seqlens_k must have the shape of cu_seqlens_q, (4,) (got (5,))"),
    ({"max_seqlen_q": 0}, "max_seqlen_q and max_seqlen_k must be >= 1 with layout TND (got 0, 260)"),
    ({"mask": True}, "key_padding_mask is not taken with layout TND"),
], ids=str)
def test_tiling_func_refuses_bad_packed_arguments_by_name(op, changes, message):
    changes = dict(changes)
    mask = changes.pop("mask", False)
    got, stderr = _packed_call(op, mask=mask, **changes)
    assert got["status"] == "failed"
    assert message in stderr


def test_the_shells_refuse_a_query_that_is_not_16_bit():
    got, stderr = _tiling("BNSD", "fp32", False, False, (1, 4, 128, 64), (1, 4, 128, 64))
    assert got["status"] == "failed" and got["request"] is None
    assert "query dtype must be float16 or bfloat16" in stderr
    got, stderr = _kvcache_tiling("BSND", "fp32", (2, 1, 8, 64), (2, 256, 2, 64),
                                  cache_seqlens="2")
    assert got["status"] == "failed" and got["request"] is None
    assert "query dtype must be float16 or bfloat16" in stderr


def _kvcache_tiling(layout, dtype, q, cache, **named):
    """FlashCannAttentionKVCache's TilingFunc on a node of these shapes; ``named``: its
    optional int32 inputs (their dimensions, "2x3") and max_seqlen_q / num_splits."""
    result = run(DRIVER, "kvcache-tiling", layout, dtype, "0.125", *map(str, q),
                 *map(str, cache), *(f"{k}={v}" for k, v in named.items()))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.parametrize("layout, q, named, expected", [
    # a paged cache (6 pages of 128 keys, 3 a sequence), GQA 8/2, num_splits forced
    ("BSND", (2, 1, 8, 64), {"cache_seqlens": "2", "block_table": "2x3", "num_splits": 3},
     {"batch": 2, "seqlen_q": 1, "tokens_q": 0, "tnd": False, "paged": True, "max_blocks": 3,
      "leftpad": False, "splits": 3}),
    # vLLM's packed rows: batch from cache_seqlens, seqlen_q = max_seqlen_q, tokens_q = rows
    ("TND", (9, 8, 64, "_"), {"cache_seqlens": "3", "block_table": "3x2", "cu_seqlens_q": "4",
                              "max_seqlen_q": 5, "cache_leftpad": "3"},
     {"batch": 3, "seqlen_q": 5, "tokens_q": 9, "tnd": True, "paged": True, "max_blocks": 2,
      "leftpad": True, "splits": 0}),
], ids=["paged", "tnd"])
def test_kvcache_tiling_func_plans_from_shapes(layout, q, named, expected):
    """The decode op's request comes from shapes and attributes only (no value of
    cache_seqlens, block_table or cu_seqlens_q is read), and the planner plans it."""
    got, stderr = _kvcache_tiling(layout, "bf16", q, (6, 128, 2, 64), **named)
    assert got["status"] == "ok", stderr
    assert got["request"] == {"heads_q": 8, "heads_kv": 2, "head_dim": 64, **expected}


@pytest.mark.parametrize("layout, q, named, message", [
    ("TND", (9, 8, 64, "_"), {"cache_seqlens": "3", "max_seqlen_q": 5},
     "cu_seqlens_q must be int32 (batch + 1,) = (4,) for layout TND"),
    ("TND", (9, 8, 64, "_"), {"cache_seqlens": "3", "cu_seqlens_q": "4"},
     "max_seqlen_q must be >= 1 for layout TND"),
    ("BSND", (2, 1, 8, 64), {"cache_seqlens": "2", "cu_seqlens_q": "3"},
     "cu_seqlens_q is taken with layout TND only"),
    ("BSND", (2, 1, 8, 64), {}, "cache_seqlens (int32 (batch,), the keys of each sequence) is "
                                "required by the Ascend kernel"),
    ("BSND", (2, 1, 8, 64), {"cache_seqlens": "2", "num_splits": 200},
     "num_splits must be in [0, 128] (got 200)"),
    ("BSND", (2, 1, 8, 64), {"cache_seqlens": "2", "block_table": "2x1", "cache_batch_idx": "2"},
     "cache_batch_idx is not taken with a paged cache (block_table)"),
    ("TND", (2, 8, 64, "_"), {"cache_seqlens": "2", "cu_seqlens_q": "3", "max_seqlen_q": 1,
                              "block_table": "2x1", "cache_batch_idx": "2"},
     "cache_batch_idx is not taken with a paged cache (block_table)"),
    ("TND", (2, 1, 8, 64), {"cache_seqlens": "2", "cu_seqlens_q": "3", "max_seqlen_q": 1},
     "query must be (tokens_q, heads_q, head_dim) for layout TND"),
], ids=str)
def test_kvcache_tiling_func_refuses_bad_arguments_by_name(layout, q, named, message):
    got, stderr = _kvcache_tiling(layout, "fp16", q, (2, 256, 2, 64), **named)
    assert got["status"] == "failed" and got["request"] is None
    assert message in stderr


@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_dense_layouts_refuse_packed_arguments(op):
    got, stderr = _feature_call(op, {"cu_seqlens_q": "3", "cu_seqlens_k": "3"})
    assert got["status"] == "failed" and got["request"] is None
    assert "cu_seqlens_q/k and max_seqlen_q/k are only taken with layout TND" in stderr


def test_infer_shape_of_packed_sequences():
    """TND: out like query, softmax_lse (heads_q, tokens_q); the gradients like their inputs."""
    got = json.loads(run(DRIVER, "infer", "FlashCannAttention", "TND", "fp16", *TND_Q,
                         *TND_K).stdout)
    assert got == {"status": "ok", "outputs": [{"dtype": "float16", "shape": [300, 4, 64]},
                                                 {"dtype": "float32", "shape": [4, 300]}]}
    got = json.loads(run(DRIVER, "infer", "FlashCannAttentionGrad", "TND", "fp16", *TND_Q,
                         *TND_K).stdout)
    assert got["status"] == "ok"
    assert [o["shape"] for o in got["outputs"]] == [[300, 4, 64], [500, 2, 64], [500, 2, 64], [4]]


ROOT = Path(__file__).resolve().parents[1]


def _kernel_gm_parameters(source: Path, entry: str) -> list[str]:
    """The GM parameters of ``entry``'s ``__global__`` signature in ``source``, snake_case."""
    text = source.read_text()
    head = text[text.index(f"__aicore__ void {entry}("):]
    params = head[head.index("(") + 1:head.index(")")].split(",")
    names = [p.split()[-1] for p in params]
    return [re.sub(r"(?<!^)([A-Z])", r"_\1", n).lower() for n in names]


@pytest.mark.parametrize("op", contract.CANN_OPS, ids=lambda op: op["name"])
def test_kernel_entry_takes_the_opdef_tensors_in_order(op, kernel_dir=ROOT / "op_kernel"):
    """CANN binds the OpDef's inputs, then its outputs, then workspace and tiling to the
    kernel's GM parameters by position: the kernel entry must list exactly those."""
    entry = {"FlashCannAttention": "flash_cann_attention",
             "FlashCannAttentionGrad": "flash_cann_attention_grad",
             "FlashCannAttentionKVCache": "flash_cann_attention_kvcache"}[op["cann_op_type"]]
    got = _kernel_gm_parameters(kernel_dir / f"{entry}.cpp", entry)
    d = _opdefs()[op["cann_op_type"]]
    want = [t["name"] for t in d["inputs"] + d["outputs"]] + ["workspace", "tiling"]
    if "alibi_slopes" not in got:
        pytest.skip(f"op_kernel/{entry}.cpp on this branch predates issue 23's GM signature "
                    f"(the feature kernels land on their own branches): {got}")
    # The decode kernel takes TND queries (cu_seqlens_q) already; the CANN op gains the
    # input when the npu backend lists varlen (issue 24's TND work, another branch).
    ahead = [name for name in got if name not in want]
    if ahead == ["cu_seqlens_q"] and "varlen" not in contract.RAW["backends"]["npu"]["features"]:
        pytest.skip(f"op_kernel/{entry}.cpp takes cu_seqlens_q, which the CANN op has once the "
                    f"npu backend lists varlen")
    assert got == want


@pytest.mark.parametrize("shell", ["flash_cann_attention.cpp", "flash_cann_attention_grad.cpp",
                                   "flash_cann_attention_kvcache.cpp"])
def test_shell_compiles_against_installed_cann_headers(shell):
    """On a machine with CANN, compile each shell against the real headers in all three
    OP_ADD modes (graph prototype, tiling, op_build); elsewhere say why this is skipped."""
    import os
    import shutil
    import subprocess

    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    include = Path(home or "/nonexistent") / "include"
    if not (include / "register" / "op_def_registry.h").is_file():
        pytest.skip("CANN is not installed (ASCEND_HOME_PATH/include/register/op_def_registry.h "
                    f"not found): op_host/{shell} is compiled here only against the recording "
                    "stand-in in tests/cann_host")
    root = Path(__file__).resolve().parents[1]
    compiler = shutil.which("g++") or shutil.which("c++")
    for mode in ([], ["-DOP_PROTO_LIB"], ["-DOP_TILING_LIB"]):
        result = subprocess.run(
            [compiler, "-std=c++17", "-fsyntax-only", *mode, f"-I{root / 'op_host' / 'planner'}",
             f"-I{include}", str(root / "op_host" / shell)],
            capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


DRIVER_CANN9 = "cann_host/op_host_stub_driver_cann9"


def test_each_driver_presents_its_cann_release_and_the_shell_picks_its_api():
    """op_host/flash_cann_cann_compat.h picks the block-count setter by CANN_VERSION_NUM:
    SetBlockDim against CANN 8.x's host API (which has no other), SetSimdNumBlocks against
    9.x's (where SetBlockDim is deprecated: the stand-in marks it so and the shells are built
    with -Werror, so a build calling it fails)."""
    for driver, version, api in ((DRIVER, 80300000, "SetBlockDim"),
                                 (DRIVER_CANN9, 90000000, "SetSimdNumBlocks")):
        result = run(driver, "cann-version")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"cann_version_num": version, "num_blocks_api": api}


@pytest.mark.parametrize("command", [
    ["tiling", "FlashCannAttention", "BNSD", "bf16", "1", "1", "0.125", "2", "8", "1000", "64",
     "2", "2", "1200", "64", "7"],
    ["grad-tiling", "BSND", "fp16", "1", "0", "1", "0", "0.125", "2", "1000", "8", "80",
     "2", "1200", "2", "80", "5"],
    ["kvcache-tiling", "BSND", "bf16", "0.125", "2", "1", "8", "64", "6", "128", "2", "64",
     "cache_seqlens=2", "block_table=2x3"],
], ids=["forward", "backward", "decode"])
def test_the_tiling_is_the_same_against_cann_8_and_9(command):
    """Each TilingFunc run against the stand-in presenting CANN 8.x and 9.x: the same plan,
    block count included (recorded by whichever setter the release has)."""
    results = [run(driver, *command) for driver in (DRIVER, DRIVER_CANN9)]
    for result in results:
        assert result.returncode == 0, result.stderr
    eight, nine = (json.loads(r.stdout) for r in results)
    assert eight["status"] == "ok" and eight["block_dim"] > 0, results[0].stderr
    assert nine == eight
