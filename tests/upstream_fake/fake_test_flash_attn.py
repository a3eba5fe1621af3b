"""A stand-in for an upstream test file (tests/test_run_upstream_suite.py runs it through
scripts/run_upstream_suite.py): it imports flash-attn as upstream files do, and has one
test of each outcome the runner counts. Not collected by flash_cann's own suite (its name
does not match test_*.py)."""

import pytest
import torch
from flash_attn import flash_attn_func
from flash_attn.flash_attn_interface import _get_block_size_n


def test_passes():
    q = torch.randn(1, 4, 2, 16)
    assert flash_attn_func(q, q, q, causal=True).shape == q.shape
    assert _get_block_size_n(q.device, 16, False, True) == 128


@pytest.mark.parametrize("blocks", [3, 17])
def test_fails_for_one_reason(blocks):
    raise RuntimeError(f"block_table holds {blocks} blocks, too few")


def test_fails_for_another():
    assert flash_attn_func(torch.randn(1, 4, 2, 16), *[torch.randn(1, 4, 2, 16)] * 2).sum() == 0.5


@pytest.mark.skip(reason="needs flash-attn's compiled CUDA module")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known difference")
def test_expected_failure():
    assert False


@pytest.fixture
def broken():
    raise ValueError("fixture could not start")


def test_errors_in_setup(broken):
    pass
