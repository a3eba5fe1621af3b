"""The twin's cost table calibrated on public measurements (docs/twin.md, "Timing mode").

The measurements are of other kernels: PTO's hand kernel (hw-native-sys/pto-isa
``kernels/manual/common/flash_atten/README.md``: 1/2-core marginal times, the 24-core
910B2 column) and torch_npu's FlashAttentionScore (the incumbent, held out). Their code
does not run on the twin, so what is compared is what the trace of our kernel shares
with the schedule model's descriptions of theirs: the engine figures. The schedule
model's fit (op_host/planner/model_fit.h, ``planner.model_fit``) sets the Fixpipe, MTE2
and shared-L2 rates, the per-instruction issue and per-transfer costs and the launch on
PTO's points; this module carries those figures into the cost table as its "fitted"
entries. The trace's latencies (issue to data usable), scalar costs and SyncAll have no
counterpart in the model or the data: they stay assumed.
"""

from __future__ import annotations

import json

from ...ascend import planner
from . import timing

FIT_COMMAND = "python benchmarks/npu_model.py --fit-trace"
# The cube rate used: one 16x16x16 product a cycle (353.9 TFLOP/s on 910B2, the ini's
# peak). A measured 910B2 fp16 GEMM reaches ~314.5 TFLOP/s (cann-notes section 8), 89 % of
# it; the trace and the model charge Mmad at the engine's rate and price the GEMM's other
# engines separately, so the 11 % is not taken off the cube here (the fit's points are
# Fixpipe- and L2-bound and cannot tell the two apart: docs/twin.md, "Timing mode").
CUBE_NOTE = ("cube peak 353.9 TFLOP/s (ini, one 16x16x16 product a cycle); the measured GEMM "
             "peak ~314.5 TFLOP/s (zzc0721/torch-performance-test-data issue 109) is a whole "
             "kernel's rate, not the engine's")


def _scaled(name: str, figure: str):
    return name, lambda base, f: base[name] * f[figure], f"the sourced figure x the fit's {figure}"


def _set(name: str, figure: str):
    return name, lambda base, f: f[figure], f"the fit's {figure}"


# Each fitted entry of the cost table: (name, its value from (unfitted table, fit figures),
# what it is). The model's issue cost (Mmad, LoadData, vector) is the trace's issue on M,
# MTE1 and V; its per-transfer start-up the issue on MTE2, MTE3 and FIX.
FITTED = (
    _scaled("bytes_per_cycle.l0c_to_gm", "fixpipe_scale"),
    _scaled("bytes_per_cycle.gm_to_l1", "mte2_scale"),
    _scaled("bytes_per_cycle.gm_to_ub", "mte2_scale"),
    _scaled("l2_bytes_per_cycle", "l2_scale"),
    _set("issue_cycles.M", "issue_cycles"),
    _set("issue_cycles.MTE1", "issue_cycles"),
    _set("issue_cycles.V", "issue_cycles"),
    _set("issue_cycles.MTE2", "transfer_cycles"),
    _set("issue_cycles.MTE3", "transfer_cycles"),
    _set("issue_cycles.FIX", "transfer_cycles"),
    _set("launch_cycles", "launch_cycles"),
)
SOC = "Ascend910B2"  # the fit's data are 910B2's


def fitted_entries(fit: dict | None = None) -> dict[str, dict]:
    """The cost table's "fitted" entry of every figure the fit sets, from ``fit``
    (``planner.model_fit()``: the committed fit)."""
    fit = fit or planner.model_fit()
    base = timing.cost_table(SOC, "unfitted")
    return {name: {"value": round(value(base, fit["figures"]), 6), "from": what, "fit": FIT_COMMAND}
            for name, value, what in FITTED}


def write_fitted(fit: dict | None = None) -> None:
    """Write the fitted entries into twin/timing/costs.json (the unfitted values stay)."""
    path = timing.cost_table_path()
    table = json.loads(path.read_text())
    for name, entry in fitted_entries(fit).items():
        table[SOC][name]["fitted"] = entry
    path.write_text(json.dumps(table, indent=1, ensure_ascii=False))
    timing.cost_table.cache_clear()


def issue_profile(fit: dict | None = None, settings=((0, 0), (0, 4), (8, 0), (8, 4), (50, 4),
                                                      (100, 8))) -> list[dict]:
    """What the data say of the per-transfer and per-instruction costs: the fit's cost and
    its fitted points' errors with those two set to each of ``settings`` (transfer,
    issue cycles), the other figures at the fit's."""
    fit = fit or planner.model_fit()
    base = {k: fit["figures"][k] for k in planner.FIT_FIGURES}
    rows = []
    for transfer, issue in settings:
        at = planner.model_fit(figures=dict(base, transfer_cycles=transfer, issue_cycles=issue))
        rows.append({"transfer_cycles": transfer, "issue_cycles": issue, "cost": at["cost"],
                     "fitted_errors": [p["error"] for p in at["points"] if p["weight"] > 0]})
    return rows
