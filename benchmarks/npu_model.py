"""Predicted NPU performance of the forward kernel (PREDICTIONS of the schedule model in
docs/planner.md; nothing here ran on an NPU).

    python benchmarks/npu_model.py [--out benchmarks/results/npu_model.json]
    python benchmarks/npu_model.py --calibration    # the calibration table (markdown)

For 910B2 and 910B4, fp16/bf16, head_dim 64/128, seqlen 1k-32k, causal or not, batch 1
with 1 head (the shape of the incumbent's published figures) and 16 heads (the issue-10
target shape): our kernel's modelled TFLOP/s, % of cube peak and bound, the same model
fed the incumbent's design, and the incumbent's measured figure where one exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from flash_cann.ascend import planner  # noqa: E402

# torch_npu fused attention (the incumbent, FlashAttentionScore) measured on a 910B2:
# batch 1, 1 head, fp16, head_dim 128, non-causal, TFLOP/s by seqlen
# (hw-native-sys/pto-isa kernels/manual/common/flash_atten/README.md).
MEASURED_910B2 = {1024: 9.18, 2048: 30.33, 4096: 72.61, 8192: 97.30, 16384: 122.88,
                  32768: 150.78}
CALIBRATION_SEQLENS = (4096, 8192, 16384, 32768)
TOLERANCE = 0.15

SOCS = ("Ascend910B2", "Ascend910B4")
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128)
SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)
HEADS = (1, 16)


def measured(soc: str, dtype: str, head_dim: int, heads: int, seqlen: int,
             causal: bool) -> float | None:
    """The incumbent's measured TFLOP/s for this configuration, if published."""
    if (soc, dtype, head_dim, heads, causal) == ("Ascend910B2", "float16", 128, 1, False):
        return MEASURED_910B2.get(seqlen)
    return None


def _rate(prediction: dict) -> float:
    return prediction["tflops"]


def predict(soc: str, dtype: str, head_dim: int, heads: int, seqlen: int,
            causal: bool) -> dict:
    p = planner.plan(soc, 1, heads, seqlen, head_dim, dtype=dtype, causal=causal)
    ours, inc = p["prediction"], p["incumbent_design_prediction"]
    return {
        "soc": soc, "dtype": dtype, "head_dim": head_dim, "batch": 1, "heads": heads,
        "seqlen": seqlen, "causal": causal,
        "ours_tflops": _rate(ours), "ours_cube_utilization": ours["cube_utilization"],
        "ours_seconds": ours["seconds"], "ours_bound": ours["bound"],
        "incumbent_design_tflops": _rate(inc), "incumbent_design_bound": inc["bound"],
        "incumbent_measured_tflops": measured(soc, dtype, head_dim, heads, seqlen, causal),
    }


def grid() -> list[dict]:
    return [predict(soc, dtype, d, heads, s, causal)
            for soc in SOCS for dtype in DTYPES for d in HEAD_DIMS for heads in HEADS
            for causal in (False, True) for s in SEQLENS]


def calibration_rows() -> list[tuple[int, float, float, float]]:
    """(seqlen, measured, modelled incumbent design, relative error) on 910B2."""
    rows = []
    for s in CALIBRATION_SEQLENS:
        model = predict("Ascend910B2", "float16", 128, 1, s, False)["incumbent_design_tflops"]
        rows.append((s, MEASURED_910B2[s], model, model / MEASURED_910B2[s] - 1))
    return rows


def calibration_markdown() -> str:
    lines = ["| seqlen | incumbent measured (TFLOP/s) | model, incumbent's design | error |",
             "|---:|---:|---:|---:|"]
    for s, meas, model, err in calibration_rows():
        lines.append(f"| {s // 1024}k | {meas:.1f} | {model:.1f} | {100 * err:+.0f} % |")
    return "\n".join(lines)


def _print_table(rows: list[dict]) -> None:
    print("PREDICTIONS of the schedule model (docs/planner.md); measured = the incumbent "
          "(torch_npu) on a 910B2, pto-isa README; nothing here ran on an NPU")
    print(f"{'soc':<12} {'dtype':<9} {'D':>3} {'heads':>5} {'causal':>6} {'seqlen':>6} "
          f"{'ours TF/s':>9} {'% peak':>6} {'incumbent design':>16} {'measured':>8}  bound (ours)")
    for r in rows:
        meas = r["incumbent_measured_tflops"]
        print(f"{r['soc']:<12} {r['dtype']:<9} {r['head_dim']:>3} {r['heads']:>5} "
              f"{'yes' if r['causal'] else 'no':>6} {r['seqlen']:>6} {r['ours_tflops']:>9.1f} "
              f"{100 * r['ours_cube_utilization']:>5.1f}% {r['incumbent_design_tflops']:>16.1f} "
              f"{'' if meas is None else f'{meas:.1f}':>8}  {r['ours_bound']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "npu_model.json"))
    parser.add_argument("--calibration", action="store_true",
                        help="print only the calibration table (markdown, as in docs/planner.md)")
    args = parser.parse_args(argv)
    if args.calibration:
        print(calibration_markdown())
        return 0
    rows = grid()
    _print_table(rows)
    Path(args.out).write_text(json.dumps({
        "label": "PREDICTIONS of the schedule model (docs/planner.md), not measurements",
        "calibration": [dict(zip(("seqlen", "measured", "modelled", "error"), r))
                        for r in calibration_rows()],
        "rows": rows}, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
