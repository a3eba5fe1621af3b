"""O(N) memory: the CPU backend never allocates a seqlen_q x seqlen_k score matrix.

The profiler reports every op's own allocations; the largest one, during forward and
backward, must stay below a single head's score matrix and grow linearly with seqlen.
(The peak-memory benchmark, benchmarks/cpu_memory.py, shows the same end to end.)"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import flash_cann
from flash_cann.contract import reference


def _largest_allocation(fn, seqlen):
    q, k, v = (torch.randn(1, 2, seqlen, 32, requires_grad=True) for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(q, k, v).sum().backward()
    return max(e.self_cpu_memory_usage for e in prof.events())


def _flash(q, k, v):
    return flash_cann.attention(q, k, v, causal=True)


def _materialising(q, k, v):
    return reference.attention(q, k, v, scale=0.1, causal=True, compute_dtype=q.dtype)[0]


def test_largest_allocation_is_linear_in_seqlen():
    small, large = _largest_allocation(_flash, 1024), _largest_allocation(_flash, 4096)
    score_matrix = 4096 * 4096 * 4  # one head, float32
    assert large < score_matrix / 16, (small, large)
    assert large <= 4.2 * small, f"4x the seqlen grew the largest allocation {large / small:.1f}x"


def test_the_check_sees_a_materialising_path():
    """The same measurement flags O(N^2) when it is there."""
    small, large = _largest_allocation(_materialising, 1024), _largest_allocation(_materialising,
                                                                                  4096)
    assert large >= 4096 * 4096 * 4 and large >= 12 * small
