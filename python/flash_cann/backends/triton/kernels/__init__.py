"""The Triton backend's device code: FlashAttention-2 forward and backward, for
NVIDIA GPUs (upstream Triton) and Ascend NPUs (triton-ascend).

By family: ``forward.py``, ``decode.py`` (KV cache, GQA packed, split-KV), ``backward.py``, with
the tile helpers they share in ``tiles.py`` and the features' score helpers in
``scores.py``; on sm90 the plain path's Gluon kernels, ``forward_sm90.py`` and
``backward_sm90.py`` (their own conventions in their docstrings). ``cuda.py`` (CUDA) and
``npu.py`` (NPU) pick the tiles and launch them.
The source stays within what both compilers take (triton-ascend 3.2 has no tuple
arguments, so strides travel as scalars). Conventions:

* q, k, v, out and their gradients travel with their (batch, head, seqlen, head_dim)
  strides as four scalars, so BNSD, BSND and strided views need no copies. The fp32
  (batch, heads_q, seqlen_q) vectors (lse, D, dLSE) are contiguous. A tile is
  BLOCK_ROWS x BLOCK_D with BLOCK_D = head_dim rounded up to a power of two >= 16;
  padding columns load as 0 and are never stored.
* A "view" is a run of consecutive heads of one batch: with USE_TMA a tensor
  descriptor (TMA on Hopper; Triton lowers it to plain loads elsewhere) whose bounds
  zero-fill tails on load and clip them on store, else a base pointer with masked
  loads. The host picks USE_TMA only where the strides allow it.
* BLOCK_M counts query rows and BLOCK_N key rows, in every kernel.
* A program computes one output tile (a query or key block of one head), indexed by
  its grid position (CUDA: one program per tile) or, with PERSISTENT, by a loop over
  the tiles ``program_id, program_id + num_programs, ...`` (Ascend: one program per AI
  core). The tile's work is the same ``_*_tile`` function either way.
* Scores live in log2 units: qk_scale = scale * log2(e), so exp(scale * s - lse)
  = exp2(qk_scale * s - lse * log2(e)) and the hot loops use exp2.
* Causal is bottom-right aligned: query i sees key j iff j <= i + diagonal,
  diagonal = seqlen_k - seqlen_q. Each kernel splits its loop into blocks that every
  row sees whole (no mask) and blocks on the diagonal or the key tail (masked).
* A row that sees no key keeps m = -inf: its output is 0, its lse -inf, and the
  backward turns that lse into +inf so the row's recomputed P is exactly 0.
"""

from .backward import attn_bwd_dkdv, attn_bwd_dq, attn_bwd_dq_convert, attn_bwd_preprocess
from .decode import attn_decode, attn_decode_combine
from .forward import attn_fwd

__all__ = ["attn_fwd", "attn_decode", "attn_decode_combine", "attn_bwd_preprocess",
           "attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_dq_convert"]
