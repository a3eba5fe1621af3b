"""How close a backend must be to the float64 oracle: the one statement of tolerances.

The rule (flash-attn's, also Liger's for NPU bf16): a result's max error against the
float64 oracle may be at most FACTOR times the error of the same materialising
attention computed in the input dtype (an honest same-precision baseline), plus a
slack of RELATIVE_SLACK x max |oracle| for the cases where the baseline happens to be
(nearly) exact. The fp32 slack is the largest: with a near one-hot softmax, autograd's
softmax gradient cancels exactly while FA2's dP - rowsum(dO * O) subtracts two numbers
of size |dO| |V| and keeps their rounding (~1e-6 of them), which can be several times
larger than the baseline's error on a small dq.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FACTOR = {"out": 2.0, "lse": 2.0, "grad": 3.0}
RELATIVE_SLACK = {torch.float64: 1e-12, torch.float32: 1e-5,
                  # two ulps: FA2's D = rowsum(dO * O) uses O as stored (rounded)
                  torch.float16: 2 * 2.0**-10, torch.bfloat16: 2 * 2.0**-7}


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
            baseline: torch.Tensor, dtype: torch.dtype) -> Comparison:
    """Compare ``result`` with the float64 ``oracle``; ``baseline`` is the same-precision
    materialising result; ``kind`` is "out", "lse" or "grad"; ``dtype`` the input dtype."""
    base = _max_error(baseline, oracle)
    finite = oracle[torch.isfinite(oracle)]
    magnitude = finite.abs().max().item() if finite.numel() else 0.0
    return Comparison(name, _max_error(result, oracle),
                      FACTOR[kind] * base + RELATIVE_SLACK[dtype] * magnitude, base)


def forward_backward(attention_fn, q, k, v, grad_out, grad_lse):
    """(out, lse, dq, dk, dv) of ``attention_fn(q, k, v) -> (out, lse)``, with the loss
    sum(out * grad_out) + sum(lse * grad_lse) over rows whose lse is finite."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = attention_fn(q, k, v)
    loss = (out.double() * grad_out.double()).sum()
    loss = loss + (lse.masked_fill(torch.isinf(lse), 0.0).double() * grad_lse.double()).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return out.detach(), lse.detach(), dq, dk, dv


def _materialising(key_padding_mask, scale, causal, layout, compute_dtype):
    from . import reference

    return lambda q_, k_, v_: reference.attention(
        q_, k_, v_, key_padding_mask, scale=scale, causal=causal, layout=layout,
        compute_dtype=compute_dtype)


def check_forward_against_oracle(attention_fn, q, k, v, *, scale: float, causal: bool,
                                 layout: str, key_padding_mask=None) -> list[Comparison]:
    """Compare the forward results (out, softmax_lse) of ``attention_fn`` with the float64
    oracle; for backends without a backward pass."""
    args = (key_padding_mask, scale, causal, layout)
    with torch.no_grad():
        got = attention_fn(q, k, v)
        oracle = _materialising(*args, torch.float64)(q.double(), k.double(), v.double())
        baseline = _materialising(*args, q.dtype)(q, k, v)
    return [compare(name, kind, g, o, b, q.dtype) for name, kind, g, o, b in
            zip(("out", "softmax_lse"), ("out", "lse"), got, oracle, baseline)]


def check_against_oracle(attention_fn, q, k, v, *, scale: float, causal: bool, layout: str,
                         key_padding_mask=None, generator=None) -> list[Comparison]:
    """Run ``attention_fn`` forward and backward and compare every result with the
    float64 oracle (tolerance from the same-precision materialising baseline)."""
    from . import layout as layouts

    grad_out = torch.randn(q.shape, generator=generator, dtype=torch.float32).to(q)
    lse_shape = layouts.sizes(q, layout)[:3]
    grad_lse = torch.randn(lse_shape, generator=generator, dtype=torch.float32).to(q.device)
    args = (key_padding_mask, scale, causal, layout)
    got = forward_backward(attention_fn, q, k, v, grad_out, grad_lse)
    # float64 leaves, so that the oracle's gradients are not rounded to the input dtype.
    oracle = forward_backward(_materialising(*args, torch.float64), q.double(), k.double(),
                              v.double(), grad_out, grad_lse)
    baseline = forward_backward(_materialising(*args, q.dtype), q, k, v, grad_out, grad_lse)
    names = (("out", "out"), ("softmax_lse", "lse"), ("dq", "grad"), ("dk", "grad"),
             ("dv", "grad"))
    return [compare(name, kind, g, o, b, q.dtype)
            for (name, kind), g, o, b in zip(names, got, oracle, baseline)]
