"""What the Hopper (sm90) Gluon kernels share: their tensors' TMA descriptors."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma


@gluon.jit
def bnsd_descriptor(base, batch, heads, seqlen, stride_b, stride_h, stride_s,
                    ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, layout: gl.constexpr):
    """A device-side descriptor of a (batch, heads, seqlen, head_dim) view whose head_dim
    is unit-stride, in blocks of ROWS rows of one (batch, head): TMA zero-fills rows past
    seqlen on loads and drops them on stores, so no block reaches another sequence."""
    return tma.make_tensor_descriptor(base, [batch, heads, seqlen, HEAD_DIM],
                                      [stride_b, stride_h, stride_s, 1],
                                      [1, 1, ROWS, HEAD_DIM], layout)
