"""The Ascend C forward kernel (op_kernel/) run on the CPU twin of the Ascend C API
(twin/): the twin's rule checks fire, and the kernel matches the float64 oracle
across dtypes, masks, GQA, head dims, tails and core counts.

What this verifies and what it cannot: docs/kernel.md ("What the twin verifies")."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import flash_cann
from flash_cann.backends import twin

from conftest import make_qkv
from oracle_checks import assert_all_ok, check
from native_build import built, run


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


def test_rule_checks_fire():
    """tests/twin/twin_rule_tests.cpp: each hardware rule, broken once, is caught."""
    result = run("twin_tests/twin_rule_tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "20 of 20 twin rule tests passed" in result.stdout


def _check(dtype, *, causal, masked, heads, head_dim, seqlens, layout, gen, batch=None,
           cores=None):
    assert_all_ok(check("cpu", dtype, causal=causal, masked=masked, heads=heads,
                        head_dim=head_dim, seqlens=seqlens, layout=layout, gen=gen,
                        batch=batch, backward="none",
                        attention=functools.partial(twin.forward, ai_cores=cores)))


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_matches_oracle(dtype, causal, masked, heads, gen):
    _check(dtype, causal=causal, masked=masked, heads=heads, head_dim=64, seqlens=(100, 150),
           layout="BSND", gen=gen)


@pytest.mark.parametrize("head_dim", [64, 128, 80, 17, 256])
def test_head_dims(head_dim, gen):
    """Including head dims that are not powers of two (80, and 17, padded to 32)."""
    _check(torch.float16, causal=True, masked=True, heads=(4, 2), head_dim=head_dim,
           seqlens=(70, 90), layout="BNSD", gen=gen, batch=1)


@pytest.mark.parametrize("seqlens", [(1, 1), (17, 17), (1000, 1000), (17, 1000), (1000, 17),
                                     (1, 1000)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_sequence_tails(seqlens, gen):
    _check(torch.bfloat16, causal=True, masked=True, heads=(4, 2), head_dim=64,
           seqlens=seqlens, layout="BNSD", gen=gen, batch=1)


@pytest.mark.parametrize("cores", [1, 3, 7, 24, 48])
def test_core_counts(cores, gen):
    """Splits over core counts that do and do not divide the work."""
    _check(torch.float16, causal=True, masked=False, heads=(5, 5), head_dim=64,
           seqlens=(333, 333), layout="BNSD", gen=gen, batch=3, cores=cores)


def test_fully_masked_rows_give_zero_and_minus_inf(gen):
    q, k, v = make_qkv(2, 2, 2, 40, 24, 32, torch.float16, "BNSD", generator=gen)
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[1] = False
    out, lse = twin.forward(q, k, v, mask, scale=0.2, causal=True, layout="BNSD")
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)
    assert torch.all(out[0, :, :16] == 0) and torch.all(lse[0, :, :16] == -math.inf)
    assert torch.isfinite(lse[0, :, 16:]).all() and not torch.isnan(out).any()


def test_reachable_through_the_op_contract(gen):
    q, k, v = make_qkv(1, 4, 2, 50, 60, 64, torch.bfloat16, "BSND", generator=gen)
    with flash_cann.use_backend("twin"):
        out, lse = flash_cann.attention(q, k, v, layout="BSND", causal=True, return_lse=True)
    ref_out, ref_lse = flash_cann.attention(q, k, v, layout="BSND", causal=True, return_lse=True)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    assert flash_cann.backend_for("cpu").name == "cpu"  # the selection ends with the block


def test_backward_is_refused_clearly(gen):
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 8, 8, 16, torch.float16,
                                                    generator=gen))
    with flash_cann.use_backend("twin"):
        out = flash_cann.attention(q, k, v)
        with pytest.raises(NotImplementedError, match="forward kernel only"):
            out.sum().backward()


def test_planner_refusal_is_reported(gen):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float16, generator=gen)
    with pytest.raises(twin.TwinViolation, match="planner refused: heads_q"):
        twin.forward(q, k[:, :1].expand(1, 3, 8, 16).contiguous(), v[:, :1].expand(1, 3, 8, 16)
                     .contiguous(), None, scale=0.1, causal=False, layout="BNSD")


def test_demo_shows_the_twin():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "flash_cann", "demo", "--backend", "twin"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "backend 'twin'" in result.stdout and "accuracy: PASS" in result.stdout
