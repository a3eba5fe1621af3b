"""How close a backend must be to the float64 oracle: the one statement of tolerances,
and the one comparison every backend's tests (and the demo) call.

The rule (flash-attn's, also Liger's for NPU bf16): a result's max error against the
float64 oracle may be at most FACTOR times the error of the same materialising
attention computed in a same-precision baseline, plus a slack of RELATIVE_SLACK x
max |oracle| for the cases where the baseline happens to be (nearly) exact.

Each output is judged in the precision the contract gives it. ``out`` and the
gradients are stored in the input dtype: their baseline stores every intermediate in
that dtype, their slack is two ulps of it. ``softmax_lse`` is float32 by contract
(the accumulator dtype), computed from scores that every backend keeps in its
accumulator: its baseline is the materialising attention in the accumulator dtype
and its slack the accumulator's, so an lse rounded to the input dtype fails.

The fp32 slack is the largest: with a near one-hot softmax, autograd's softmax
gradient cancels exactly while FA2's dP - rowsum(dO * O) subtracts two numbers of size
|dO| |V| and keeps their rounding (~1e-6 of them), which can be several times larger
than the baseline's error on a small dq.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract.checks import accumulator_dtype

FACTOR = {"out": 2.0, "lse": 2.0, "grad": 3.0}
RELATIVE_SLACK = {torch.float64: 1e-12, torch.float32: 1e-5,
                  # two ulps: FA2's D = rowsum(dO * O) uses O as stored (rounded)
                  torch.float16: 2 * 2.0**-10, torch.bfloat16: 2 * 2.0**-7}
# What the gradients are taken of: "full" = sum(out * dO) + sum(lse * dLSE) with random
# dO and dLSE; "out_sum" = out.sum() (dO arrives expanded, no lse gradient); "none" =
# forward only, for backends without a backward pass.
BACKWARD_MODES = ("full", "out_sum", "none")


@dataclass(frozen=True)
class Comparison:
    name: str
    max_error: float
    bound: float
    baseline_error: float

    @property
    def ok(self) -> bool:
        return self.max_error <= self.bound

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return (f"{self.name:>12}: max |err| {self.max_error:.2e}  bound {self.bound:.2e}  "
                f"(same-precision baseline {self.baseline_error:.2e})  {verdict}")


def judged_dtype(kind: str, input_dtype: torch.dtype) -> torch.dtype:
    """The precision an output of ``kind`` is judged in: lse in the accumulator dtype
    (float32 by contract), everything else in the input dtype."""
    return accumulator_dtype(input_dtype) if kind == "lse" else input_dtype


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}")
    # -inf (rows that see no key) must match exactly; NaN never passes.
    if torch.isnan(a).any():
        return float("inf")
    same_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    if (torch.isinf(a) ^ torch.isinf(b)).any():
        return float("inf")
    diff = (a - b).abs().masked_fill(same_inf, 0.0)
    return diff.max().item() if diff.numel() else 0.0


def compare(name: str, kind: str, result: torch.Tensor, oracle: torch.Tensor,
            baseline: torch.Tensor, input_dtype: torch.dtype) -> Comparison:
    """Compare ``result`` with the float64 ``oracle``; ``baseline`` is the materialising
    result in ``judged_dtype(kind, input_dtype)``; ``kind`` is "out", "lse" or "grad"."""
    base = _max_error(baseline, oracle)
    finite = oracle[torch.isfinite(oracle)]
    magnitude = finite.abs().max().item() if finite.numel() else 0.0
    slack = RELATIVE_SLACK[judged_dtype(kind, input_dtype)]
    return Comparison(name, _max_error(result, oracle), FACTOR[kind] * base + slack * magnitude,
                      base)


def _gradients(attention_fn, q, k, v, grad_out, grad_lse, backward: str):
    """(out, lse, dq, dk, dv) of ``attention_fn(q, k, v) -> (out, lse)``; the loss is
    sum(out * grad_out) + sum(lse * grad_lse) over rows whose lse is finite, or out.sum()."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = attention_fn(q, k, v)
    if backward == "out_sum":
        loss = out.sum()
    else:
        loss = (out.double() * grad_out.double()).sum()
        loss = loss + (lse.masked_fill(torch.isinf(lse), 0.0).double()
                       * grad_lse.double()).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return out.detach(), lse.detach(), dq, dk, dv


def _materialising(key_padding_mask, scale, causal, layout, variant, dropout_mask,
                   compute_dtype):
    from ..contract import reference

    return lambda q_, k_, v_: reference.attention(
        q_, k_, v_, key_padding_mask, scale=scale, causal=causal, layout=layout,
        compute_dtype=compute_dtype, variant=variant, dropout_mask=dropout_mask)


def check_against_oracle(attention_fn, q, k, v, *, scale: float, causal: bool, layout: str,
                         key_padding_mask=None, generator=None, backward: str = "full",
                         variant=None, dropout_mask=None) -> list[Comparison]:
    """Run ``attention_fn(q, k, v) -> (out, softmax_lse)`` (forward, and backward as
    ``backward`` says: one of BACKWARD_MODES) and compare every result with the float64
    oracle, each judged in its own precision (see the module docstring). ``variant``
    and ``dropout_mask``: the features of the call, as reference.attention takes them
    (the mask: the one the backend used, e.g. from its returned S_dmask)."""
    from ..contract.variant import PLAIN

    if backward not in BACKWARD_MODES:
        raise ValueError(f"backward must be one of {BACKWARD_MODES} (got {backward!r})")
    args = (key_padding_mask, scale, causal, layout, variant or PLAIN, dropout_mask)
    oracle_fn = _materialising(*args, torch.float64)
    baseline_fn = _materialising(*args, q.dtype)
    with torch.no_grad():  # lse's baseline: the scores kept in the accumulator dtype
        lse_baseline = _materialising(*args, accumulator_dtype(q.dtype))(q, k, v)[1]
    lse_names = (("out", "out", 0), ("softmax_lse", "lse", 1))
    if backward == "none":
        with torch.no_grad():
            got = attention_fn(q, k, v)
            oracle = oracle_fn(q.double(), k.double(), v.double())
            baseline = (baseline_fn(q, k, v)[0], lse_baseline)
        return [compare(name, kind, got[i], oracle[i], baseline[i], q.dtype)
                for name, kind, i in lse_names]
    grad_out = torch.randn(q.shape, generator=generator, dtype=torch.float32).to(q)
    lse_shape = lse_baseline.shape
    grad_lse = torch.randn(lse_shape, generator=generator, dtype=torch.float32).to(q.device)
    got = _gradients(attention_fn, q, k, v, grad_out, grad_lse, backward)
    # float64 leaves, so that the oracle's gradients are not rounded to the input dtype.
    oracle = _gradients(oracle_fn, q.double(), k.double(), v.double(), grad_out, grad_lse,
                        backward)
    baseline = list(_gradients(baseline_fn, q, k, v, grad_out, grad_lse, backward))
    baseline[1] = lse_baseline
    names = (("out", "out"), ("softmax_lse", "lse"), ("dq", "grad"), ("dk", "grad"),
             ("dv", "grad"))
    return [compare(name, kind, g, o, b, q.dtype)
            for (name, kind), g, o, b in zip(names, got, oracle, baseline)]
