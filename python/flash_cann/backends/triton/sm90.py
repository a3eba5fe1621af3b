"""When the Hopper kernels (kernels/forward_sm90.py, kernels/backward_sm90.py) serve a
call, and their launch shapes.

They serve the plain path on sm90: fp16/bf16, head_dim 64 or 128, causal or not, GQA,
any BNSD view whose strides TMA can address, a positive scale; everything else --
features, packed sequences, KV caches, key padding masks, other GPUs and head dims --
takes kernels/forward.py and kernels/backward.py, as does every call with
FLASH_CANN_SM90=0 (for A/B timings). The Hopper backward adds dQ with TMA
reduce-adds (in a fixed order for deterministic calls); it leaves short backwards, where
its fixed costs lose to the FA2 kernels (measured), to kernels/backward.py. The lse
contract is the same, so either backward follows either forward.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch
import triton

from .descriptors import tma_compatible

# Tiles: CONSUMERS x 64 query rows (kernels/forward_sm90.CONSUMERS, which the kernel's
# warp_specialize call spells out), 128 keys a block; K/V ring depth by head_dim (the
# deepest ring that fits 227 KiB of shared memory: 3 x 2 x 32 KiB + Q at head_dim 128).
CONSUMERS = 2
BLOCK_M = 64
BLOCK_N = 128
STAGES = {64: 4, 128: 3}
HEAD_DIMS = tuple(STAGES)
# Long causal problems run one CTA per tile (the hardware scheduler balances their
# unequal tiles); measured on an H200 at 16k, bf16, d128: 601 TFLOP/s against 470
# persistent (NOTES.md, issue 28).
NON_PERSISTENT_CAUSAL_KEYS = 8192


# The backward: one CTA per key block of BACKWARD_BLOCK_N keys, query blocks of
# BACKWARD_BLOCK_M rows through a ring of BACKWARD_STAGES[head_dim] slots (at head_dim 128
# two slots fill shared memory beside K, V, dS and dQ; more bought nothing at 64), and
# BACKWARD_DQ_BUFFERS shared dQ tiles per warpgroup (one TMA reduce in flight while the
# next tile is written: 0.79x -> 0.85x cuDNN at 16k, head_dim 128, H200).
BACKWARD_BLOCK_M = 64
BACKWARD_BLOCK_N = 128
BACKWARD_STAGES = {64: 4, 128: 2}
BACKWARD_DQ_BUFFERS = 2
# Below this many keys the FA2 kernels' backward is faster (NOTES.md, issue 28).
BACKWARD_MIN_KEYS = 2048


def setting() -> str:
    """FLASH_CANN_SM90: ``auto`` (the Hopper forward wherever eligible) or ``0`` (never)."""
    value = os.environ.get("FLASH_CANN_SM90", "auto")
    if value not in ("auto", "0"):
        raise ValueError(f"FLASH_CANN_SM90 must be auto or 0 (got {value!r})")
    return value


@functools.lru_cache(maxsize=None)
def _gluon_available() -> bool:
    try:  # Triton with Gluon's Hopper API (3.5 on)
        importlib.import_module(".kernels.forward_sm90", __package__)
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _gluon_reduce_available() -> bool:
    try:  # and a Gluon builder with the TMA reduce-add the backward issues (3.6)
        importlib.import_module(".kernels.backward_sm90", __package__)
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _is_sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def _descriptor_strides(t: torch.Tensor) -> bool:
    """What the FA2 kernels' descriptors need (descriptors.tma_compatible), and a positive
    batch stride where there is more than one batch: this kernel's 4-D descriptors carry
    the batch stride, where the FA2 kernels fold it into a base address."""
    return tma_compatible(t) and (t.shape[0] == 1 or t.stride(0) > 0)


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *,
             plain: bool, packed: bool, key_padding_mask, scale: float) -> bool:
    """Whether the Hopper forward serves this call (BNSD views of q, k, v, out)."""
    return (plain and not packed and key_padding_mask is None and scale > 0
            and q.dtype in (torch.float16, torch.bfloat16) and q.shape[3] in HEAD_DIMS
            and setting() == "auto" and _is_sm90(q.device) and _gluon_available()
            and all(_descriptor_strides(t) for t in (q, k, v, out)))


def backward_eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                      *, plain: bool, packed: bool, key_padding_mask, scale: float) -> bool:
    """Whether the Hopper backward serves this call (BNSD views; it reads q, k, v and dO
    through descriptors and writes dK, dV with plain stores), deterministic or not."""
    return (k.shape[2] >= BACKWARD_MIN_KEYS and _gluon_reduce_available()
            and eligible(q, k, v, grad_out, plain=plain, packed=packed,
                         key_padding_mask=key_padding_mask, scale=scale))


def backward_grid(batch: int, heads_kv: int, seqlen_k: int,
                  deterministic: bool) -> tuple[int, int, int]:
    """One CTA per key block of a kv head and batch, key blocks fastest; deterministic,
    heads fastest. There key block n's adds wait for key block n - 1's
    (kernels/backward_sm90.py), so a wave of CTAs should hold a few key blocks of every
    head rather than one head's chain: 5.97 against 11.86 ms causal, 11.20 against
    12.03 ms not, at 1 x 16 x 16k x 128 bf16 (H200). Non-deterministic, the order made
    no difference beyond noise (10.52 / 10.96 ms key blocks / heads fastest)."""
    key_blocks = triton.cdiv(seqlen_k, BACKWARD_BLOCK_N)
    return (heads_kv, batch, key_blocks) if deterministic else (key_blocks, heads_kv, batch)


def persistent(causal: bool, seqlen_k: int) -> bool:
    return not (causal and seqlen_k >= NON_PERSISTENT_CAUSAL_KEYS)


def grid(tiles: int, multiprocessors: int, causal: bool, seqlen_k: int) -> tuple[int]:
    """One CTA per SM dealt the tiles in waves, or one CTA per tile."""
    return (min(tiles, multiprocessors) if persistent(causal, seqlen_k) else tiles,)


def tiles(batch: int, heads_q: int, seqlen_q: int) -> int:
    return batch * heads_q * triton.cdiv(seqlen_q, CONSUMERS * BLOCK_M)


def kernel():
    from .kernels.forward_sm90 import attn_fwd_sm90
    return attn_fwd_sm90


def backward_kernel():
    from .kernels.backward_sm90 import attn_bwd_sm90
    return attn_bwd_sm90
