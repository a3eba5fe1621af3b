"""Traced kernel times: the twin's timing mode (timing.py), without the arithmetic, on a
problem's shapes, beside the schedule model's prediction for the same plan.

The twin runs every AI core of a launch as three threads, so a 24-core launch of a long
shape is slow on a small host. A problem whose batch x heads shares a factor with the
cores is traced on a **blockDim-scaled stand-in**: batch x heads and the cores divided by
their common factor g, so every core gets the same tiles as in the full launch, with the
L2 bandwidth still shared by all the SoC's cores (Timing.share_cores). The traced time is
the stand-in's; ``traced_as`` says what ran. (The split of causal work over cores may
balance differently on fewer cores.)

The twin shares the L2 among the cores but does not model HBM per transfer, so a traced
time is at least the HBM floor: the launch plus the problem's tensors once (inputs read,
outputs written) over the SoC's HBM bandwidth, the floor the schedule model takes too.
Decode, which streams the whole cache, is where it binds.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ...ascend import planner
from ...contract.variant import Variant
from . import launcher
from .timing import LABELS, Timing

KERNELS = ("forward", "backward", "backward-deterministic", "decode")
# The features by name, and the values ``Problem.with_feature`` takes them at.
FEATURES = ("mask", "window", "softcap", "alibi", "dropout", "sinks", "tnd", "gqa")
WINDOW, SOFTCAP, DROPOUT, GQA_GROUP = 1024, 30.0, 0.1, 4


@dataclasses.dataclass(frozen=True)
class Problem:
    """A kernel call's shapes and features. ``window``: as contract.variant normalises
    window_size (-1: unbounded; with ``causal`` the right bound is -1); ``alibi``: slopes
    per head; ``heads_kv`` 0: as many as ``heads``; ``tnd``: packed sequences of equal
    length."""

    kernel: str
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str = "float16"
    causal: bool = False
    heads_kv: int = 0
    mask: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout_p: float = 0.0
    sinks: bool = False
    tnd: bool = False

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"flash_cann: kernel must be one of {KERNELS} (got {self.kernel!r})")
        if self.heads_kv == 0:
            object.__setattr__(self, "heads_kv", self.heads)

    def with_feature(self, name: str) -> "Problem":
        """This problem with feature ``name`` at the module's values."""
        values = {"mask": {"mask": True},
                  "window": {"window": (WINDOW, -1 if self.causal else WINDOW)},
                  "softcap": {"softcap": SOFTCAP}, "alibi": {"alibi": True},
                  "dropout": {"dropout_p": DROPOUT}, "sinks": {"sinks": True}, "tnd": {"tnd": True},
                  "gqa": {"heads_kv": self.heads // GQA_GROUP}}
        if name not in values:
            raise ValueError(f"flash_cann: a feature is one of {FEATURES} (got {name!r})")
        return dataclasses.replace(self, **values[name])

    @property
    def features(self) -> list[str]:
        on = {"mask": self.mask, "window": self.window != (-1, -1), "softcap": self.softcap > 0,
              "alibi": self.alibi, "dropout": self.dropout_p > 0, "sinks": self.sinks,
              "tnd": self.tnd, "gqa": self.heads_kv != self.heads}
        return [name for name in FEATURES if on[name]]


def _plan_features(p: Problem, tokens=(0, 0)):
    return planner.variant(window=p.window, softcap=p.softcap, dropout_p=p.dropout_p,
                           alibi="head" if p.alibi else None, sinks=p.sinks, tokens=tokens)


def modelled_seconds(p: Problem, soc: str = "Ascend910B2", cores: int = 0) -> float | None:
    """The schedule model's prediction for ``p``'s plan (None where it makes none)."""
    layout = "TND" if p.tnd else "BNSD"
    tokens = (p.batch * p.seqlen_q, p.batch * p.seqlen_k) if layout == "TND" else (0, 0)
    if p.kernel == "decode":
        plan = planner.decode_plan(soc, p.batch, p.heads, p.seqlen_q, p.head_dim, heads_kv=p.heads_kv,
                                   keys=p.seqlen_k, dtype=p.dtype, causal=p.causal, aic_cores=cores,
                                   features=_plan_features(p))
    else:
        options = dict(heads_kv=p.heads_kv, seqlen_k=p.seqlen_k, dtype=p.dtype, layout=layout,
                       causal=p.causal, has_mask=p.mask, aic_cores=cores,
                       features=_plan_features(p, tokens))
        plan = (planner.plan(soc, p.batch, p.heads, p.seqlen_q, p.head_dim, **options)
                if p.kernel == "forward" else
                planner.grad_plan(soc, p.batch, p.heads, p.seqlen_q, p.head_dim,
                                  deterministic=p.kernel == "backward-deterministic", **options))
    prediction = plan["prediction"]
    return None if prediction is None else prediction["seconds"]


def hbm_bytes(p: Problem) -> float:
    """The bytes of ``p``'s tensors once: what the kernel must move through HBM at least."""
    e = torch.finfo(getattr(torch, p.dtype)).bits // 8
    rows_q, rows_k = p.batch * p.heads * p.seqlen_q * p.head_dim, p.batch * p.heads_kv * p.seqlen_k * p.head_dim
    lse = 4 * p.batch * p.heads * p.seqlen_q
    if p.kernel == "decode":  # the query and output, the K and V cache
        return 2 * rows_q * e + 2 * rows_k * e
    if p.kernel == "forward":  # q, out; k, v; lse; the key mask
        return 2 * rows_q * e + 2 * rows_k * e + lse + (p.batch * p.seqlen_k if p.mask else 0)
    return 4 * rows_q * e + 4 * rows_k * e + lse  # q, out, dout, dq; k, v, dk, dv; lse


def stand_in(p: Problem, cores: int) -> tuple[Problem, int]:
    """The blockDim-scaled stand-in of ``p`` on ``cores`` AI cores: (problem, cores)."""
    if p.kernel == "decode":
        return p, cores  # the decode plan splits keys over cores too: traced as it is
    groups = p.batch * p.heads_kv  # GQA keeps whole kv groups
    g = math.gcd(groups, cores)
    if p.batch % g == 0:
        return dataclasses.replace(p, batch=p.batch // g), cores // g
    if p.heads % g == 0 and p.heads_kv % g == 0:
        return dataclasses.replace(p, heads=p.heads // g, heads_kv=p.heads_kv // g), cores // g
    return p, cores


def _inputs(p: Problem):
    """Zero inputs of ``p``'s shapes (a timing-only launch reads no value that steers it)."""
    dtype = getattr(torch, p.dtype)
    tnd = p.tnd
    if tnd:
        q = torch.zeros(p.batch * p.seqlen_q, p.heads, p.head_dim, dtype=dtype)
        k = torch.zeros(p.batch * p.seqlen_k, p.heads_kv, p.head_dim, dtype=dtype)
    else:
        q = torch.zeros(p.batch, p.heads, p.seqlen_q, p.head_dim, dtype=dtype)
        k = torch.zeros(p.batch, p.heads_kv, p.seqlen_k, p.head_dim, dtype=dtype)
    variant = Variant(
        window_left=p.window[0], window_right=p.window[1], softcap=p.softcap,
        alibi_slopes=torch.ones(p.batch, p.heads) if p.alibi else None, dropout_p=p.dropout_p,
        rng_state=torch.tensor([1, 0], dtype=torch.int64) if p.dropout_p > 0 else None,
        cu_seqlens_q=torch.arange(p.batch + 1, dtype=torch.int32) * p.seqlen_q if tnd else None,
        cu_seqlens_k=torch.arange(p.batch + 1, dtype=torch.int32) * p.seqlen_k if tnd else None,
        max_seqlen_q=p.seqlen_q if tnd else 0, max_seqlen_k=p.seqlen_k if tnd else 0,
        sinks=torch.zeros(p.heads) if p.sinks else None)
    mask = torch.ones(p.batch, p.seqlen_k, dtype=torch.bool) if p.mask else None
    return q, k, k.clone(), mask, variant, "TND" if tnd else "BNSD"


def _launch(p: Problem, cores: int, timing: Timing) -> None:
    q, k, v, mask, variant, layout = _inputs(p)
    scale = p.head_dim ** -0.5
    if p.kernel == "forward":
        launcher.forward(q, k, v, mask, scale=scale, causal=p.causal, layout=layout,
                         variant=variant, ai_cores=cores, timing=timing)
    elif p.kernel == "decode":
        query = torch.zeros(p.batch, p.seqlen_q, p.heads, p.head_dim, dtype=q.dtype)
        cache = torch.zeros(p.batch, p.seqlen_k, p.heads_kv, p.head_dim, dtype=q.dtype)
        launcher.kvcache_forward(query, cache, cache.clone(),
                                 torch.full((p.batch,), p.seqlen_k, dtype=torch.int32), None, None,
                                 scale=scale, causal=p.causal, variant=variant, ai_cores=cores,
                                 timing=timing)
    else:
        lse_shape = (p.heads, q.shape[0]) if layout == "TND" else (p.batch, p.heads, p.seqlen_q)
        launcher.backward(q, q, k, v, q, torch.zeros(lse_shape), mask, None, scale=scale,
                          causal=p.causal, layout=layout,
                          deterministic=p.kernel == "backward-deterministic", variant=variant,
                          ai_cores=cores, timing=timing)


def trace(p: Problem, soc: str = "Ascend910B2", cores: int = 0, *, scaled: bool = True,
          trace_core: int = -1, rates: str = "fitted") -> dict:
    """Time ``p`` on the twin (timing only, the cost table at ``rates``) and predict it
    with the model: a row with ``model_ms``, ``traced_ms``, ``binding_pipe``,
    ``traced_as`` and the twin's report."""
    platform = next(x for x in planner.platforms() if x["name"] == planner.soc_name(soc))
    total = cores or platform["aic_cores"]
    run, run_cores = stand_in(p, total) if scaled else (p, total)
    timing = Timing(soc=planner.soc_name(soc), trace_core=trace_core, timing_only=True,
                    share_cores=total, rates=rates)
    _launch(run, run_cores, timing)
    model = modelled_seconds(p, soc, cores)
    report = timing.report
    clock_hz = report["clock_ghz"] * 1e9
    floor_cycles = hbm_bytes(p) / (platform["hbm_gb_per_s"] * 1e9) * clock_hz
    hbm_bound = floor_cycles > report["makespan_cycles"]
    traced_ms = (report["launch_cycles"] + max(floor_cycles, report["makespan_cycles"])) / clock_hz * 1e3
    return {
        "kernel": p.kernel, "shape": [p.batch, p.heads, p.seqlen_q, p.seqlen_k, p.head_dim],
        "dtype": p.dtype, "causal": p.causal, "features": p.features,
        "model_ms": None if model is None else model * 1e3,
        "traced_ms": traced_ms, "binding_pipe": "HBM" if hbm_bound else report["binding_pipe"],
        "hbm_floor_ms": floor_cycles / clock_hz * 1e3,
        "traced_as": {"shape": [run.batch, run.heads, run.seqlen_q, run.seqlen_k, run.head_dim],
                      "cores": run_cores, "l2_share_cores": total},
        "label": LABELS[rates], "report": timing.report, "trace": timing.trace,
    }
