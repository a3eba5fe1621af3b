"""The tiling planner (op_host/planner): its C++ tests for the forward and the backward
plans (10,000 random shapes each, balance, refusals), the Python binding, and
`flash-cann plan` (--backward too)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flash_cann.ascend import planner

from native_build import built, run


@pytest.fixture(scope="module")
def planner_tests_run():
    """One run of op_host/planner/tests/planner_tests.cpp for the tests below."""
    return run("planner/planner_tests")


def test_cpp_planner_tests(capsys, planner_tests_run):
    """Runs op_host/planner/tests/planner_tests.cpp and shows its figures in the log."""
    result = planner_tests_run
    with capsys.disabled():
        print("\n" + result.stdout.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "random shapes: 10000 plans" in result.stdout
    assert "all planner tests passed" in result.stdout


def test_cpp_grad_planner_tests(capsys):
    """Runs op_host/planner/tests/grad_planner_tests.cpp and shows its figures in the log."""
    result = run("planner/grad_planner_tests")
    with capsys.disabled():
        print("\n" + result.stdout.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "random shapes: 10000 backward plans" in result.stdout
    assert "all backward planner tests passed" in result.stdout


def test_plan_fits_and_balances():
    built("planner/libflash_cann_planner.so")
    p = planner.plan("Ascend910B2", 4, 32, 8192, 128, heads_kv=8, dtype="bfloat16",
                     causal=True, has_mask=True)
    assert p["tiling_key"] == 1111  # bf16, causal, mask
    assert all(level["used"] <= level["capacity"] for level in p["levels"])
    assert p["block_dim"] == 24 and p["imbalance"] <= 1.05
    rows = [c["rows"] for c in p["cores"]]
    assert rows[0][0] == 0 and rows[-1][1] == 4 * 32 * 8192
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
    assert 0 < p["prediction"]["cube_utilization"] <= 1


@pytest.mark.parametrize("deterministic", [False, True])
def test_grad_plan_fits_balances_and_sizes_its_workspace(deterministic):
    built("planner/libflash_cann_planner.so")
    b, hq, hk, s, d = 1, 16, 16, 8192, 128  # issue 11's reference shape, causal
    p = planner.grad_plan("Ascend910B2", b, hq, s, d, heads_kv=hk, causal=True,
                          deterministic=deterministic)
    assert p["tiling_key"] == 20010 + 1000 * deterministic
    assert all(level["used"] <= level["capacity"] for level in p["levels"])
    assert p["block_dim"] == 24 and p["imbalance"] <= 1.05
    t = p["tiling"]
    units = [c["units"] for c in p["cores"]]
    assert units[0][0] == 0 and units[-1][1] == t["units"] == b * hk * t["key_blocks"]
    assert all(a[1] == b[0] for a, b in zip(units, units[1:]))
    # fp32 dQ, dK and dV, D per query row, each 512-byte aligned: no per-chunk dQ copies
    ws = p["workspace"]
    assert ws["dq"] == b * hq * s * d * 4
    assert ws["dk_dv"] == 2 * b * hk * s * d * 4 and ws["delta"] == b * hq * s * 4
    assert p["user_workspace_bytes"] == sum(ws.values())
    # The deterministic dQ's query pass: query units (batch x heads_q x query block) split
    # over the cores in order.
    queries = [c["query_units"] for c in p["cores"]]
    assert t["query_units"] == (b * hq * t["query_blocks"] if deterministic else 0)
    assert queries[0][0] == 0 and queries[-1][1] == t["query_units"]
    assert all(a[1] == b[0] for a, b in zip(queries, queries[1:]))


@pytest.mark.parametrize("kwargs, message", [
    ({"head_dim": 300}, "head_dim 300 exceeds the kernel's maximum of 256"),
    ({"heads_kv": 3}, "heads_q (8) must be a multiple of heads_kv (3)"),
    ({"features": planner.variant(cube_passes=2)}, "cube_passes must be -1, 0 or 1"),
    ({"head_dim": 256, "features": planner.variant(cube_passes=1)},
     "cube_passes: the 256-row tile in two 128-row cube passes does not fit Ascend910B2's "
     "buffers for head_dim 256"),
    # -1 is the only unbounded value, on either side
    ({"features": planner.variant(window=(-2, -1))}, "window bounds must be >= -1 (-1: unbounded)"),
    ({"features": planner.variant(window=(-1, -2))}, "window bounds must be >= -1 (-1: unbounded)"),
])
def test_refusals_raise(kwargs, message):
    built("planner/libflash_cann_planner.so")
    args = dict(soc="Ascend910B2", batch=1, heads_q=8, seqlen_q=128, head_dim=64)
    args.update(kwargs)
    with pytest.raises(planner.PlanRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
        planner.plan(**args)


def test_cpp_packed_walk_tests(capsys):
    """Runs op_host/planner/tests/packed_walk_tests.cpp: the kernels' device-side walk and
    split of packed sequences (flash_cann_packed.h) covers every tile and step once, in
    contiguous per-core runs, walks the deterministic dQ's query pass over the key pass's
    steps and balances the work."""
    result = run("planner/packed_walk_tests")
    with capsys.disabled():
        print("\n" + result.stdout.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all packed walk tests passed" in result.stdout


def test_packed_plans_take_shapes_and_refuse_by_name():
    """Layout TND: the plan depends on shapes and max_seqlen only; the tokens are needed,
    a key padding mask is refused, and dense layouts take no tokens."""
    built("planner/libflash_cann_planner.so")
    tokens = planner.variant(tokens=(300, 500))
    p = planner.plan("Ascend910B2", 3, 4, 120, 64, heads_kv=2, seqlen_k=260, layout="TND",
                     causal=True, features=tokens)
    assert p["tiling"]["used_cores"] == 24 and p["tiling_key"] == 1010
    g = planner.grad_plan("Ascend910B2", 3, 4, 120, 64, heads_kv=2, seqlen_k=260, layout="TND",
                          deterministic=True, features=tokens)
    # at most one unit per (kv head, key block) of the tokens, plus one partial per sequence;
    # the deterministic dQ's query pass likewise per (query head, query block)
    block_q, block_k = g["tiling"]["block_q"], g["tiling"]["block_k"]
    assert g["tiling"]["used_cores"] == min(24, max(2 * (-(-500 // block_k) + 3),
                                                    4 * (-(-300 // block_q) + 3)))
    # the fast dQ has no query pass: the key pass alone, its partial blocks included
    g = planner.grad_plan("Ascend910B2", 3, 4, 120, 64, heads_kv=2, seqlen_k=260, layout="TND",
                          features=tokens)
    assert g["tiling"]["used_cores"] == min(24, 2 * (-(-500 // g["tiling"]["block_k"]) + 3))
    for call, features, message in [
            (planner.plan, None, "tokens_q must be in 1..2147483647 with layout TND (got 0)"),
            (planner.grad_plan, planner.variant(tokens=(300, 0)),
             "tokens_k must be in 1..2147483647 with layout TND (got 0)")]:
        with pytest.raises(planner.PlanRefused, match=re.escape(message)):
            call("Ascend910B2", 3, 4, 120, 64, layout="TND", features=features)
    with pytest.raises(planner.PlanRefused, match="key_padding_mask is not taken with layout TND"):
        planner.plan("Ascend910B2", 3, 4, 120, 64, layout="TND", has_mask=True, features=tokens)
    with pytest.raises(planner.PlanRefused, match="tokens_q/tokens_k are only taken with layout TND"):
        planner.plan("Ascend910B2", 3, 4, 120, 64, layout="BSND", features=tokens)


def test_cli_plans_packed_sequences(capsys):
    """`flash-cann plan --layout TND --tokens N`: the device split is said, the prediction
    names its assumption, the backward has no prediction (not a wrong one)."""
    from flash_cann.tools import cli
    built("planner/libflash_cann_planner.so")
    shape = ["plan", "--shape", "7,16,5120,128", "--layout", "TND", "--tokens", "16384",
             "--causal"]
    assert cli.main(shape) == 0
    out = capsys.readouterr().out
    assert "split on the device from cu_seqlens" in out
    assert "assumes    the tokens in batch sequences of equal length" in out
    assert "incumbent's design" not in out
    assert cli.main([*shape, "--backward"]) == 0
    assert "PREDICTION: none for packed sequences" in capsys.readouterr().out
    assert cli.main(["plan", "--shape", "1,8,128,64", "--tokens", "5"]) == 2
    assert "--tokens applies to --layout TND only" in capsys.readouterr().err
    # --tokens Q K: the key tokens are the second value (the plan differs from Q Q's)
    packed = ["plan", "--shape", "3,4,120,64", "--kv-heads", "2", "--seqlen-k", "260",
              "--layout", "TND", "--backward", "--json", "--tokens", "300"]
    assert cli.main([*packed, "500"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = planner.grad_plan("Ascend910B2", 3, 4, 120, 64, heads_kv=2, seqlen_k=260, layout="TND",
                             features=planner.variant(tokens=(300, 500)))
    assert got == want
    assert cli.main(packed) == 0
    assert json.loads(capsys.readouterr().out) != want


def test_gqa_plans_count_the_kv_heads():
    """heads_kv reaches the planner: the backward's units are (kv head, key block) pairs
    and its group the query heads per kv head; without heads_kv it is heads_q (MHA)."""
    built("planner/libflash_cann_planner.so")
    gqa = planner.grad_plan("Ascend910B2", 1, 8, 1024, 64, heads_kv=2)["tiling"]
    mha = planner.grad_plan("Ascend910B2", 1, 8, 1024, 64)["tiling"]
    assert (gqa["group"], gqa["units"]) == (4, 2 * gqa["key_blocks"])
    assert (mha["group"], mha["units"]) == (1, 8 * mha["key_blocks"])
    assert planner.plan("Ascend910B2", 1, 8, 1024, 64, heads_kv=2)["tiling"]["group"] == 4


def test_dtypes_and_layouts_are_the_specs():
    with pytest.raises(ValueError, match="dtype must be one of float16, bfloat16 "
                                         "\\(got 'float32'\\)"):
        planner.plan("ascend910b2", 1, 8, 128, 64, dtype="float32")
    assert list(planner.LAYOUTS) == ["BNSD", "BSND", "TND"]


def test_grad_refusals_raise():
    built("planner/libflash_cann_planner.so")
    with pytest.raises(planner.PlanRefused, match="head_dim 300 exceeds the kernel's maximum"):
        planner.grad_plan("Ascend910B2", 1, 8, 128, 300)
    with pytest.raises(ValueError, match="layout must be one of BNSD, BSND"):
        planner.grad_plan("Ascend910B2", 1, 8, 128, 64, layout="SBH")


@pytest.mark.parametrize("batch, heads_kv, keys, splits", [
    (64, 8, 8192, 1),       # 512 tiles fill 24 cores: no split
    (1, 8, 131072, 3),      # 8 tiles: 3 splits each
    (1, 1, 131072, 24),     # one tile: a split per core
    (1, 1, 1000, 2),        # no chunk shorter than a 512-key round of the capacity (1024)
    (2, 1, 1024, 2),        # a sequence holds its block-table row (8 pages), not the pool's 16
])
def test_decode_plan_splits_from_shapes(batch, heads_kv, keys, splits):
    p = planner.decode_plan("ascend910b2", batch, 4 * heads_kv, 1, 128, heads_kv=heads_kv, keys=keys,
                            page_size=128)
    assert p["tiling"]["capacity"] == -(-keys // 128) * 128
    assert p["tiling"]["splits"] == splits
    assert p["tiling"]["used_cores"] == min(24, p["tiling"]["units"])
    assert all(level["used"] <= level["capacity"] for level in p["levels"])


def test_decode_plan_of_a_contiguous_cache():
    """No block table (max_blocks 0): a contiguous cache of `keys` keys per sequence."""
    p = planner.decode_plan("ascend910b2", 2, 8, 1, 128, heads_kv=2, keys=3000)
    assert (p["tiling"]["paged"], p["tiling"]["capacity"]) == (0, 3000)
    assert p["tiling"]["splits"] == 5  # 4 tiles on 24 cores, chunks of at least 512 keys


@pytest.mark.parametrize("keys", [8192, 16384, 32768])
def test_decode_prediction_meets_the_hbm_target_at_batch_64(keys):
    """Issue 24's model target: >= 80 % of 910B2's HBM bandwidth at batch 64, GQA 32/8,
    head_dim 128, caches of 8k-32k (a PREDICTION of docs/planner.md's decode model)."""
    p = planner.decode_plan("ascend910b2", 64, 32, 1, 128, heads_kv=8, keys=keys, page_size=128)
    prediction = p["prediction"]
    assert "PREDICTION" in prediction["label"]
    assert prediction["hbm_use"] >= 0.80
    assert prediction["seconds"] >= prediction["hbm_seconds"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(heads_q=6, heads_kv=4), "multiple of heads_kv"),
    (dict(head_dim=300), "head_dim 300 exceeds"),
    (dict(features=planner.variant(alibi="head"), keys=1 << 24), "ALiBi distances"),
    (dict(features=planner.variant(dropout_p=0.1)), "dropout is not a feature of fwd_kvcache"),
])
def test_decode_refusals_raise(kwargs, message):
    args = dict(heads_q=8, heads_kv=2, head_dim=64, keys=4096)
    args.update(kwargs)
    with pytest.raises(planner.PlanRefused, match=message):
        planner.decode_plan("ascend910b2", 2, args.pop("heads_q"), 1, args.pop("head_dim"), **args)


@pytest.mark.parametrize("seqlen, head_dim, causal, keys", [
    (8192, 128, False, 1024),   # long non-causal keys at head_dim 128: 1024-key rounds
    (8192, 128, True, 512),     # causal tiles compute a whole round on the diagonal: 512
    (2048, 128, False, 512),    # shorter key sequences: 512
    (8192, 64, False, 512),     # head_dim 64: 512
])
def test_round_keys_widen_only_for_long_non_causal_rows(seqlen, head_dim, causal, keys):
    """The keys per round (block_k x key_stack): 1024 only where the schedule model
    predicts it pays (non-causal, seqlen_k >= 4096, head_dim >= 128), 512 elsewhere."""
    t = planner.plan("Ascend910B2", 1, 16, seqlen, head_dim, causal=causal, dtype="bfloat16")["tiling"]
    assert t["block_k"] * t["key_stack"] == keys


@pytest.mark.parametrize("layout, mask", [("BNSD", False), ("BSND", True)])
def test_forward_hbm_floor_counts_each_tensor_once(layout, mask):
    """The prediction's HBM floor: q, out and lse once per query head, k and v once per kv
    head (GQA), the key mask once, at the platform's HBM bandwidth."""
    b, hq, hk, sq, sk, d, e = 2, 16, 2, 512, 3000, 128, 2
    p = planner.plan("Ascend910B2", b, hq, sq, d, heads_kv=hk, seqlen_k=sk, dtype="bfloat16",
                     layout=layout, has_mask=mask)
    hbm = {x["name"]: x for x in planner.platforms()}["Ascend910B2"]["hbm_gb_per_s"] * 1e9
    moved = 2 * b * hq * sq * d * e + 2 * b * hk * sk * d * e + 4 * b * hq * sq + mask * b * sk
    assert p["prediction"]["hbm_seconds"] == pytest.approx(moved / hbm, rel=1e-8)


def test_backward_pre_pass_runs_on_every_vector_core():
    """The backward's pre-pass (read dO and O, write D and zero dQ) is spread over every
    vector core (two per AI core); on a 2-core launch their bandwidth, not HBM, binds it."""
    b, h, s, d, e, cores = 1, 16, 4096, 128, 2, 2
    p = planner.grad_plan("Ascend910B2", b, h, s, d, dtype="bfloat16", aic_cores=cores)
    rates = {x["name"]: x for x in planner.platforms()}["Ascend910B2"]["engine_rates"]
    rows = b * h * s
    read, write = 2 * rows * d * e, rows * 4 + rows * d * 4
    vector = max(read / rates["l2_to_ub"], write / rates["ub_to_l2"]) / (2 * cores)
    assert vector > (read + write) / rates["hbm"]
    assert p["prediction"]["pre_seconds"] == pytest.approx(
        vector + 2 * rates["cross_core_flag_seconds"], rel=1e-6)


def test_imbalance_is_against_the_platforms_cores():
    """A plan's imbalance is its busiest core's work over the mean across the platform's
    AI cores, so a plan that leaves cores idle shows it."""
    p = planner.plan("Ascend910B2", 1, 1, 256, 64)
    macs = [c["macs"] for c in p["cores"]]
    assert p["block_dim"] == len(macs) < 24
    assert p["imbalance"] == pytest.approx(max(macs) / (sum(macs) / 24), rel=1e-9)


def test_plan_json_escapes_quotes_and_backslashes():
    """The planner's JSON carries any message text: an unknown SoC's name with a quote and a
    backslash comes back as given (the C ABI, below the Python name check)."""
    library = planner._library()
    name = 'Ascend"910\\B2'
    for call in (lambda buf, cap: library.flash_cann_plan_json(
                     name.encode(), 1, 8, 8, 128, 128, 64, 0, 0, 0, 0, 0.125, None, 0, buf, cap),
                 lambda buf, cap: library.flash_cann_grad_plan_json(
                     name.encode(), 1, 8, 8, 128, 128, 64, 0, 0, 0, 0, 0, 0.125, None, 0, buf, cap)):
        assert planner._json_call(call) == {"error": f"unknown SoC '{name}'"}


def test_platform_table():
    built("planner/libflash_cann_planner.so")
    table = {p["name"]: p for p in planner.platforms()}
    assert set(table) == {"Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4",
                          "Ascend910_93"}
    assert table["Ascend910B2"]["aic_cores"] == 24 and table["Ascend910B3"]["aic_cores"] == 20
    assert round(table["Ascend910B4"]["cube_peak_tflops"], 1) == 245.8


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "flash_cann", "plan", *args],
                          capture_output=True, text=True, timeout=3600)


def test_cli_prints_the_plan():
    built("planner/libflash_cann_planner.so")
    result = _cli("--soc", "Ascend910B2", "--shape", "2,32,8192,128", "--causal", "--dtype", "bf16")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for needle in ("tiling     key 1110", "work per AI core", "max/mean", "L0A", "UB",
                   "PREDICTION (schedule model", "% of cube peak", "bound ", "incumbent's design"):
        assert needle in out, needle


def test_cli_prints_the_backward_plan(capsys):
    """In-process (the subprocess tests above cover the entry point)."""
    from flash_cann.tools import cli

    built("planner/libflash_cann_planner.so")
    shape = ["plan", "--shape", "1,16,8192,128"]
    assert cli.main([*shape, "--causal", "--backward", "--deterministic"]) == 0
    out = capsys.readouterr().out
    for needle in ("tiling     key 21010", "dQ         deterministic: a query pass over 1024 query",
                   "work per AI core (units", "query units", "max/mean", "dk_l0c", "pass_acc_ub",
                   "L0C    131,072 /   131,072", "dQ fp32 64.00", "dK/dV fp32 128.00",
                   "PREDICTION (backward schedule model", "% of cube peak", "bound",
                   "query pass", "of compute per step and vector core"):
        assert needle in out, needle
    assert cli.main([*shape, "--backward", "--json"]) == 0
    json_plan = json.loads(capsys.readouterr().out)
    assert json_plan["tiling_key"] == 20000 and json_plan["tiling"]["query_units"] == 0
    prediction = json_plan["prediction"]
    assert prediction["label"].startswith("PREDICTION") and prediction["seconds"] > 0
    assert 0 < prediction["cube_utilization"] <= 1
    assert cli.main([*shape, "--deterministic"]) == 2
    assert ("flash-cann: error: --deterministic applies to --backward only"
            in capsys.readouterr().err)


def test_cli_shows_the_256_row_tile_in_cube_passes(capsys):
    """Long calls at head_dim 128 plan the 256-row tile in two cube passes where the model
    predicts it faster (docs/kernel.md, "The cube in row passes": causal 1k with many
    heads): the plan says so and accounts the passes' buffers; with fewer heads it keeps
    whole tiles. --fp16-scores is the backward's only."""
    from flash_cann.tools import cli

    built("planner/libflash_cann_planner.so")
    shape = ["plan", "--shape", "1,32,1024,128", "--causal"]
    assert cli.main(shape) == 0
    out = capsys.readouterr().out
    for needle in ("query blocks of 256 rows", "cube       row passes of 128 rows",
                   "v_l1             131,072  2  cube: V round ring",
                   "q_l0a             32,768  2  cube: A operand ring", "L0C    131,072 /   131,072"):
        assert needle in out, needle
    assert "p_l0a" not in out
    assert cli.main(["plan", "--shape", "1,8,1024,128", "--causal"]) == 0
    out = capsys.readouterr().out
    assert "query blocks of 256 rows" not in out and "row passes" not in out
    assert cli.main([*shape, "--fp16-scores"]) == 2
    assert ("flash-cann: error: --fp16-scores applies to --backward only: the forward keeps "
            "fp32 S" in capsys.readouterr().err)


def test_cli_plans_the_features(capsys):
    """--window/--softcap/--alibi/--dropout/--sinks select the FEATURES kernel and are
    shown; an impossible feature is refused by name."""
    from flash_cann.tools import cli

    built("planner/libflash_cann_planner.so")
    shape = ["plan", "--shape", "1,16,32768,128"]
    assert cli.main([*shape, "--causal", "--window", "4096", "-1", "--alibi", "head",
                     "--softcap", "30", "--sinks"]) == 0
    out = capsys.readouterr().out
    for needle in ("features   window (4096, -1), softcap 30, ALiBi (per head), sinks",
                   "tiling     key 2010", "kernel     FEATURES", "alibi_ub", "diag_ub",
                   "PREDICTION (schedule model"):
        assert needle in out, needle
    assert cli.main([*shape, "--json", "--window", "100", "20"]) == 0
    tiling = json.loads(capsys.readouterr().out)["tiling"]
    assert tiling["features"] == 1 and tiling["variant"]["window_left"] == 100
    assert tiling["variant"]["window_right"] == 20
    assert cli.main([*shape, "--dropout", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "features   dropout 0.1" in out and "philox_ub" in out
    assert cli.main([*shape, "--dropout", "1"]) == 2
    assert "dropout_p must be in [0, 1)" in capsys.readouterr().err
    # causal sets the right bound whatever --window says, as the API's causal=True does
    assert cli.main([*shape, "--causal", "--window", "10", "5"]) == 0
    capsys.readouterr()


def test_cli_plans_the_decode_kernel(capsys):
    """`flash-cann plan --decode`: the same plan as planner.decode_plan for the same request
    (GQA, a paged cache, a window with --causal, sinks), printed with its tiles, split and
    prediction; what the decode kernel does not take is refused by name."""
    from flash_cann.tools import cli

    built("planner/libflash_cann_planner.so")
    shape = ["plan", "--shape", "2,8,1,64", "--kv-heads", "2", "--decode", "--seqlen-k", "1000",
             "--page-size", "128"]
    assert cli.main([*shape, "--causal", "--window", "100", "5", "--sinks", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = planner.decode_plan("ascend910b2", 2, 8, 1, 64, heads_kv=2, keys=1000, page_size=128,
                               causal=True, features=planner.variant(window=(100, 0), sinks=True))
    assert got == want
    assert (got["tiling"]["group"], got["tiling"]["paged"], got["tiling"]["capacity"]) == (4, 1, 1024)
    assert cli.main(shape) == 0
    out = capsys.readouterr().out
    t = planner.decode_plan("ascend910b2", 2, 8, 1, 64, heads_kv=2, keys=1000,
                            page_size=128)["tiling"]
    for needle in (f"tiling     key {got['tiling_key']}; tiles of {t['block_q']} rows",
                   f"{t['splits']} split(s) of each tile's keys",
                   "paged cache of 1024 keys per sequence", "PREDICTION (decode schedule model",
                   "every sequence holding 1000 keys", "features   none",
                   "seqlen_k 1000, head_dim 64, float16, BSND\n"):
        assert needle in out, needle
    for other in ("BNSD", "TND"):  # flash_attn_with_kvcache's query is (batch, seqlen, heads, d)
        assert cli.main([*shape, "--layout", other]) == 2
        assert (f"--decode plans flash_attn_with_kvcache's query, (batch, seqlen_q, heads, "
                f"head_dim) = BSND: not --layout {other}") in capsys.readouterr().err
    assert cli.main([*shape, "--layout", "BSND"]) == 0
    assert capsys.readouterr().out == out
    for refused in (["--mask"], ["--backward"], ["--dropout", "0.1"]):
        assert cli.main([*shape, *refused]) == 2
        assert ("flash-cann: error: --decode is a forward of its own: no --backward, --dropout "
                "or --mask") in capsys.readouterr().err, refused
    assert cli.main(["plan", "--shape", "2,8,1,64", "--decode"]) == 2
    assert "--decode needs --seqlen-k, the keys per sequence" in capsys.readouterr().err


def test_cli_reports_refusals():
    built("planner/libflash_cann_planner.so")
    result = _cli("--shape", "1,8,128,300")
    assert result.returncode == 2
    assert result.stderr.startswith("flash-cann: error: the planner refused: head_dim 300 "
                                    "exceeds"), result.stderr


@pytest.mark.parametrize("spelling", ["ascend910b2", "ASCEND910B2", "Ascend910B2"])
def test_soc_names_ignore_case(spelling):
    built("planner/libflash_cann_planner.so")
    assert planner.soc_name(spelling) == "Ascend910B2"


def test_cli_unknown_soc_lists_the_known_ones():
    built("planner/libflash_cann_planner.so")
    result = _cli("--soc", "ascend910b", "--shape", "1,8,128,64")
    assert result.returncode == 2
    assert ("flash-cann: error: unknown SoC 'ascend910b'; choose one of ascend910b1, "
            "ascend910b2, ascend910b3, ascend910b4, ascend910_93 (any case)") in result.stderr

# docs/planner.md's and docs/schedule-model.md's prediction tables are generated from
# planner_tests' report lines;
# these build them, and the test below fails (printing the table) when they drift.
_TARGET = re.compile(r"targets: forward (non-causal|causal) +seqlen +(\d+): ([\d.]+)% of cube "
                     r"peak \((\d+) TFLOP/s\), work imbalance ([\d.]+), modelled core time "
                     r"max/mean ([\d.]+); bound: (.*)")
_BACKWARD = re.compile(r"targets: backward([* ])(non-causal|causal) +seqlen +(\d+)"
                       r"(?: \[(fast|deterministic) (\d+)x(\d+), (\d+)-row pieces, dQ in (\d+)-column "
                       r"pieces, (\d) L0C scratch\])?: ([\d.]+)% "
                       r"of cube peak \(2.5x forward FLOPs\); bound: (.*)")
_FEATURE = re.compile(r"features: (.+?) {2,}([\d.]+) ms  (.*)")
_CHANGE = re.compile(r"design change \((non-causal|causal), 16k\): (.*?) +([\d.]+)% of peak; "
                     r"bound: (.*)")
_SENSITIVITY = re.compile(r"sensitivity: (.+?) \| (.+?) \| ([\d.]+)% \| (.*)")


def doc_tables(report: str) -> dict[str, str]:
    targets = ["| seqlen | causal | % of cube peak | TFLOP/s | work imbalance | modelled "
               "core time max/mean | bound |", "|---:|---|---:|---:|---:|---:|---|"]
    backward = ["| design | seqlen | causal | % of cube peak (2.5× forward FLOPs) | bound |",
                "|---|---:|---|---:|---|"]
    features = ["| case (910B2, fp16, batch 1, 16 heads) | predicted time | |", "|---|---:|---|"]
    changes: dict[str, dict[str, str]] = {}
    sensitivity: dict[str, dict[str, str]] = {}
    for line in report.splitlines():
        if m := _FEATURE.match(line):
            case, ms, rest = m.groups()
            rest = " ".join(rest.split())
            features.append(f"| {case.strip()} | {ms} ms | {rest} |")
        elif m := _TARGET.match(line):
            causal, s, pct, tf, imb, ratio, bound = m.groups()
            targets.append(f"| {int(s) // 1024}k | {'yes' if causal == 'causal' else 'no'} | "
                           f"{pct} % | {tf} | {imb} | {ratio} | {bound} |")
        elif m := _BACKWARD.match(line):
            alt, causal, s, dq, bq, bk, rows, cols, copies, pct, bound = m.groups()
            pieces = f", dQ in {cols}-column pieces" if dq == "fast" else ""
            design = ("two L0C scratch, S/dP one step ahead, 128×128 (does not fit)"
                      if alt == "*" else
                      f"grad plan, {dq} dQ: {bq}×{bk}, {rows}-row pieces{pieces}, {copies} L0C scratch")
            backward.append(f"| {design} | {int(s) // 1024}k | "
                            f"{'yes' if causal == 'causal' else 'no'} | {pct} % | {bound} |")
        elif m := _SENSITIVITY.match(line):
            name, column, pct, binding = m.groups()
            sensitivity.setdefault(name, {})[column.replace(" x", " ×")] = f"{pct} % ({binding.replace('%', ' %')})"
        elif m := _CHANGE.match(line):
            causal, change, pct, bound = m.groups()
            changes.setdefault(change, {})[causal] = f"{pct} % ({bound})"
    rows = ["| change (cumulative) | non-causal | causal |", "|---|---|---|"]
    rows += [f"| {c} | {v.get('non-causal', '')} | {v.get('causal', '')} |"
             for c, v in changes.items()]
    columns = list(next(iter(sensitivity.values()), {}))
    sens = ["| prediction (910B2, fp16, D 128, B1 H16) | " + " | ".join(columns) + " |",
            "|---|" + "---|" * len(columns)]
    sens += [f"| {name} | " + " | ".join(cells.get(c, "") for c in columns) + " |"
             for name, cells in sensitivity.items()]
    return {"TARGETS": "\n".join(targets), "BACKWARD": "\n".join(backward),
            "CHANGES": "\n".join(rows), "FEATURES": "\n".join(features),
            "SENSITIVITY": "\n".join(sens)}


def test_docs_prediction_tables_are_generated(planner_tests_run):
    """docs/planner.md and docs/schedule-model.md hold exactly the tables planner_tests'
    report generates."""
    report = planner_tests_run.stdout
    docs = Path(__file__).resolve().parents[1] / "docs"
    doc = (docs / "planner.md").read_text() + (docs / "schedule-model.md").read_text()
    for name, table in doc_tables(report).items():
        assert table.count("\n") >= 3, f"{name}: no report lines parsed"
        assert table in doc, (f"docs/planner.md / schedule-model.md: the {name} table is stale; "
                              f"it should be:\n{table}")


# --------------------------------------------------------------------------------------
# Per-SoC hardware figures, pinned against the sources platform.cpp and engine_rates.cpp
# cite (docs/schedule-model.md, "Hardware figures"), and one prediction per SoC.
# --------------------------------------------------------------------------------------

# SoC: (AI cores, cube clock GHz). Core counts: ops-transformer's UT platform stub
# (tests/ut/framework_special/utils/src/platform.cpp), catlass arch.hpp, platform ini
# quotes; clocks: platform ini cube_freq quotes, pto-isa's fa_cost_model.py.
SOCS = {"Ascend910B1": (24, 1.85), "Ascend910B2": (24, 1.80), "Ascend910B3": (20, 1.80),
        "Ascend910B4": (20, 1.50), "Ascend910_93": (24, 1.80)}
# asc-devkit "NPU架构版本2201.md": UB 192 KB, L1 512 KB (each 256 bytes fewer as
# GetCoreMemSize reports them: LOCAL_RESERV_SIZE), L0A/L0B 64 KB, L0C 128 KB.
BUFFERS = {"ub_bytes": 192 * 1024 - 256, "l1_bytes": 512 * 1024 - 256,
           "l0a_bytes": 64 * 1024, "l0b_bytes": 64 * 1024, "l0c_bytes": 128 * 1024}
# msopmodeling 1.0.9 tilesim arc_config/<soc>/bandwidth_<soc>.csv, GB/s per core at the
# table's own clock: rows L2->L1, L1->L0A, L1->L0B, L0C->L2, L2->UB, UB->L2.
ROUTES = ("l2_to_l1", "l1_to_l0a", "l1_to_l0b", "fixpipe", "l2_to_ub", "ub_to_l2")
MSOPMODELING = {"910B1": (1.85, (221.0, 441.0, 220.5, 70.0, 137.0, 93.0)),
                "910B4": (1.65, (134.98, 285.82, 142.97, 46.66, 87.39, 64.82))}
# vec_cycle_910B1.csv (fp32 rows), per VecOp in engine_rates.h's order: (cycles per
# repeat, head cycles).
VECTOR_CYCLES = [[1, 14], [2, 14], [2, 13], [2, 26], [4, 13], [1, 14], [7, 14], [1, 18],
                 [1, 16], [1, 11], [2, 14], [2, 13]]
DDR_BYTES_PER_CYCLE, L2_BYTES_PER_CYCLE = 32, 110   # platform ini ddr_rate, l2_rate
UB_API_SCRATCH = 8 * 1024
CROSS_CORE_FLAG_CYCLES = 1000 / 4   # pto-isa fa_cost_model.py
# The committed fit (engine_rates.cpp kFitted; tests/test_npu_model.py reruns it): scales
# of the Fixpipe, MTE2 and shared-L2 figures above, then transfer, issue and launch cycles.
FIXPIPE_SCALE, MTE2_SCALE, L2_SCALE = 1.320141181, 0.9931214839, 1.291440187
TRANSFER_CYCLES, ISSUE_CYCLES, LAUNCH_CYCLES = 0, 0, 12703.08235
SCALES = {"fixpipe": FIXPIPE_SCALE, "l2_to_l1": MTE2_SCALE, "l2_to_ub": MTE2_SCALE}


@pytest.mark.parametrize("soc", SOCS)
def test_hardware_figures_are_their_cited_sources(soc):
    """Every figure the planner and the schedule model use for ``soc``, recomputed here
    from the cited source's own numbers (a table applied at the wrong clock, a wrong core
    count or buffer size fails here, not only through a generated docs table)."""
    built("planner/libflash_cann_planner.so")
    table = {p["name"]: p for p in planner.platforms()}[soc]
    cores, ghz = SOCS[soc]
    clock = ghz * 1e9
    assert (table["aic_cores"], table["aiv_cores"]) == (cores, 2 * cores)
    assert table["cube_clock_ghz"] == pytest.approx(ghz, rel=1e-12)
    assert {k: table[k] for k in BUFFERS} == BUFFERS
    assert table["cube_peak_tflops"] * 1e12 == pytest.approx(16 ** 3 * 2 * cores * clock,
                                                             rel=1e-9)
    assert table["hbm_gb_per_s"] * 1e9 == pytest.approx(DDR_BYTES_PER_CYCLE * clock * cores,
                                                        rel=1e-9)
    assert table["l2_gb_per_s"] * 1e9 == pytest.approx(L2_BYTES_PER_CYCLE * clock * cores,
                                                       rel=1e-9)
    rates = table["engine_rates"]
    assert rates["clock_hz"] == pytest.approx(clock, rel=1e-12)
    table_ghz, row = MSOPMODELING["910B4" if soc == "Ascend910B4" else "910B1"]
    for route, gb_per_s in zip(ROUTES, row):
        # bytes per cycle of the source's table, at this SoC's clock, times the fit's scale
        assert rates[route] == pytest.approx(gb_per_s * 1e9 / (table_ghz * 1e9) * clock *
                                             SCALES.get(route, 1), rel=1e-8), route
    assert rates["hbm"] == pytest.approx(DDR_BYTES_PER_CYCLE * clock * cores, rel=1e-8)
    assert rates["l2_aggregate"] == pytest.approx(L2_BYTES_PER_CYCLE * L2_SCALE * clock * cores,
                                                  rel=1e-8)
    assert rates["launch_seconds"] == pytest.approx(LAUNCH_CYCLES / clock, rel=1e-8)
    for name, cycles in (("mmad_issue", ISSUE_CYCLES), ("mte1_issue", ISSUE_CYCLES),
                         ("vector_issue", ISSUE_CYCLES), ("mte2_latency", TRANSFER_CYCLES),
                         ("mte3_latency", TRANSFER_CYCLES), ("fixpipe_latency", TRANSFER_CYCLES)):
        assert rates[f"{name}_seconds"] == pytest.approx(cycles / clock, rel=1e-8, abs=1e-15), name
    assert rates["cross_core_flag_seconds"] == pytest.approx(CROSS_CORE_FLAG_CYCLES / clock,
                                                             rel=1e-8)
    assert rates["vector_cycles"] == VECTOR_CYCLES
    # The capacities every plan is fitted against: the buffers above, less the 8 KB at
    # the top of UB that Select/Compares' scalar modes use as scratch on 910B (asc-devkit
    # TMP_UB_OFFSET; planner.h kUbApiScratch).
    want = {"L1": BUFFERS["l1_bytes"], "L0A": BUFFERS["l0a_bytes"], "L0B": BUFFERS["l0b_bytes"],
            "L0C": BUFFERS["l0c_bytes"], "UB": BUFFERS["ub_bytes"] - UB_API_SCRATCH}
    for plan in (planner.plan(soc, 1, 8, 1024, 128, dtype="bfloat16"),
                 planner.grad_plan(soc, 1, 8, 1024, 128, dtype="bfloat16")):
        assert {lv["level"]: lv["capacity"] for lv in plan["levels"]} == want


# One PREDICTION per SoC (bf16, batch 1, 16 heads, 4k, head_dim 128, causal): forward,
# the incumbent design's forward, backward (seconds). Pinned so that a change of any
# per-SoC input shows here; a deliberate model change updates these with the docs.
PREDICTIONS = {
    "Ascend910B1": (0.0005327251336, 0.0007007442668, 0.001431178489),
    "Ascend910B2": (0.000547523054, 0.0007202093853, 0.001470933447),
    "Ascend910B3": (0.000630264282, 0.0007944722364, 0.001760657392),
    "Ascend910B4": (0.0008709660479, 0.001112058154, 0.002574014881),
    "Ascend910_93": (0.000547523054, 0.0007202093853, 0.001470933447),
}


def test_every_soc_has_a_pinned_prediction():
    built("planner/libflash_cann_planner.so")
    assert set(PREDICTIONS) == set(SOCS) == {p["name"] for p in planner.platforms()}


@pytest.mark.parametrize("soc", PREDICTIONS)
def test_prediction_per_soc_is_pinned(soc):
    built("planner/libflash_cann_planner.so")
    fwd = planner.plan(soc, 1, 16, 4096, 128, causal=True, dtype="bfloat16")
    bwd = planner.grad_plan(soc, 1, 16, 4096, 128, causal=True, dtype="bfloat16")
    got = (fwd["prediction"]["seconds"], fwd["incumbent_design_prediction"]["seconds"],
           bwd["prediction"]["seconds"])
    assert got == pytest.approx(PREDICTIONS[soc], rel=1e-8)


# (batch, heads_q, seqlen): one head to large batch x heads.
_LAUNCH_SHAPES = [(1, 1, 128), (1, 16, 4096), (64, 64, 512), (256, 32, 128), (8, 40, 16384)]


@pytest.mark.parametrize("soc, cores", [("Ascend910B2", 0), ("Ascend910B4", 0), ("Ascend910B2", 7)],
                         ids=["910B2-24", "910B4-20", "restricted-7"])
def test_syncall_kernels_never_plan_more_blocks_than_ai_cores(soc, cores):
    """asc-devkit SyncAll: a kernel that synchronises across blocks must launch no more
    blocks than the AI cores running it (else the runtime schedules rounds and it hangs),
    and in batch schedule mode. The backward (pre-pass SyncAll) and the decode (split
    combine SyncAll) plan so on the 910B2's 24, the 910B4's 20 and a restricted count."""
    built("planner/libflash_cann_planner.so")
    available = cores or {p["name"]: p for p in planner.platforms()}[soc]["aic_cores"]
    for batch, heads, seqlen in _LAUNCH_SHAPES:
        for deterministic in (False, True):
            p = planner.grad_plan(soc, batch, heads, seqlen, 128, heads_kv=max(1, heads // 4),
                                  causal=deterministic, deterministic=deterministic,
                                  aic_cores=cores)
            assert 1 <= p["block_dim"] <= available, (batch, heads, seqlen, p["block_dim"])
            assert p["schedule_mode"] == 1
        d = planner.decode_plan(soc, batch, heads, 1, 128, heads_kv=max(1, heads // 8),
                                keys=seqlen, page_size=128, aic_cores=cores)
        assert 1 <= d["block_dim"] <= available, (batch, heads, seqlen, d["block_dim"])
        assert d["schedule_mode"] == 1
