"""``flash-cann plan``: print the tiling planner's plan for a shape on an Ascend SoC
(``--backward``: the backward kernel's plan; ``--decode``: the decode kernel's, for
fwd_kvcache)."""

from __future__ import annotations

import json

from ..contract.variant import window_bounds
from . import planner


class Refused(ValueError):
    """A plan that cannot be made as asked (bad arguments, an unknown SoC, a shape the
    planner refuses); the message says why, in one line."""


def _window(args, seqlen_k: int) -> tuple[int, int]:
    """--window as the API reads window_size with the same causal (flash_cann.contract):
    each bound >= -1 (-1: unbounded); with --causal the right bound is 0 whatever is given
    (Mistral's causal=True, window_size=(4096, 0)); a bound >= the key length is none."""
    left, right = tuple(args.window) if args.window is not None else (-1, -1)
    for side, value in (("LEFT", left), ("RIGHT", right)):
        if value < -1:
            raise Refused(f"--window {side} must be an int >= -1 (-1: unbounded), as the "
                          f"API's window_size (got {value})")
    return window_bounds(left, right, args.causal, seqlen_k)


def _parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 4:
        raise Refused(f"--shape must be B,N,S,D (got {text!r})")
    return dims  # type: ignore[return-value]


def _cores(soc: str, cores: int | None) -> int:
    """--cores, checked against the SoC's AI core count (0 tells the planner: all)."""
    if cores is None:
        return 0
    name = planner.soc_name(soc)
    available = next(p["aic_cores"] for p in planner.platforms() if p["name"] == name)
    if not 1 <= cores <= available:
        raise Refused(f"--cores must be in 1..{available}, the AI cores of {name} "
                      f"(got {cores})")
    return cores


def add_arguments(parser) -> None:
    parser.add_argument("--soc", default="ascend910b2",
                        help="the Ascend SoC, in any case, e.g. ascend910b2 or Ascend910_93 "
                             "(an unknown name lists the known ones; default: %(default)s)")
    parser.add_argument("--shape", required=True, help="batch,heads,seqlen,head_dim (query)")
    parser.add_argument("--kv-heads", type=int, help="key/value heads (default: heads)")
    parser.add_argument("--seqlen-k", type=int, help="key/value sequence length (default: seqlen)")
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "float16", "bfloat16"],
                        help="input dtype (default: %(default)s)")
    parser.add_argument("--layout", choices=["BNSD", "BSND", "TND"],
                        help="BNSD = (batch, heads, seqlen, head_dim), BSND = (batch, seqlen, "
                             "heads, head_dim), TND = packed sequences (tokens, heads, head_dim): "
                             "--shape then gives the number of sequences and max_seqlen, "
                             "--tokens the packed tokens (default: BNSD; with --decode BSND, "
                             "flash_attn_with_kvcache's query, the only one it plans)")
    parser.add_argument("--tokens", type=int, nargs="+", metavar="N",
                        help="layout TND: the packed query tokens (and key tokens; default "
                             "batch x seqlen); the prediction takes sequences of equal length")
    parser.add_argument("--causal", action="store_true",
                        help="bottom-right aligned causal mask (default: off)")
    parser.add_argument("--mask", action="store_true", help="a key padding mask is passed")
    parser.add_argument("--cores", type=int,
                        help="use this many AI cores, 1 .. the SoC's (default: all of them)")
    parser.add_argument("--backward", action="store_true",
                        help="plan the backward kernel (FlashCannAttentionGrad)")
    parser.add_argument("--deterministic", action="store_true",
                        help="with --backward: deterministic dQ (fixed-order reduction)")
    parser.add_argument("--window", type=int, nargs=2, metavar=("LEFT", "RIGHT"),
                        help="sliding window: keys i + diagonal - LEFT .. i + diagonal + RIGHT; "
                             "with --causal RIGHT is 0 whatever is given, as the API "
                             "(-1: unbounded on that side; default: none)")
    parser.add_argument("--softcap", type=float, default=0.0,
                        help="scores softcapped to softcap * tanh(s / softcap) (default: off)")
    parser.add_argument("--alibi", choices=["head", "batch_head"],
                        help="ALiBi slopes per head (heads_q,) or per (batch, head)")
    parser.add_argument("--dropout", type=float, default=0.0, metavar="P",
                        help="dropout probability (default: 0)")
    parser.add_argument("--sinks", action="store_true", help="learnable attention sinks")
    parser.add_argument("--fp16-scores", action="store_true",
                        help="the backward's fp16-score fast path (S = QK^T in fp16; --backward "
                             "and --dtype fp16 only: the forward keeps fp32 S)")
    parser.add_argument("--decode", action="store_true",
                        help="the decode kernel's plan (fwd_kvcache, flash_attn_with_kvcache): "
                             "--shape B,heads,new_tokens,D, --seqlen-k the keys per sequence")
    parser.add_argument("--page-size", type=int, default=0,
                        help="with --decode: a paged cache of this page size (0: contiguous)")
    parser.add_argument("--json", action="store_true", help="print the raw plan as JSON")
    parser.add_argument("--traced", action="store_true",
                        help="also time the plan on the CPU twin's timing mode (the kernel's own "
                             "instruction stream, the cost table's fitted rates) and print the traced "
                             "time beside the model's")
    parser.add_argument("--trace-out", metavar="PATH",
                        help="with --traced: write AI core 0's timeline there as Chrome-trace JSON "
                             "(chrome://tracing, Perfetto)")


def _pct(used: int, capacity: int) -> str:
    return f"{100.0 * used / capacity:5.1f}%" if capacity else "  n/a"


def _print_prediction(pred: dict, plat: dict) -> None:
    print(f"PREDICTION (schedule model of docs/schedule-model.md, fitted to PTO's published 910B2 "
          f"tables within -13..+11 % in time, the incumbent's held out within -13..+5 %; not a "
          f"measurement, nothing here ran on an NPU)")
    print(f"  design     {pred['design']}")
    print(f"  time       {pred['seconds'] * 1e3:.3f} ms (launch {pred['launch_seconds'] * 1e6:.1f} us "
          f"+ slowest AI core {pred['core_seconds'] * 1e3:.3f} ms; mean core "
          f"{pred['mean_core_seconds'] * 1e3:.3f} ms; HBM floor {pred['hbm_seconds'] * 1e3:.3f} ms)")
    print(f"  rate       {pred['tflops']:.1f} TFLOP/s = {100 * pred['cube_utilization']:.1f}% of cube "
          f"peak ({plat['cube_peak_tflops']:.1f} TFLOP/s), useful {pred['useful_flops'] / 1e12:.2f} TFLOP")
    print(f"  bound      {pred['bound']}")
    core = pred["core_seconds"]
    for engine, busy in pred["engine_busy_seconds"].items():
        print(f"    {engine:<28} busy {busy * 1e3:9.3f} ms {_pct(busy, core) if core else ''}")


def _problem_lines(p: dict, args, batch, heads, seqlen, head_dim, dtype) -> None:
    plat = p["platform"]
    print(f"platform   {plat['name']}: {plat['aic_cores']} AI cores (cube) x 2 vector cores; "
          f"cube peak {plat['cube_peak_tflops']:.1f} TFLOP/s fp16/bf16")
    print(f"problem    batch {batch}, heads {heads} (kv {args.kv_heads or heads}), seqlen_q "
          f"{seqlen}, seqlen_k {args.seqlen_k or seqlen}, head_dim {head_dim}, {dtype}, "
          f"{layout(args)}{', causal' if args.causal else ''}{', key mask' if args.mask else ''}")
    features = _feature_names(args)
    print(f"features   {', '.join(features) if features else 'none'}")


def _feature_names(args) -> list[str]:
    names = []
    if args.window is not None:
        names.append(f"window ({args.window[0]}, {args.window[1]})")
    if args.softcap:
        names.append(f"softcap {args.softcap:g}")
    if args.alibi:
        names.append(f"ALiBi ({'per head' if args.alibi == 'head' else 'per batch and head'})")
    if args.dropout:
        names.append(f"dropout {args.dropout:g}")
    if args.sinks:
        names.append("sinks")
    if getattr(args, "fp16_scores", False):
        names.append("fp16 scores")
    return names


def _memory_lines(p: dict) -> None:
    print("\nbuffers (per cube core: L1/L0A/L0B/L0C; per vector core: UB)")
    print(f"  {'level':<5} {'buffer':<14} {'bytes':>9} {'x':>2}  stage")
    for b in p["buffers"]:
        print(f"  {b['level']:<5} {b['name']:<14} {b['bytes']:>9,} {b['copies']:>2}  {b['stage']}")
    print("\nmemory per level (UB capacity keeps 8 KB free for the vector API's scratch)")
    for level in p["levels"]:
        print(f"  {level['level']:<4} {level['used']:>9,} / {level['capacity']:>9,} bytes "
              f"{_pct(level['used'], level['capacity'])}")


def _forward_report(p: dict) -> None:
    plat, t, pred = p["platform"], p["tiling"], p["prediction"]
    print(f"tiling     key {p['tiling_key']}; query blocks of {t['block_q']} rows, key blocks of "
          f"{t['block_k']}; head_dim padded to {t['head_dim_pad']}; {p['block_dim']} AI cores "
          f"launched; tiling data {t['tiling_bytes']} bytes")
    print(f"kernel     {'FEATURES (window, softcap, ALiBi, dropout, sinks as runtime branches)' if t['features'] else 'plain'}")
    print(f"rounds     {t['key_stack']} key blocks ({t['key_stack'] * t['block_k']} keys) per "
          f"cube/vector round; vector slices of {t['vec_rows']} rows")
    if t["cube_rows"] < t["block_q"]:
        print(f"cube       row passes of {t['cube_rows']} rows (Q of a pass into L0A per product, "
              f"O of a pass in L0C, V of a round kept in L1 for every pass)")
    cores = p["cores"]
    macs = [c["macs"] for c in cores]
    mean = sum(macs) / plat["aic_cores"]
    if "prediction_assumes" in p:  # TND
        print("\nwork per AI core: split on the device from cu_seqlens (docs/kernel.md, "
              "\"Packed sequences\")")
    else:
        print(f"\nwork per AI core (rows of the flattened batch x heads x seqlen_q space; "
              f"max/mean = {p['imbalance']:.4f})")
        print(f"  {'core':>4} {'rows':>23} {'tiles':>7} {'work/mean':>10}")
    for i, c in enumerate(cores):
        print(f"  {i:>4} {c['rows'][0]:>11}-{c['rows'][1]:<11} {c['tiles']:>7} "
              f"{c['macs'] / mean if mean else 0:>10.3f}")
    _memory_lines(p)
    print(f"\nworkspace  {p['user_workspace_bytes'] / 2**20:.2f} MiB for the cube<->vector "
          f"exchange (+ the API's system workspace)")
    print()
    _print_prediction(pred, plat)
    if "prediction_assumes" in p:
        print(f"  assumes    {p['prediction_assumes']}")
    inc = p["incumbent_design_prediction"]
    if inc is not None:  # none for TND: the incumbent's takes host lists of lengths
        print(f"  same model, incumbent's design ({inc['design']}): {inc['tflops']:.1f} TFLOP/s = "
              f"{100 * inc['cube_utilization']:.1f}% of cube peak, bound: {inc['bound']}")
    pto = p.get("pto_design_prediction")
    if pto is not None:  # where PTO's fp16 templates take the shape
        print(f"  same model, PTO's design ({pto['design']}): {pto['tflops']:.1f} TFLOP/s = "
              f"{100 * pto['cube_utilization']:.1f}% of cube peak, bound: {pto['bound']}")


def _backward_report(p: dict, deterministic: bool) -> None:
    plat, t, ws = p["platform"], p["tiling"], p["workspace"]
    variant = (f"deterministic: a query pass over {t['query_units']} query blocks recomputes S, dP "
               f"and dS and accumulates dQ in L0C, key blocks in order; no atomics"
               if deterministic else
               f"fast: fp32 atomic adds into one accumulator, in {t['product_rows']}-row x "
               f"{t['dq_columns']}-column pieces")
    print(f"tiling     key {p['tiling_key']}; query blocks of {t['block_q']} rows, key blocks of "
          f"{t['block_k']} ({t['key_blocks']} per head); head_dim padded to {t['head_dim_pad']}; "
          f"S, dP out of L0C in {t['product_rows']}-row pieces ({t['l0c_scratch_buffers']} L0C "
          f"scratch copies); pre/post-pass chunks of {t['pass_rows']} rows; {p['block_dim']} AI "
          f"cores launched; "
          f"tiling data {t['tiling_bytes']} bytes")
    print(f"dQ         {variant}")
    cores = p["cores"]
    mean = sum(c["macs"] + c["query_macs"] for c in cores) / plat["aic_cores"]
    print(f"\nwork per AI core (units of the flattened batch x heads_kv x key block space, "
          f"each with the query blocks that see it"
          f"{'; query units of batch x heads_q x query block' if deterministic else ''}; "
          f"max/mean = {p['imbalance']:.4f})")
    head = f"  {'core':>4} {'units':>23} {'steps':>9}"
    if deterministic:
        head += f" {'query units':>23} {'steps':>9}"
    print(f"{head} {'work/mean':>10}")
    for i, c in enumerate(cores):
        query = (f" {c['query_units'][0]:>11}-{c['query_units'][1]:<11} {c['query_steps']:>9}"
                 if deterministic else "")
        print(f"  {i:>4} {c['units'][0]:>11}-{c['units'][1]:<11} {c['steps']:>9}{query} "
              f"{(c['macs'] + c['query_macs']) / mean if mean else 0:>10.3f}")
    _memory_lines(p)
    mib = 2 ** 20
    print(f"\nworkspace  {p['user_workspace_bytes'] / mib:.2f} MiB (+ the API's system "
          f"workspace): D {ws['delta'] / mib:.2f}, dQ fp32 {ws['dq'] / mib:.2f}, dK/dV fp32 "
          f"{ws['dk_dv'] / mib:.2f}, cube<->vector exchange {ws['exchange'] / mib:.2f}"
          + (f", score offset panels {ws['offsets'] / mib:.2f}" if ws["offsets"] else ""))
    pred = p["prediction"]
    if pred is None:
        print("\nPREDICTION: none for packed sequences (the backward model walks the planner's "
              "split; the kernel's is on the device)")
        return
    print("\nPREDICTION (backward schedule model of docs/schedule-model.md; not a measurement, nothing "
          "here ran on an NPU)")
    print(f"  time       {pred['seconds'] * 1e3:.3f} ms (pre-pass {pred['pre_seconds'] * 1e3:.3f} "
          f"+ main loop {pred['main_seconds'] * 1e3:.3f} + post-pass "
          f"{pred['post_seconds'] * 1e3:.3f} ms)")
    if deterministic:
        print(f"  query pass {pred['query_pass_seconds'] * 1e3:.3f} ms of the slowest core's main "
              f"loop (S, dP, dS recomputed for dQ)")
    print(f"  rate       {pred['tflops']:.1f} TFLOP/s = {100 * pred['cube_utilization']:.1f}% of "
          f"cube peak ({pred['cube_peak_tflops']:.1f} TFLOP/s), counting 2.5x the forward's "
          f"{pred['useful_flops'] / 2.5e12:.2f} TFLOP")
    print(f"  bound      {pred['bound']}")
    print(f"  vector     {pred['vector_step_seconds'] * 1e6:.3f} us of compute per step and "
          f"vector core, the features' work included")
    main = pred["main_seconds"]
    for engine, busy in pred["engine_busy_seconds"].items():
        print(f"    {engine:<28} busy {busy * 1e3:9.3f} ms {_pct(busy, main) if main else ''}")


def _decode_report(p: dict) -> None:
    t, pred, plat = p["tiling"], p["prediction"], p["platform"]
    print(f"tiling     key {p['tiling_key']}; tiles of {t['block_q']} rows ({t['row_tiles']} per "
          f"sequence and kv head: group {t['group']} x new tokens), rounds of {t['round_keys']} keys "
          f"({t['key_stack']} x {t['block_k']}), {t['splits']} split(s) of each tile's keys; "
          f"{t['units']} units on {t['used_cores']} AI cores; "
          f"{'paged' if t['paged'] else 'contiguous'} cache of {t['capacity']} keys per sequence")
    print(f"workspace  {p['user_workspace_bytes']:,} bytes")
    _memory_lines(p)
    print(f"\nPREDICTION (decode schedule model of docs/planner.md, \"The decode plan\"; the forward "
          f"model's fitted engine rates, not calibrated against any decode measurement; nothing "
          f"here ran on an NPU), every sequence holding {pred['keys_per_sequence']} keys")
    print(f"  time       {pred['seconds'] * 1e6:.1f} us (launch {pred['launch_seconds'] * 1e6:.1f} us + "
          f"slowest core {pred['core_seconds'] * 1e6:.1f} us, HBM floor {pred['hbm_seconds'] * 1e6:.1f} us; "
          f"combine {pred['combine_seconds'] * 1e6:.1f} us)")
    print(f"  HBM        {pred['hbm_bytes'] / 1e6:.1f} MB at {plat['hbm_gb_per_s']:.0f} GB/s: "
          f"{100 * pred['hbm_use']:.1f}% of HBM bandwidth")
    print(f"  bound      {pred['bound']}")


def layout(args) -> str:
    """The query's layout: --layout, else the kernel's default (the decode kernel plans
    flash_attn_with_kvcache's (batch, seqlen_q, heads, head_dim) query only)."""
    return args.layout or ("BSND" if getattr(args, "decode", False) else "BNSD")


def _run_decode(args, batch, heads, seqlen, head_dim, dtype) -> int:
    if args.backward or args.dropout or args.mask:
        raise Refused("--decode is a forward of its own: no --backward, --dropout or --mask")
    if layout(args) != "BSND":
        raise Refused(f"--decode plans flash_attn_with_kvcache's query, (batch, seqlen_q, heads, "
                      f"head_dim) = BSND: not --layout {args.layout}")
    if not args.seqlen_k:
        raise Refused("--decode needs --seqlen-k, the keys per sequence")
    try:
        window = _window(args, args.seqlen_k)
        features = planner.variant(window=window, softcap=args.softcap, alibi=args.alibi,
                                   sinks=args.sinks)
        p = planner.decode_plan(args.soc, batch, heads, seqlen, head_dim, heads_kv=args.kv_heads,
                                keys=args.seqlen_k, page_size=args.page_size, dtype=dtype,
                                causal=args.causal, aic_cores=_cores(args.soc, args.cores),
                                features=features)
    except ValueError as refusal:
        raise Refused(str(refusal)) from refusal
    if args.json:
        print(json.dumps(p, indent=1))
        return 0
    _problem_lines(p, args, batch, heads, seqlen, head_dim, dtype)
    _decode_report(p)
    return 0


def problem(args) -> dict:
    """The call the arguments describe, as the kernels take it: shape, dtype, causal, the
    normalised window (--traced times this call)."""
    batch, heads, seqlen, head_dim = _parse_shape(args.shape)
    return {"batch": batch, "heads": heads, "seqlen_q": seqlen, "seqlen_k": args.seqlen_k or seqlen,
            "head_dim": head_dim, "dtype": {"fp16": "float16", "bf16": "bfloat16"}.get(args.dtype, args.dtype),
            "window": _window(args, args.seqlen_k or seqlen)}


def run(args) -> int:
    """Print the plan; raises Refused if it cannot be made as asked."""
    batch, heads, seqlen, head_dim = _parse_shape(args.shape)
    dtype = {"fp16": "float16", "bf16": "bfloat16"}.get(args.dtype, args.dtype)
    if args.traced and args.json:
        raise Refused("--traced prints beside the report: not with --json")
    if args.trace_out and not args.traced:
        raise Refused("--trace-out applies to --traced only")
    if args.deterministic and not args.backward:
        raise Refused("--deterministic applies to --backward only")
    if args.fp16_scores and not args.backward:
        raise Refused("--fp16-scores applies to --backward only: the forward keeps fp32 S "
                      "(fp16_scores=True plans the forward as without it)")
    if getattr(args, "decode", False):
        return _run_decode(args, batch, heads, seqlen, head_dim, dtype)
    try:
        window = _window(args, args.seqlen_k or seqlen)
        tokens = (0, 0)
        if layout(args) == "TND":
            given = args.tokens or [batch * seqlen]
            tokens = (given[0], given[1] if len(given) > 1 else given[0])
        elif args.tokens:
            raise Refused("--tokens applies to --layout TND only")
        features = planner.variant(window=window, softcap=args.softcap, dropout_p=args.dropout,
                                   alibi=args.alibi, sinks=args.sinks, tokens=tokens,
                                   fp16_scores=args.fp16_scores)
        options = dict(heads_kv=args.kv_heads, seqlen_k=args.seqlen_k, dtype=dtype,
                       layout=layout(args), causal=args.causal, has_mask=args.mask,
                       aic_cores=_cores(args.soc, args.cores), features=features)
        if args.backward:
            p = planner.grad_plan(args.soc, batch, heads, seqlen, head_dim,
                                  deterministic=args.deterministic, **options)
        else:
            p = planner.plan(args.soc, batch, heads, seqlen, head_dim, **options)
    except ValueError as refusal:  # PlanRefused, an unknown SoC, or --cores
        raise Refused(str(refusal)) from refusal
    if args.json:
        print(json.dumps(p, indent=1))
        return 0
    _problem_lines(p, args, batch, heads, seqlen, head_dim, dtype)
    if args.backward:
        _backward_report(p, args.deterministic)
    else:
        _forward_report(p)
    return 0
