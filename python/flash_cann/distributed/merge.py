"""Partial attention results merged by their log-sum-exp.

Attention of one query row to the union of disjoint key sets is the lse-weighted mean of
its attention to each set: with (o_a, l_a) and (o_b, l_b) the outputs and log-sum-exps
of two sets, l = logaddexp(l_a, l_b) and o = e^(l_a - l) o_a + e^(l_b - l) o_b. The
op's lse output is all a rank needs to assemble its rows from the blocks it computed.
Accumulated in float32; a row that has seen no key yet has lse -inf and output 0, and
merging two such rows gives the same, never NaN.
"""

from __future__ import annotations

import torch

# The sequence dimension of out (and of query) per layout; lse is (batch, heads, seqlen).
SEQ_DIM = {"BSND": 1, "BNSD": 2}


def lse_as_rows(lse: torch.Tensor, layout: str) -> torch.Tensor:
    """lse (batch, heads, seqlen) viewed to broadcast against out in ``layout``."""
    return (lse.transpose(1, 2) if layout == "BSND" else lse).unsqueeze(-1)


class Partial:
    """The running (out, lse) of one rank's query rows, float32."""

    def __init__(self, query: torch.Tensor, layout: str):
        self.layout = layout
        self.seq_dim = SEQ_DIM[layout]
        self.out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
        batch, seqlen = query.shape[0], query.shape[self.seq_dim]
        heads = query.shape[2] if layout == "BSND" else query.shape[1]
        self.lse = torch.full((batch, heads, seqlen), -torch.inf, dtype=torch.float32,
                              device=query.device)

    def add(self, start: int, end: int, out: torch.Tensor, lse: torch.Tensor) -> None:
        """Merge one block's result for query rows start .. end - 1."""
        acc_out = self.out.narrow(self.seq_dim, start, end - start)
        acc_lse = self.lse.narrow(2, start, end - start)
        merged = torch.logaddexp(acc_lse, lse)
        # exp(-inf - finite) is 0; a row with nothing yet on either side keeps -inf
        reference = torch.where(torch.isneginf(merged), 0.0, merged)
        old = lse_as_rows(torch.exp(acc_lse - reference), self.layout)
        new = lse_as_rows(torch.exp(lse - reference), self.layout)
        acc_out.mul_(old).add_(out.float() * new)
        acc_lse.copy_(merged)
