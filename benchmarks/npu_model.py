"""Predicted NPU performance of the forward kernel (PREDICTIONS of the schedule model in
docs/schedule-model.md; nothing here ran on an NPU).

    python benchmarks/npu_model.py [--out benchmarks/results/npu_model.json]
    python benchmarks/npu_model.py --calibration    # the calibration table (markdown)
    python benchmarks/npu_model.py --fit            # rerun the model's fit, print it
    python benchmarks/npu_model.py --fit-trace      # carry the fit into the twin's cost table
    python benchmarks/npu_model.py --traced [--rates unfitted]  # the model beside the trace

For 910B2 and 910B4, fp16/bf16, head_dim 64/128, seqlen 1k-32k, causal or not, batch 1
with 1 head (the shape of the published figures) and 16 heads (the issue-10 target
shape): side by side, our kernel's modelled TFLOP/s, % of cube peak and bound, the same
model fed the incumbent's design and PTO's hand kernel's, and the measured figures of
both where published (910B2, fp16, D128, 1 head, non-causal).
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
# PTO's hand kernel in the same table (the fit's data: op_host/planner/model_fit.cpp).
PTO_MEASURED_910B2 = {1024: 25.61, 2048: 66.16, 4096: 96.62, 8192: 117.42, 16384: 151.19,
                      32768: 168.50}
CALIBRATION_SEQLENS = (4096, 8192, 16384, 32768)
TOLERANCE = 0.15

SOCS = ("Ascend910B2", "Ascend910B4")
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128)
SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)
HEADS = (1, 16)


def measured(soc: str, dtype: str, head_dim: int, heads: int, seqlen: int,
             causal: bool, table: dict = MEASURED_910B2) -> float | None:
    """The measured TFLOP/s of ``table`` (the incumbent's or PTO's) for this
    configuration, if published."""
    if (soc, dtype, head_dim, heads, causal) == ("Ascend910B2", "float16", 128, 1, False):
        return table.get(seqlen)
    return None


def _rate(prediction: dict | None) -> float | None:
    return None if prediction is None else prediction["tflops"]


def _binding(prediction: dict | None) -> str | None:
    """The bound and the busiest engine's share of the slowest core's time."""
    if prediction is None:
        return None
    if "busy" in prediction["bound"]:  # an engine, or the chain with its busiest engine
        return prediction["bound"]
    engine, busy = max(prediction["engine_busy_seconds"].items(), key=lambda kv: kv[1])
    return f"{prediction['bound']}; busiest {engine} {100 * busy / prediction['core_seconds']:.0f}%"


def predict(soc: str, dtype: str, head_dim: int, heads: int, seqlen: int,
            causal: bool) -> dict:
    p = planner.plan(soc, 1, heads, seqlen, head_dim, dtype=dtype, causal=causal)
    ours, inc, pto = p["prediction"], p["incumbent_design_prediction"], p["pto_design_prediction"]
    return {
        "soc": soc, "dtype": dtype, "head_dim": head_dim, "batch": 1, "heads": heads,
        "seqlen": seqlen, "causal": causal,
        "ours_tflops": _rate(ours), "ours_cube_utilization": ours["cube_utilization"],
        "ours_seconds": ours["seconds"], "ours_bound": _binding(ours),
        "incumbent_design_tflops": _rate(inc), "incumbent_design_bound": _binding(inc),
        "incumbent_measured_tflops": measured(soc, dtype, head_dim, heads, seqlen, causal),
        # PTO's kernel is fp16 only (None for bf16)
        "pto_design_tflops": _rate(pto), "pto_design_bound": _binding(pto),
        "pto_measured_tflops": measured(soc, dtype, head_dim, heads, seqlen, causal,
                                        PTO_MEASURED_910B2),
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


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _print_table(rows: list[dict]) -> None:
    print("PREDICTIONS of the schedule model at the fitted rates (docs/schedule-model.md: the fit's "
          "errors, the calibration, the sensitivity); measured = torch_npu (the incumbent) and "
          "PTO on a 910B2, pto-isa README; nothing here ran on an NPU. TFLOP/s:")
    print(f"{'soc':<12} {'dtype':<9} {'D':>3} {'heads':>5} {'causal':>6} {'seqlen':>6} "
          f"{'ours':>6} {'% peak':>6} {'incumbent':>9} {'measured':>8} {'PTO':>6} "
          f"{'measured':>8}  bound (ours)")
    for r in rows:
        print(f"{r['soc']:<12} {r['dtype']:<9} {r['head_dim']:>3} {r['heads']:>5} "
              f"{'yes' if r['causal'] else 'no':>6} {r['seqlen']:>6} {r['ours_tflops']:>6.1f} "
              f"{100 * r['ours_cube_utilization']:>5.1f}% {r['incumbent_design_tflops']:>9.1f} "
              f"{_cell(r['incumbent_measured_tflops']):>8} {_cell(r['pto_design_tflops']):>6} "
              f"{_cell(r['pto_measured_tflops']):>8}  {r['ours_bound']}")


def fit_markdown(fit: dict | None = None) -> str:
    """docs/schedule-model.md's "Fitted model" tables: the figures, then every point."""
    fit = fit or planner.model_fit()
    f = fit["figures"]
    lines = ["| figure | fitted | on 910B2 |", "|---|---:|---|",
             f"| Fixpipe scale | {f['fixpipe_scale']:.4f} | {f['fixpipe_gb_per_s']:.1f} GB/s per core |",
             f"| MTE2 scale | {f['mte2_scale']:.4f} | L2 → L1 {f['l2_to_l1_gb_per_s']:.1f}, "
             f"L2 → UB {f['l2_to_ub_gb_per_s']:.1f} GB/s per core |",
             f"| shared L2 scale | {f['l2_scale']:.4f} | {f['l2_tb_per_s']:.2f} TB/s |",
             f"| per-transfer start-up | {f['transfer_cycles']:.1f} cycles | MTE2, MTE3, Fixpipe |",
             f"| per-instruction issue | {f['issue_cycles']:.2f} cycles | Mmad, LoadData, vector |",
             f"| launch | {f['launch_cycles']:.0f} cycles | {f['launch_us']:.2f} µs |",
             "", "| table | point | measured (µs) | model (µs) | error | role |",
             "|---|---|---:|---:|---:|---|"]
    for p in fit["points"]:
        lines.append(f"| {p['table']} | {p['what']} | {p['measured_us']:.2f} | "
                     f"{p['modelled_us']:.2f} | {100 * p['error']:+.1f} % | {p['role']} |")
    return "\n".join(lines)


def print_fit(fit: dict) -> None:
    f = fit["figures"]
    print(f"the schedule model fitted to pto-isa's flash_atten tables ({fit['evaluations']} "
          f"model evaluations, cost {fit['cost']:.5f}); figures:")
    for name in planner.FIT_FIGURES:
        print(f"  {name:<16} {f[name]:.10g}")
    print(f"  = Fixpipe {f['fixpipe_gb_per_s']:.1f} GB/s per core, L2 -> L1 "
          f"{f['l2_to_l1_gb_per_s']:.1f} GB/s, shared L2 {f['l2_tb_per_s']:.2f} TB/s, launch "
          f"{f['launch_us']:.2f} us on 910B2")
    print(f"{'table':<20} {'point':<11} {'measured us':>11} {'model us':>9} {'error':>7}  role")
    for p in fit["points"]:
        print(f"{p['table']:<20} {p['what']:<11} {p['measured_us']:>11.2f} "
              f"{p['modelled_us']:>9.2f} {100 * p['error']:>+6.1f}%  {p['role']}")


def traced_grid() -> list:
    """The problems the model is held to the twin's trace on (910B2, fp16, batch 1, 16
    heads): each kernel at head_dim 64/128/256, causal and not, 4k-32k; each feature;
    decode at batch 1 and 64."""
    from flash_cann.backends.twin.traced import Problem
    problems = []
    for d in (64, 128, 256):
        for causal in (False, True):
            problems += [Problem("forward", 1, 16, s, s, d, causal=causal) for s in (4096, 16384)]
            problems.append(Problem("backward", 1, 16, 4096, 4096, d, causal=causal))
    problems += [Problem("forward", 1, 16, 32768, 32768, 128, causal=c) for c in (False, True)]
    problems.append(Problem("backward", 1, 16, 16384, 16384, 128))
    problems += [Problem("backward-deterministic", 1, 16, 4096, 4096, 128, causal=c)
                 for c in (False, True)]
    # batch 64 at 32k keys would need 17 GB of zero caches here: 2k and 4k keys instead
    problems += [Problem("decode", 1, 16, 1, keys, 128) for keys in (4096, 32768)]
    problems += [Problem("decode", 64, 16, 1, keys, 128) for keys in (2048, 4096)]
    problems += [Problem("forward", 1, 16, 4096, 4096, 128, causal=True).with_feature(f)
                 for f in ("mask", "window", "softcap", "alibi", "dropout", "sinks", "tnd", "gqa")]
    problems += [Problem("backward", 1, 16, 4096, 4096, 128, causal=True).with_feature(f)
                 for f in ("window", "dropout", "gqa")]
    return problems


def print_fit_trace(fit: dict) -> None:
    """The twin's fitted cost-table entries, the points they rest on (the incumbent's
    held out), and what the data say of the per-instruction costs."""
    from flash_cann.backends.twin import calibration
    print(f"the twin's cost table ({calibration.SOC}) calibrated by the schedule model's fit to "
          f"PTO's published tables; {calibration.CUBE_NOTE}")
    for name, entry in calibration.fitted_entries(fit).items():
        print(f"  {name:<28} {entry['value']:>12.6g}  ({entry['from']})")
    print(f"{'table':<20} {'point':<11} {'measured us':>11} {'model us':>9} {'error':>7}  role")
    for held_out in (False, True):
        for p in fit["points"]:
            if p["table"].startswith("incumbent") == held_out:
                print(f"{p['table']:<20} {p['what']:<11} {p['measured_us']:>11.2f} "
                      f"{p['modelled_us']:>9.2f} {100 * p['error']:>+6.1f}%  {p['role']}")
    print("per-transfer / per-instruction cycles: the fit's cost and its fitted points' errors")
    for row in calibration.issue_profile(fit):
        errors = " ".join(f"{100 * e:+.1f}" for e in row["fitted_errors"])
        print(f"  {row['transfer_cycles']:>4} / {row['issue_cycles']:>2}  cost {row['cost']:.4f}  "
              f"errors % {errors}")


def traced_rows(problems, rates: str = "fitted") -> list[dict]:
    """Each problem's model time beside its traced time (the twin's report summarised)."""
    from flash_cann.backends.twin.traced import trace
    rows = []
    for problem in problems:
        row = trace(problem, rates=rates)
        report = row.pop("report")
        row.pop("trace")
        row["model_vs_traced"] = (None if row["model_ms"] is None else
                                  row["model_ms"] / row["traced_ms"] - 1)
        row["critical_path_shares"] = report["critical_path_shares"]
        rows.append(row)
        model = "n/a" if row["model_ms"] is None else f"{row['model_ms']:9.3f}"
        diff = "" if row["model_vs_traced"] is None else f"{100 * row['model_vs_traced']:+6.1f}%"
        print(f"{row['kernel']:<23} {str(row['shape']):<28} {'causal' if row['causal'] else '':<6} "
              f"{','.join(row['features']):<8} {model:>9} {row['traced_ms']:9.3f} {diff:>7}  "
              f"{row['binding_pipe']}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the JSON written (default: results/npu_model.json, with "
                                      "--traced results/npu-traced.json)")
    parser.add_argument("--calibration", action="store_true",
                        help="print only the calibration table (markdown, as in docs/schedule-model.md)")
    parser.add_argument("--fit", action="store_true",
                        help="rerun the model's fit to PTO's published tables and print it")
    parser.add_argument("--fit-trace", action="store_true",
                        help="write the committed fit's figures into the twin's cost table "
                             "(twin/timing/costs.json, the 'fitted' entries) and print the points")
    parser.add_argument("--traced", action="store_true",
                        help="hold the model to the twin's timing mode: write "
                             "benchmarks/results/npu-traced.json (or --out)")
    parser.add_argument("--rates", choices=("fitted", "unfitted"), default="fitted",
                        help="with --traced: the cost table's figures the twin runs at")
    args = parser.parse_args(argv)
    if args.fit_trace:
        from flash_cann.backends.twin import calibration
        fit = planner.model_fit()
        calibration.write_fitted(fit)
        print_fit_trace(fit)
        return 0
    if args.traced:
        out = Path(args.out or Path(__file__).parent / "results" / "npu-traced.json")
        print(f"{'kernel':<23} {'shape (B, N, Sq, Sk, D)':<28} {'':<6} {'feature':<8} "
              f"{'model ms':>9} {'traced ms':>9} {'model':>7}  binding (traced)")
        from flash_cann.backends.twin.timing import LABELS
        rows = traced_rows(traced_grid(), args.rates)
        out.write_text(json.dumps({
            "label": f"model: PREDICTIONS of the schedule model (fitted rates); traced: the twin's "
                     f"timing mode, {LABELS[args.rates]}; nothing ran on an NPU",
            "soc": "Ascend910B2", "rows": rows}, indent=1) + "\n")
        print(f"\nwrote {out}")
        return 0
    if args.calibration:
        print(calibration_markdown())
        return 0
    if args.fit:
        print_fit(planner.model_fit(refit=True))
        return 0
    rows = grid()
    _print_table(rows)
    out = Path(args.out or Path(__file__).parent / "results" / "npu_model.json")
    out.write_text(json.dumps({
        "label": "PREDICTIONS of the schedule model (docs/schedule-model.md), not measurements",
        "fit": planner.model_fit(),
        "calibration": [dict(zip(("seqlen", "measured", "modelled", "error"), r))
                        for r in calibration_rows()],
        "rows": rows}, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
