"""benchmarks/npu_model.py: the calibration table in docs/planner.md is the one the
model generates, and every row of the prediction grid is labelled and sane."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
    doc = (ROOT / "docs" / "planner.md").read_text()
    assert table in doc, f"docs/planner.md: stale calibration table; it should be:\n{table}"
    assert all(abs(err) <= model.TOLERANCE for *_, err in model.calibration_rows())


def test_prediction_row_carries_the_incumbent_figures():
    built("planner/libflash_cann_planner.so")
    row = _npu_model().predict("Ascend910B2", "float16", 128, 1, 8192, False)
    assert row["incumbent_measured_tflops"] == 97.30
    assert 0 < row["ours_cube_utilization"] < 1 and row["ours_bound"]
    assert row["incumbent_design_tflops"] > 0
