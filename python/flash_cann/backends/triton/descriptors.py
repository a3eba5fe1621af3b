"""Which BNSD views the kernels' tensor descriptors (TMA on Hopper) can address."""

from __future__ import annotations

import torch


def tma_compatible(t: torch.Tensor) -> bool:
    """A BNSD view the FA2 kernels' (heads, seqlen, head_dim) descriptors can address: unit
    head_dim stride, 16-byte aligned base and strides, positive head and row strides
    (the batch stride only offsets the base, so it may be 0)."""
    b, h, s, _ = (stride * t.element_size() for stride in t.stride())
    return (t.data_ptr() % 16 == 0 and t.stride(3) == 1 and h > 0 and s > 0
            and b % 16 == 0 and h % 16 == 0 and s % 16 == 0)
