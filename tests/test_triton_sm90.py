"""The Hopper kernels' host side on the CPU: which calls they serve (sm90.eligible,
sm90.backward_eligible), their grids, their setting, and the Gluon kernels themselves
compiled for sm90 (Triton's compiler and the wheel's ptxas, no GPU). On a GPU,
tests/test_triton.py runs them (test_sm90_*)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import pytest
import torch
import triton

from flash_cann.backends.triton import sm90


def bnsd(batch=2, heads=4, seqlen=256, head_dim=128, dtype=torch.bfloat16):
    return torch.randn(batch, seqlen, heads, head_dim, dtype=dtype).transpose(1, 2)


@pytest.fixture
def on_sm90(monkeypatch):
    """Pretend the tensors live on an sm90 GPU with Gluon available."""
    monkeypatch.setattr(sm90, "_is_sm90", lambda device: True)
    monkeypatch.setattr(sm90, "_gluon_available", lambda: True)
    monkeypatch.setattr(sm90, "_gluon_reduce_available", lambda: True)
    monkeypatch.delenv("FLASH_CANN_SM90", raising=False)


def serves(q, k=None, v=None, *, plain=True, packed=False, mask=None, scale=0.1, out=None):
    k = q if k is None else k
    v = k if v is None else v
    out = torch.empty_like(q) if out is None else out
    return sm90.eligible(q, k, v, out, plain=plain, packed=packed,
                         key_padding_mask=mask, scale=scale)


def test_serves_plain_fp16_bf16_at_head_dims_64_and_128(on_sm90):
    for dtype in (torch.float16, torch.bfloat16):
        for head_dim in (64, 128):
            q = bnsd(head_dim=head_dim, dtype=dtype)
            assert serves(q, bnsd(heads=2, seqlen=100, head_dim=head_dim, dtype=dtype))
    contiguous_bnsd = torch.randn(2, 4, 256, 128, dtype=torch.bfloat16)
    assert serves(contiguous_bnsd)
    one_sequence = torch.randn(1, 256, 4, 128, dtype=torch.bfloat16).transpose(1, 2)
    assert serves(one_sequence.expand(1, 4, 256, 128))


@pytest.mark.parametrize("case", ["feature", "packed", "mask", "scale", "fp32", "head_dim",
                                  "unaligned_row", "strided_dim", "expanded_heads",
                                  "expanded_batch", "unaligned_out", "unaligned_base",
                                  "setting"])
def test_refuses_what_it_does_not_serve(on_sm90, monkeypatch, case):
    q = bnsd()
    kwargs = {}
    if case == "feature":
        kwargs["plain"] = False
    elif case == "packed":
        kwargs["packed"] = True
    elif case == "mask":
        kwargs["mask"] = torch.ones(2, 256, dtype=torch.bool)
    elif case == "scale":
        kwargs["scale"] = -0.1
    elif case == "fp32":
        q = bnsd(dtype=torch.float32)
    elif case == "head_dim":
        q = bnsd(head_dim=96)
    elif case == "unaligned_row":  # 4 heads x 68 dims: rows 544 bytes apart, heads 136
        q = torch.randn(2, 256, 4, 68, dtype=torch.bfloat16)[..., :64].transpose(1, 2)
    elif case == "strided_dim":
        q = torch.randn(2, 4, 256, 128, 2, dtype=torch.bfloat16)[..., 0]
    elif case == "expanded_heads":  # a head stride of 0 (MQA through expand)
        q = torch.randn(2, 256, 1, 128, dtype=torch.bfloat16).expand(2, 256, 4, 128).transpose(1, 2)
    elif case == "expanded_batch":  # a batch stride of 0: the 4-D descriptor carries it
        q = torch.randn(1, 256, 4, 128, dtype=torch.bfloat16).expand(2, 256, 4, 128).transpose(1, 2)
    elif case == "unaligned_out":  # q, k, v fine; the output written through TMA is not
        kwargs["out"] = torch.empty(2, 256, 4, 68, dtype=torch.bfloat16)[..., :64].transpose(1, 2)
        q = bnsd(head_dim=64)
    elif case == "unaligned_base":  # strides fine, the data 2 bytes past a 16-byte boundary
        flat = torch.randn(2 * 256 * 4 * 128 + 1, dtype=torch.bfloat16)[1:]
        q = flat.view(2, 256, 4, 128).transpose(1, 2)
    elif case == "setting":
        monkeypatch.setenv("FLASH_CANN_SM90", "0")
    assert not serves(q, **kwargs)


def serves_backward(q, k=None, **kwargs):
    k = q if k is None else k
    return sm90.backward_eligible(q, k, k, torch.empty_like(q),
                                  plain=kwargs.get("plain", True),
                                  packed=kwargs.get("packed", False),
                                  key_padding_mask=kwargs.get("mask"),
                                  scale=kwargs.get("scale", 0.1))


def test_backward_serves_long_plain_calls(on_sm90):
    keys = sm90.BACKWARD_MIN_KEYS
    q = bnsd(seqlen=100)
    assert serves_backward(q, bnsd(heads=2, seqlen=keys))
    assert not serves_backward(q, bnsd(heads=2, seqlen=keys - 1))  # the FA2 kernels win
    for refused in ({"plain": False}, {"packed": True}, {"scale": -0.1},
                    {"mask": torch.ones(2, keys, dtype=torch.bool)}):
        assert not serves_backward(q, bnsd(heads=2, seqlen=keys), **refused)


def test_backward_grid_and_kernel_agree():
    from flash_cann.backends.triton.kernels import backward_sm90
    assert sm90.BACKWARD_BLOCK_N == backward_sm90.CONSUMERS.value * backward_sm90.KEYS.value
    assert sm90.backward_grid(batch=2, heads_kv=4, seqlen_k=1000, deterministic=False) == (8, 4, 2)
    assert sm90.backward_grid(batch=2, heads_kv=4, seqlen_k=1000, deterministic=True) == (4, 2, 8)


def test_refuses_cpu_tensors_and_other_gpus():
    assert not serves(bnsd())  # CPU tensors: the interpreter's kernels


def test_setting_is_named_when_bad(monkeypatch):
    monkeypatch.setenv("FLASH_CANN_SM90", "yes")
    with pytest.raises(ValueError, match="FLASH_CANN_SM90 must be auto or 0"):
        sm90.setting()


def test_host_and_kernel_agree_on_the_consumers():
    from flash_cann.backends.triton.kernels import forward_sm90
    assert sm90.CONSUMERS == forward_sm90.CONSUMERS.value


def test_grid_is_persistent_except_long_causal():
    tiles = sm90.tiles(batch=2, heads_q=16, seqlen_q=1000)
    assert tiles == 2 * 16 * 8
    assert sm90.grid(tiles, 132, causal=False, seqlen_k=16384) == (132,)
    assert sm90.grid(tiles, 132, causal=True, seqlen_k=4096) == (132,)
    assert sm90.grid(tiles, 132, causal=True, seqlen_k=8192) == (tiles,)
    assert sm90.grid(10, 132, causal=False, seqlen_k=1024) == (10,)


def compile_for_sm90(kernel, signature, constexprs) -> tuple[int, str, str]:
    """(shared bytes, PTX, ptxas -v's report) of a Gluon kernel built for sm90."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    source = GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4})
    ptx = compiled.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        report = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", path, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
    return compiled.metadata.shared, ptx, report


def spilled_bytes(report: str) -> int:
    match = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return int(match[1]) + int(match[2])


@pytest.mark.parametrize("head_dim,causal,dtype", [(128, True, "bf16"), (64, False, "fp16")])
def test_kernel_compiles_for_sm90_without_spills(head_dim, causal, dtype):
    """The Gluon forward through Triton's sm90 pipeline to PTX, then the wheel's ptxas:
    no spill stores or loads, and shared memory within the 227 KiB an H100 CTA gets."""
    pointer = f"*{dtype}"
    signature = {"Q": pointer, "K": pointer, "V": pointer, "Out": pointer, "Lse": "*fp32"}
    for name in ("stride_qb", "stride_qh", "stride_qs", "stride_kb", "stride_kh", "stride_ks",
                 "stride_vb", "stride_vh", "stride_vs", "stride_ob", "stride_oh", "stride_os",
                 "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k"):
        signature[name] = "i32"
    signature["qk_scale"] = "fp32"
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": sm90.BLOCK_M, "BLOCK_N": sm90.BLOCK_N,
                  "STAGES": sm90.STAGES[head_dim], "CAUSAL": causal}
    shared, ptx, report = compile_for_sm90(sm90.kernel(), signature, constexprs)
    assert shared <= 227 * 1024
    assert "wgmma.mma_async" in ptx
    assert spilled_bytes(report) == 0, report


# ptxas -v of the backward's consumers at head_dim 128 (dK, dV, Sᵀ, dPᵀ and dQ live
# at once: ~240 registers), spill stores + loads: none non-causal, 16 bytes causal (the
# diagonal's mask), deterministic or not; none at 64. Spills cost: 240 bytes a thread
# were 2.6 GB of local-memory traffic at 4k.
BACKWARD_SPILL_BOUND = {(128, False): 0, (128, True): 16, (64, False): 0, (64, True): 0}


@pytest.mark.parametrize("head_dim,causal,dtype,deterministic",
                         [(128, True, "bf16", False), (128, False, "fp16", False),
                          (64, True, "fp16", False), (128, True, "bf16", True),
                          (64, False, "fp16", True)])
def test_backward_compiles_for_sm90(head_dim, causal, dtype, deterministic):
    """The Gluon backward for sm90: within an H100 CTA's 227 KiB of shared memory, its
    products on wgmma, dQ through TMA reduce-adds, and its spills within the bound
    measured when it was written (a change that spills more shows here). Deterministic:
    each add waits for its turn (an acquire poll) and passes it on once written (a full
    bulk wait, not tma.store_wait's read-only one, then a release increment)."""
    pointer = f"*{dtype}"
    signature = {name: pointer for name in ("Q", "K", "V", "DOut", "DK", "DV")}
    signature.update({name: "*fp32" for name in ("Lse", "Delta", "DQAccum")})
    signature["DQTurns"] = "*i32" if deterministic else "constexpr"
    for name in ("stride_qb", "stride_qh", "stride_qs", "stride_kb", "stride_kh", "stride_ks",
                 "stride_vb", "stride_vh", "stride_vs", "stride_dob", "stride_doh",
                 "stride_dos", "stride_dkb", "stride_dkh", "stride_dks", "stride_dvb",
                 "stride_dvh", "stride_dvs", "batch", "heads_q", "heads_kv", "seqlen_q",
                 "seqlen_k"):
        signature[name] = "i32"
    signature.update(scale="fp32", qk_scale="fp32")
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": sm90.BACKWARD_BLOCK_M,
                  "STAGES": sm90.BACKWARD_STAGES[head_dim], "CAUSAL": causal,
                  "DQ_BUFFERS": sm90.BACKWARD_DQ_BUFFERS, "DETERMINISTIC": deterministic,
                  **({} if deterministic else {"DQTurns": None})}
    shared, ptx, report = compile_for_sm90(sm90.backward_kernel(), signature, constexprs)
    assert shared <= 227 * 1024
    assert "wgmma.mma_async" in ptx
    assert "cp.reduce.async.bulk.tensor" in ptx and ".add" in ptx
    ordered = ("ld.acquire.gpu.global.b32", "cp.async.bulk.wait_group 2;",
               "cp.async.bulk.wait_group 0;", "atom.global.gpu.release.add")
    assert [op in ptx for op in ordered] == [deterministic] * len(ordered)
    assert spilled_bytes(report) <= BACKWARD_SPILL_BOUND[head_dim, causal], report


def test_backward_host_binds_every_kernel_argument(on_sm90, monkeypatch):
    """cuda's Hopper branch on CPU tensors, its launches captured instead of run: the
    preprocess, the Hopper kernel and the dQ conversion, each binding exactly its
    kernel's parameters, with an fp32 dQ buffer of (batch, heads_q, seqlen_q, head_dim)
    zeroed for the reduce-adds, and int32 turn counters, zeroed, one per query block,
    where the call is deterministic (None where not)."""
    from flash_cann.backends.triton import cuda, kernels

    launched = []
    monkeypatch.setattr(cuda, "_launch", lambda launcher, grid, record, *args, **kwargs:
                        launched.append((launcher, args, kwargs)))
    q, k, v, out, grad_out = (torch.randn(1, sm90.BACKWARD_MIN_KEYS, 2, 64,
                                          dtype=torch.bfloat16) for _ in range(5))
    lse = torch.zeros(1, 2, sm90.BACKWARD_MIN_KEYS)

    def run(deterministic):
        launched.clear()
        cuda.backward(grad_out, q, k, v, out, lse, None, None, scale=0.125, causal=True,
                      layout="BSND", deterministic=deterministic)
        return [launcher for launcher, _, _ in launched]

    for deterministic in (False, True):
        assert run(deterministic) == [kernels.attn_bwd_preprocess, sm90.backward_kernel(),
                                      kernels.attn_bwd_dq_convert]
        for launcher, args, kwargs in launched[1:]:
            options = {"num_warps"}
            launcher.signature.bind(*args, **{n: a for n, a in kwargs.items()
                                              if n not in options})
        dq_accum, dq_turns = launched[1][1][6:8]
        assert dq_accum.dtype == torch.float32
        assert dq_accum.shape == (1, 2, sm90.BACKWARD_MIN_KEYS, 64)
        assert not dq_accum.any() and launched[2][1][0] is dq_accum
        assert launched[1][2]["DETERMINISTIC"] is deterministic
        if deterministic:
            blocks = sm90.BACKWARD_MIN_KEYS // sm90.BACKWARD_BLOCK_M
            assert dq_turns.dtype == torch.int32 and dq_turns.shape == (1, 2, blocks)
            assert not dq_turns.any()
        else:
            assert dq_turns is None
