"""The tiling planner (op_host/planner): its C++ tests (10,000 random shapes, balance,
refusals), the Python binding, and `flash-cann plan`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from flash_cann import planner

from native_build import built, run


def test_cpp_planner_tests(capsys):
    """Runs op_host/planner/tests/planner_tests.cpp and shows its figures in the log."""
    result = run("planner/planner_tests")
    with capsys.disabled():
        print("\n" + result.stdout.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "random shapes: 10000 plans" in result.stdout
    assert "all planner tests passed" in result.stdout


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


@pytest.mark.parametrize("kwargs, message", [
    ({"head_dim": 300}, "head_dim 300 exceeds the kernel's maximum of 256"),
    ({"heads_kv": 3}, "heads_q (8) must be a multiple of heads_kv (3)"),
])
def test_refusals_raise(kwargs, message):
    built("planner/libflash_cann_planner.so")
    args = dict(soc="Ascend910B2", batch=1, heads_q=8, seqlen_q=128, head_dim=64)
    args.update(kwargs)
    with pytest.raises(planner.PlanRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
        planner.plan(**args)


def test_dtypes_and_layouts_are_the_specs():
    with pytest.raises(ValueError, match="dtype must be one of float16, bfloat16 "
                                         "\\(got 'float32'\\)"):
        planner.plan("ascend910b2", 1, 8, 128, 64, dtype="float32")
    assert list(planner.LAYOUTS) == ["BNSD", "BSND"]


def test_platform_table():
    built("planner/libflash_cann_planner.so")
    table = {p["name"]: p for p in planner.platforms()}
    assert set(table) == {"Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4",
                          "Ascend910_93"}
    assert table["Ascend910B2"]["aic_cores"] == 24 and table["Ascend910B3"]["aic_cores"] == 20
    assert round(table["Ascend910B4"]["cube_peak_tflops"], 1) == 245.8


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "flash_cann", "plan", *args],
                          capture_output=True, text=True, timeout=600)


def test_cli_prints_the_plan():
    built("planner/libflash_cann_planner.so")
    result = _cli("--soc", "Ascend910B2", "--shape", "2,32,8192,128", "--causal", "--dtype", "bf16")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for needle in ("tiling     key 1110", "work per AI core", "max/mean", "L0A", "UB",
                   "PREDICTION (roofline model", "% of cube peak"):
        assert needle in out, needle


def test_cli_reports_refusals():
    built("planner/libflash_cann_planner.so")
    result = _cli("--shape", "1,8,128,300")
    assert result.returncode == 1
    assert "head_dim 300 exceeds" in result.stdout


@pytest.mark.parametrize("spelling", ["ascend910b2", "ASCEND910B2", "Ascend910B2"])
def test_soc_names_ignore_case(spelling):
    built("planner/libflash_cann_planner.so")
    assert planner.soc_name(spelling) == "Ascend910B2"


def test_cli_unknown_soc_lists_the_known_ones():
    built("planner/libflash_cann_planner.so")
    result = _cli("--soc", "ascend910b", "--shape", "1,8,128,64")
    assert result.returncode == 1
    assert ("unknown SoC 'ascend910b'; choose one of ascend910b1, ascend910b2, ascend910b3, "
            "ascend910b4, ascend910_93 (any case)") in result.stdout


DOC = Path(__file__).resolve().parents[1] / "docs" / "planner.md"


def test_docs_example_is_what_the_planner_says():
    """docs/planner.md's cost-model example, rounded as printed there."""
    built("planner/libflash_cann_planner.so")
    text = " ".join(DOC.read_text().split())
    found = re.search(r"Example: B=(\d+), H=(\d+), S=(\d+), D=(\d+), bf16, causal on (\w+)\. "
                      r"The model says the (.+?) bounds it at ([\d.]+) ms, which is ([\d.]+) "
                      r"TFLOP/s or ([\d.]+)% of peak", text)
    assert found, "the example sentence changed shape"
    b, h, s, d, soc, bound, ms, tflops, pct = found.groups()
    pred = planner.plan(soc, int(b), int(h), int(s), int(d), dtype="bfloat16",
                        causal=True)["prediction"]
    assert (bound, ms, tflops, pct) == (
        pred["bound"], f"{pred['seconds'] * 1e3:.1f}",
        f"{pred['useful_flops'] / pred['seconds'] / 1e12:.1f}",
        f"{100 * pred['cube_utilization']:.1f}")


def test_docs_buffer_table_is_what_the_planner_says():
    built("planner/libflash_cann_planner.so")
    rows = re.findall(r"^\| (\d+) \| (\d+)×(\d+) \| .* \| (\d+) of 512 KiB "
                      r"\| (\d+) of 184 KiB \|$", DOC.read_text(), re.M)
    assert len(rows) == 3
    for head_dim, block_q, block_k, l1_kib, ub_kib in rows:
        p = planner.plan("ascend910b2", 1, 8, 4096, int(head_dim))
        used = {level["level"]: level["used"] for level in p["levels"]}
        assert (p["tiling"]["block_q"], p["tiling"]["block_k"]) == (int(block_q), int(block_k))
        assert (round(used["L1"] / 1024), round(used["UB"] / 1024)) == (int(l1_kib),
                                                                         int(ub_kib)), head_dim
