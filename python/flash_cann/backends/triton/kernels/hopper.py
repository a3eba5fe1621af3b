"""What the Hopper (sm90) Gluon kernels share: their tensors' TMA descriptors and the
register layout of a warpgroup's wgmma results."""

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


@gluon.constexpr_function
def warpgroup_accumulator(columns):
    """The registers of one warpgroup's wgmma result with ``columns`` columns (its four
    warps down the rows, m64 n``columns`` k16 instructions): every consumer of both
    kernels is one warpgroup."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, columns, 16])
