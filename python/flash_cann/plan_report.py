"""``flash-cann plan``: print the tiling planner's plan for a shape on an Ascend SoC."""

from __future__ import annotations

import json

from . import planner


def _parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 4:
        raise SystemExit(f"flash-cann plan: --shape must be B,N,S,D (got {text!r})")
    return dims  # type: ignore[return-value]


def add_arguments(parser) -> None:
    parser.add_argument("--soc", default="ascend910b2",
                        help="the Ascend SoC, in any case, e.g. ascend910b2 or Ascend910_93 "
                             "(an unknown name lists the known ones; default: %(default)s)")
    parser.add_argument("--shape", required=True, help="batch,heads,seqlen,head_dim (query)")
    parser.add_argument("--kv-heads", type=int, help="key/value heads (default: heads)")
    parser.add_argument("--seqlen-k", type=int, help="key/value sequence length (default: seqlen)")
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "float16", "bfloat16"],
                        help="input dtype (default: %(default)s)")
    parser.add_argument("--layout", default="BNSD", choices=["BNSD", "BSND"],
                        help="BNSD = (batch, heads, seqlen, head_dim), BSND = (batch, seqlen, "
                             "heads, head_dim) (default: %(default)s)")
    parser.add_argument("--causal", action="store_true",
                        help="bottom-right aligned causal mask (default: off)")
    parser.add_argument("--mask", action="store_true", help="a key padding mask is passed")
    parser.add_argument("--cores", type=int, default=0, help="override the AI core count")
    parser.add_argument("--json", action="store_true", help="print the raw plan as JSON")


def _pct(used: int, capacity: int) -> str:
    return f"{100.0 * used / capacity:5.1f}%" if capacity else "  n/a"


def run(args) -> int:
    batch, heads, seqlen, head_dim = _parse_shape(args.shape)
    dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(args.dtype, args.dtype)
    try:
        p = planner.plan(args.soc, batch, heads, seqlen, head_dim, heads_kv=args.kv_heads,
                         seqlen_k=args.seqlen_k, dtype=dtype, layout=args.layout,
                         causal=args.causal, has_mask=args.mask, aic_cores=args.cores)
    except ValueError as refusal:  # PlanRefused, or an unknown SoC
        print(refusal)
        return 1
    if args.json:
        print(json.dumps(p, indent=1))
        return 0
    plat, t, pred = p["platform"], p["tiling"], p["prediction"]
    kv_heads = args.kv_heads or heads
    seqlen_k = args.seqlen_k or seqlen
    print(f"platform   {plat['name']}: {plat['aic_cores']} AI cores (cube) x 2 vector cores; "
          f"cube peak {plat['cube_peak_tflops']:.1f} TFLOP/s fp16/bf16")
    print(f"problem    batch {batch}, heads {heads} (kv {kv_heads}), seqlen_q {seqlen}, "
          f"seqlen_k {seqlen_k}, head_dim {head_dim}, {dtype}, {args.layout}"
          f"{', causal' if args.causal else ''}{', key mask' if args.mask else ''}")
    print(f"tiling     key {p['tiling_key']}; query blocks of {t['block_q']} rows, key blocks of "
          f"{t['block_k']}; head_dim padded to {t['head_dim_pad']}; {p['block_dim']} AI cores "
          f"launched; tiling data {t['tiling_bytes']} bytes")
    cores = p["cores"]
    macs = [c["macs"] for c in cores]
    mean = sum(macs) / plat["aic_cores"]
    print(f"\nwork per AI core (rows of the flattened batch x heads x seqlen_q space; "
          f"max/mean = {p['imbalance']:.4f})")
    print(f"  {'core':>4} {'rows':>23} {'tiles':>7} {'work/mean':>10}")
    for i, c in enumerate(cores):
        print(f"  {i:>4} {c['rows'][0]:>11}-{c['rows'][1]:<11} {c['tiles']:>7} "
              f"{c['macs'] / mean if mean else 0:>10.3f}")
    print("\nbuffers (per cube core: L1/L0A/L0B/L0C; per vector core: UB)")
    print(f"  {'level':<5} {'buffer':<14} {'bytes':>9} {'x':>2}  stage")
    for b in p["buffers"]:
        print(f"  {b['level']:<5} {b['name']:<14} {b['bytes']:>9,} {b['copies']:>2}  {b['stage']}")
    print("\nmemory per level (UB capacity keeps 8 KB free for the vector API's scratch)")
    for level in p["levels"]:
        print(f"  {level['level']:<4} {level['used']:>9,} / {level['capacity']:>9,} bytes "
              f"{_pct(level['used'], level['capacity'])}")
    print(f"\nworkspace  {p['user_workspace_bytes'] / 2**20:.2f} MiB for the cube<->vector "
          f"exchange (+ the API's system workspace)")
    print("\nPREDICTION (roofline model of docs/planner.md; not a measurement, not run on an NPU)")
    print(f"  time {pred['seconds'] * 1e3:.3f} ms, bound by {pred['bound']}: cube "
          f"{pred['cube_seconds'] * 1e3:.3f} ms, vector {pred['vector_seconds'] * 1e3:.3f} ms, "
          f"HBM {pred['hbm_seconds'] * 1e3:.3f} ms, L2 {pred['l2_seconds'] * 1e3:.3f} ms")
    tflops = pred["useful_flops"] / pred["seconds"] / 1e12 if pred["seconds"] else 0.0
    print(f"  useful {pred['useful_flops'] / 1e12:.2f} TFLOP -> {tflops:.1f} TFLOP/s = "
          f"{100 * pred['cube_utilization']:.1f}% of cube peak")
    return 0
