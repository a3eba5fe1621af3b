"""The twin's timing mode (twin/timing.h, docs/twin.md "Timing mode"): exact cycle counts
on micro-kernels, no change to anything the twin computes when it is on, the same
instruction stream without the arithmetic, a valid trace, and a cost table whose every
figure names its source."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from flash_cann.backends.twin import launcher as twin
from flash_cann.ascend import planner
from flash_cann.backends.twin import calibration, timing, traced

from conftest import make_qkv, random_key_padding_mask
from native_build import built, run


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


def test_micro_kernels_give_the_tables_cycles():
    """tests/twin/twin_timing_tests.cpp: dependent copies serialise, independent pipes
    overlap, a WaitFlag delays its pipe, a barrier exposes a result's latency, a
    cross-core flag and SyncAll carry time between units and cores, a double-buffered
    queue overlaps where a single buffer serialises: each to the cycle."""
    result = run("twin_tests/twin_timing_tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stderr


def _forward(gen, timing_request=None, *, masked=True, causal=True):
    q, k, v = make_qkv(2, 4, 2, 200, 300, 64, torch.float16, layout="BNSD", generator=gen)
    mask = random_key_padding_mask(2, 300, generator=gen) if masked else None
    allocated = {}
    out, lse = twin.forward(q, k, v, mask, scale=0.125, causal=causal, layout="BNSD",
                            ai_cores=3, allocated=allocated, timing=timing_request)
    return (q, k, v, mask), (out, lse), allocated


def test_timing_changes_nothing_the_twin_computes(gen):
    """Forward and backward: outputs, allocations and the race detector's atomic-add
    report are bitwise the same with timing on and off."""
    state = gen.get_state()
    inputs, (out, lse), allocated = _forward(gen)
    gen.set_state(state)
    request = timing.Timing()
    _, (out_t, lse_t), allocated_t = _forward(gen, request)
    assert torch.equal(out, out_t) and torch.equal(lse, lse_t) and allocated == allocated_t
    assert request.report["makespan_cycles"] > 0
    q, k, v, mask = inputs
    grad_out = torch.randn(q.shape, generator=gen).to(q.dtype)
    runs = []
    for request in (None, timing.Timing()):
        adds, allocated = [], {}
        grads = twin.backward(grad_out, q, k, v, out, lse, mask, None, scale=0.125, causal=True,
                              layout="BNSD", ai_cores=3, allocated=allocated,
                              unordered_atomic_adds=adds, timing=request)
        runs.append((grads, adds, allocated))
    (plain, adds, allocated), (timed, adds_t, allocated_t) = runs
    assert all(torch.equal(a, b) for a, b in zip(plain[:3], timed[:3]))
    assert adds == adds_t and allocated == allocated_t


@pytest.mark.parametrize("kernel", ["forward", "forward-causal-masked", "backward",
                                    "backward-deterministic"])
def test_timing_only_issues_the_same_instruction_stream(kernel, gen):
    """Without the arithmetic, every unit issues the same instructions with the same
    amounts (the stream hash) and the timeline is the same: control flow depends on
    shapes, not values."""
    reports = []
    for only in (False, True):
        g = torch.Generator().manual_seed(7)
        request = timing.Timing(timing_only=only)
        masked = kernel == "forward-causal-masked"
        if kernel.startswith("forward"):
            _forward(g, request, masked=masked, causal=masked)
        else:
            (q, k, v, mask), (out, lse), _ = _forward(g)
            twin.backward(torch.randn(q.shape, generator=g).to(q.dtype), q, k, v, out, lse, mask,
                          None, scale=0.125, causal=True, layout="BNSD", ai_cores=3,
                          deterministic=kernel.endswith("deterministic"), timing=request)
        reports.append(request.report)
    computed, skipped = reports
    assert skipped["timing_only"] and not computed["timing_only"]
    assert [u["stream"] for u in computed["units"]] == [u["stream"] for u in skipped["units"]]
    assert computed["makespan_cycles"] == skipped["makespan_cycles"]


def test_trace_is_valid_and_busy_fits_the_makespan(gen):
    """The trace is Chrome-trace JSON (thread names, complete events with a start and a
    duration on the traced core); no pipe of any unit is busy longer than the makespan;
    the report names a binding pipe and a critical path that sums to one."""
    request = timing.Timing(trace_core=1)
    _forward(gen, request)
    report, trace = request.report, json.loads(json.dumps(request.trace))
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"AIC M", "AIC MTE2", "AIV0 V", "AIV1 MTE3"} <= names
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["pid"] == 1 and e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert all(":" in e["name"] for e in spans)  # the kernel's file:line
    end_us = max(e["ts"] + e["dur"] for e in spans)
    assert end_us <= report["makespan_cycles"] / (report["clock_ghz"] * 1e3) * (1 + 1e-9)
    for unit in report["units"]:
        assert all(b <= report["makespan_cycles"] * (1 + 1e-12) for b in unit["busy_cycles"].values())
    assert report["label"] == timing.LABELS["fitted"]
    assert report["binding_pipe"].split()[1] in timing.PIPES
    assert sum(report["critical_path_shares"].values()) == pytest.approx(1.0)
    assert report["total_cycles"] == report["makespan_cycles"] + report["launch_cycles"]


def test_cost_table_names_every_figure_and_its_source():
    """twin/timing/costs.json gives every figure the twin takes, no other, each with a
    source or 'assumed'."""
    table = json.loads(timing.cost_table_path().read_text())
    names = timing.figure_names(twin._library())
    for soc, figures in table.items():
        if soc.startswith("_"):
            continue
        assert sorted(figures) == sorted(names), soc
        for name, entry in figures.items():
            assert isinstance(entry["value"], (int, float)) and entry["value"] >= 0, name
            assert entry["source"].strip(), name
            if "fitted" in entry:
                assert entry["fitted"]["value"] >= 0 and entry["fitted"]["fit"].strip(), name


def test_fitted_entries_are_the_committed_fits():
    """The cost table's fitted entries are the schedule model's committed fit carried over
    (calibration.py), the unfitted values stay, and ``rates`` picks between them."""
    table = json.loads(timing.cost_table_path().read_text())["Ascend910B2"]
    expected = calibration.fitted_entries()
    assert {n for n, e in table.items() if "fitted" in e} == set(expected)
    for name, entry in expected.items():
        assert table[name]["fitted"] == entry, name
    fitted, unfitted = timing.cost_table("Ascend910B2"), timing.cost_table("Ascend910B2", "unfitted")
    assert {n for n in fitted if fitted[n] != unfitted[n]} <= set(expected)
    assert fitted["bytes_per_cycle.l0c_to_gm"] == pytest.approx(
        unfitted["bytes_per_cycle.l0c_to_gm"] * planner.model_fit()["figures"]["fixpipe_scale"], rel=1e-6)
    with pytest.raises(timing.TimingError, match="rates: must be one of"):
        timing.cost_table("Ascend910B2", "measured")


def test_fitted_rates_shorten_a_fixpipe_bound_trace():
    """The fitted rates reach the trace: the same launch's kernel time (the launch cost
    apart) is shorter at the fitted Fixpipe rate (x1.32) than at the unfitted one, the
    launch is the fit's, and each report says which rates it ran at."""
    reports = {}
    for rates in timing.LABELS:
        row = traced.trace(traced.Problem("forward", 1, 2, 512, 512, 128), rates=rates)
        assert row["label"] == timing.LABELS[rates]
        reports[rates] = row["report"]
    assert reports["fitted"]["makespan_cycles"] < reports["unfitted"]["makespan_cycles"]
    assert reports["fitted"]["launch_cycles"] == planner.model_fit()["figures"]["launch_cycles"]


def test_unknown_soc_is_named():
    with pytest.raises(timing.TimingError, match="soc: no cost table for 'Ascend999'"):
        timing.cost_table("Ascend999")


def test_stand_in_times_one_cores_share_of_the_full_launch():
    """A blockDim-scaled stand-in (batch x heads and the cores divided by their common
    factor, the L2 still shared by all) gives the full launch's traced time."""
    problem = traced.Problem("forward", 1, 8, 1024, 1024, 64)
    assert traced.stand_in(problem, 24) == (dataclasses.replace(problem, heads=1, heads_kv=1), 3)
    scaled, full = traced.trace(problem), traced.trace(problem, scaled=False)
    assert scaled["traced_as"]["cores"] == 3 and full["traced_as"]["cores"] == 24
    assert scaled["traced_ms"] == pytest.approx(full["traced_ms"], rel=1e-12)


def test_benchmark_rows_carry_the_documented_keys():
    """benchmarks/npu_model.py --traced rows: kernel, shape, dtype, causal, features,
    model_ms, traced_ms, binding_pipe, for every kernel."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "npu_model.py"
    spec = importlib.util.spec_from_file_location("npu_model", path)
    npu_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(npu_model)
    Problem = traced.Problem
    problems = [Problem("forward", 1, 2, 256, 256, 64, causal=True).with_feature("window"),
                Problem("backward", 1, 2, 256, 256, 64), Problem("backward-deterministic", 1, 2, 256, 256, 64),
                Problem("decode", 2, 2, 1, 512, 64)]
    rows = npu_model.traced_rows(problems)
    assert [r["kernel"] for r in rows] == list(traced.KERNELS)
    for row in rows:
        assert {"kernel", "shape", "dtype", "causal", "features", "model_ms", "traced_ms",
                "binding_pipe"} <= set(row)
        assert len(row["shape"]) == 5 and row["traced_ms"] > 0 and row["model_ms"] > 0
    assert rows[0]["features"] == ["window"]


def test_plan_traced_prints_the_traced_time_beside_the_models(tmp_path, capsys):
    from flash_cann.tools import cli
    out = tmp_path / "trace.json"
    assert cli.main(["plan", "--shape", "1,3,256,64", "--causal", "--traced", "--trace-out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "TRACED" in printed and timing.LABELS["fitted"] in printed
    assert re.search(r"time +[\d.]+ ms traced vs [\d.]+ ms modelled \(model [+-][\d.]+ %\)", printed)
    assert json.loads(out.read_text())["traceEvents"]
    assert cli.main(["plan", "--shape", "1,3,256,64", "--traced", "--json"]) == 2
    assert "--traced prints beside the report: not with --json" in capsys.readouterr().err


def test_cost_table_holds_the_models_sourced_figures():
    """Where the schedule model uses a sourced figure unfitted (the clock, L1 -> L0A/L0B,
    UB -> GM, the cross-core flag) or an assumed one (the transfers' arrival), the twin's
    table says the same."""
    from flash_cann.ascend import planner
    soc = next(p for p in planner.platforms() if p["name"] == "Ascend910B2")
    rates, table = soc["engine_rates"], timing.cost_table("Ascend910B2")
    clock = table["clock_ghz"] * 1e9
    assert clock == rates["clock_hz"]
    for figure, rate in (("l1_to_l0a", "l1_to_l0a"), ("l1_to_l0b", "l1_to_l0b"), ("ub_to_gm", "ub_to_l2")):
        assert table[f"bytes_per_cycle.{figure}"] * clock == pytest.approx(rates[rate], rel=1e-4)
    assert table["cross_core_flag_cycles"] / clock == pytest.approx(rates["cross_core_flag_seconds"])
    # the model waits out the same assumed arrivals as the trace's latencies
    for figure, arrival in (("gm_to_l1", "l2_to_l1"), ("l1_to_l0a", "l1_to_l0"), ("l1_to_l0b", "l1_to_l0"),
                            ("l0c_to_gm", "fixpipe"), ("gm_to_ub", "l2_to_ub"), ("ub_to_gm", "ub_to_l2")):
        assert table[f"latency_cycles.{figure}"] / clock == pytest.approx(rates[f"{arrival}_arrival_seconds"])


# Rows of benchmarks/npu_model.py --traced small enough for CI (910B2, fp16, batch 1,
# 16 heads, 4k, blockDim-scaled stand-ins): the schedule model within +-10 % of the trace.
PINNED_ROWS = [traced.Problem("forward", 1, 16, 4096, 4096, 128),
               traced.Problem("forward", 1, 16, 4096, 4096, 256, causal=True),
               traced.Problem("backward", 1, 16, 4096, 4096, 128, causal=True)]


@pytest.mark.parametrize("problem", PINNED_ROWS, ids=lambda p: f"{p.kernel}-D{p.head_dim}-{'causal' if p.causal else 'full'}")
def test_model_is_within_ten_percent_of_the_trace(problem):
    """The analytic schedule model held to the twin's trace of the same plan at the
    fitted rates (docs/schedule-model.md, "The model held to the twin's trace")."""
    row = traced.trace(problem)
    assert row["model_ms"] == pytest.approx(row["traced_ms"], rel=0.10), (row["model_ms"], row["traced_ms"])


def test_traced_time_is_at_least_the_hbm_floor():
    """The twin does not model HBM per transfer: a traced time is at least the launch
    plus the problem's tensors once over HBM, and a decode that streams a long cache is
    held there (binding "HBM")."""
    problem = traced.Problem("decode", 1, 16, 1, 32768, 128)
    row = traced.trace(problem)
    hbm = next(p["hbm_gb_per_s"] for p in planner.platforms() if p["name"] == "Ascend910B2") * 1e9
    cache = 2 * 32768 * 16 * 128 * 2
    assert row["hbm_floor_ms"] == pytest.approx(traced.hbm_bytes(problem) / hbm * 1e3)
    assert traced.hbm_bytes(problem) > cache
    assert row["binding_pipe"] == "HBM"
    launch_ms = row["report"]["launch_cycles"] / (row["report"]["clock_ghz"] * 1e6)
    assert row["traced_ms"] == pytest.approx(launch_ms + row["hbm_floor_ms"])
    assert row["traced_ms"] > row["report"]["time_ms"]
