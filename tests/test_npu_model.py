"""benchmarks/npu_model.py: the calibration and fit tables in docs/schedule-model.md are the ones
the model generates, the committed fit is what the fit reproduces, and every row of the
prediction grid is labelled and sane."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from native_build import built

ROOT = Path(__file__).resolve().parents[1]


def _npu_model():
    spec = importlib.util.spec_from_file_location("npu_model", ROOT / "benchmarks" / "npu_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_calibration_table_in_docs_is_generated():
    built("planner/libflash_cann_planner.so")
    model = _npu_model()
    table = model.calibration_markdown()
    doc = (ROOT / "docs" / "schedule-model.md").read_text()
    assert table in doc, f"docs/schedule-model.md: stale calibration table; it should be:\n{table}"
    assert all(abs(err) <= model.TOLERANCE for *_, err in model.calibration_rows())


def test_prediction_row_carries_the_incumbent_figures():
    built("planner/libflash_cann_planner.so")
    row = _npu_model().predict("Ascend910B2", "float16", 128, 1, 8192, False)
    assert row["incumbent_measured_tflops"] == 97.30
    assert 0 < row["ours_cube_utilization"] < 1 and row["ours_bound"]
    assert row["incumbent_design_tflops"] > 0


def test_fit_reproduces_the_committed_figures_and_residuals():
    """Reruns the fit (op_host/planner/model_fit.cpp, ~1.5 s): it must land on the figures
    committed in engine_rates.cpp with the same residuals, docs/schedule-model.md must hold its
    tables, and the incumbent's held-out calibration points must stay within +-15 %."""
    from flash_cann.ascend import planner
    built("planner/libflash_cann_planner.so")
    model = _npu_model()
    committed, refit = planner.model_fit(), planner.model_fit(refit=True)
    for name in planner.FIT_FIGURES:
        assert refit["figures"][name] == pytest.approx(committed["figures"][name], rel=1e-9,
                                                       abs=1e-9), name
    assert [(p["table"], p["what"]) for p in refit["points"]] == \
        [(p["table"], p["what"]) for p in committed["points"]]
    for a, b in zip(refit["points"], committed["points"]):
        assert a["modelled_us"] == pytest.approx(b["modelled_us"], rel=1e-9), (a["table"], a["what"])
    table = model.fit_markdown(committed)
    doc = (ROOT / "docs" / "schedule-model.md").read_text()
    assert table in doc, f"docs/schedule-model.md: stale fit tables; they should be:\n{table}"
    checks = [p for p in committed["points"] if p["role"].startswith("check")]
    assert len(checks) == 4 and all(abs(p["error"]) <= model.TOLERANCE for p in checks)
    fitted = [p for p in committed["points"] if p["weight"] > 0]
    assert len(fitted) == 8 and all(abs(p["error"]) <= 0.15 for p in fitted)
