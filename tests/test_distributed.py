"""Context parallelism on several processes (flash_cann.distributed): gloo on the CPU at
2 and 4 ranks, float32, each case against one process running the whole sequence
(within 1e-5 of the tensor's scale), forward and backward; causal, full, windowed, GQA,
both shardings, both rotations, packed documents; deterministic runs bitwise equal (and
the ring equal to the all-gather); ring-flash-attn's and yunchang's own functions on
flash_cann (bfloat16, against the single-process error); torch's context_parallel around
flash_cann.attention and tiny HF models (fa_cann). A few cases run the triton backend's kernels in Triton's interpreter
(gloo, float16), and a few through the Ascend C kernels on the CPU twin. With >= 2 GPUs
the same cases run on NCCL (float16).

The cases live in distributed_workers.py; one group of processes per (backend, world),
forked from one preloaded forkserver, runs them all, and each test here reports its own
case."""

from __future__ import annotations

import importlib.util
import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import distributed_workers
import native_build

CASES = {
    "causal_zigzag": ("dense", dict(causal=True)),
    "causal_contiguous_p2p": ("dense", dict(causal=True, sharding="contiguous", rotate="p2p")),
    "causal_zigzag_allgather_bnsd": ("dense", dict(causal=True, rotate="allgather",
                                                   layout="BNSD")),
    "full_p2p_batch2": ("dense", dict(causal=False, rotate="p2p", batch=2)),
    "gqa_causal_p2p": ("dense", dict(causal=True, heads=(4, 1), rotate="p2p")),
    "window_causal_contiguous": ("dense", dict(causal=True, window=(5, -1),
                                               sharding="contiguous")),
    "window_two_sided_zigzag": ("dense", dict(causal=False, window=(6, 3), rotate="allgather")),
    "softcap_causal": ("dense", dict(causal=True, softcap=5.0, rotate="p2p")),
    "varlen_causal_gqa": ("varlen", dict(causal=True, heads=(4, 2))),
    "varlen_full": ("varlen", dict(causal=False)),
    "varlen_causal_window": ("varlen", dict(causal=True, window=(6, 0))),
    "ring_flash_attn_ring": ("ring_flash_attn", dict(function="ring", causal=True)),
    "ring_flash_attn_zigzag": ("ring_flash_attn", dict(function="zigzag_ring", causal=True)),
    "ring_flash_attn_ring_full": ("ring_flash_attn", dict(function="ring", causal=False)),
    "ring_flash_attn_llama3": ("ring_flash_attn_llama3", dict(causal=True)),
    "yunchang_ulysses_x_ring": ("yunchang", dict(ring_impl="basic", ulysses=2, causal=True)),
    "yunchang_zigzag_ring": ("yunchang", dict(ring_impl="zigzag", ulysses=1, causal=True)),
    "torch_context_parallel_allgather": ("torch_context_parallel",
                                         dict(rotate="allgather", causal=True)),
    "torch_context_parallel_alltoall_bsnd_gqa": (
        "torch_context_parallel", dict(rotate="alltoall", causal=True, layout="BSND",
                                       heads=(4, 2))),
    "torch_context_parallel_full": ("torch_context_parallel",
                                    dict(rotate="allgather", causal=False)),
    "torch_context_parallel_hf_llama": ("torch_context_parallel_hf", dict(rotate="allgather")),
    "torch_context_parallel_hf_mistral_window": ("torch_context_parallel_hf",
                                                 dict(rotate="alltoall", family="mistral")),
    "bitwise_causal_gqa": ("bitwise", dict(causal=True)),
    "bitwise_window": ("bitwise", dict(causal=False, window=(7, 2))),
}

# Cases that need a group size: yunchang's hybrid with a ring of 1 rank sends to itself in
# its ring backward, which gloo cannot (a 2 x 2 Ulysses x ring group runs it at 4 ranks).
ONLY_AT = {"yunchang_ulysses_x_ring": 4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The triton backend's kernels in Triton's interpreter (float16; seconds per case, so two:
# causal zigzag with GQA and the ring, a causal window over contiguous shards).
TRITON_CASES = ("gqa_causal_p2p", "window_causal_contiguous")
# The Ascend C kernels on the CPU twin (about a second per launch): zigzag causal GQA over
# the ring, a causal window over contiguous shards, bitwise repeats (deterministic dQ).
TWIN_CASES = ("gqa_causal_p2p", "window_causal_contiguous", "bitwise_causal_gqa")


NCCL_GPUS = 2
# Without the GPUs of the NCCL group, the forkserver (and so every rank) runs Triton in
# its interpreter: TRITON_INTERPRET=1 must be set before triton is imported, and a
# forkserver that imported it once saves each interpreter rank ~10 s of imports. The
# gloo groups use the cpu backend, which never touches Triton.
INTERPRET = torch.cuda.device_count() < NCCL_GPUS


def _forkserver():
    """Start (once) the forkserver that every group forks from: it imported torch,
    torch._dynamo (the op's first dispatch imports it: seconds per process), flash_cann,
    transformers' Llama and torch's context_parallel, so the ranks do not (3 groups:
    ~90 s -> ~30 s on 2 cores)."""
    from multiprocessing import forkserver
    mp.get_context("forkserver").set_forkserver_preload(
        ["torch._dynamo", "distributed_workers", "transformers.models.llama.modeling_llama",
         "transformers.models.mistral.modeling_mistral", "torch.distributed.tensor.experimental"])
    saved = os.environ.get("TRITON_INTERPRET")
    if INTERPRET:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _cases(backend: str, world: int) -> list[str]:
    only = {"gloo-triton": TRITON_CASES, "gloo-twin": TWIN_CASES}.get(backend)
    return [name for name in CASES if ONLY_AT.get(name, world) == world
            and (only is None or name in only)]


def _launch(backend: str, world: int, tmp_path_factory):
    """Runs every case of the group on ``world`` processes, forked from _forkserver()."""
    out_dir = tmp_path_factory.mktemp(f"{backend}{world}")
    cases = [(name, *CASES[name]) for name in _cases(backend, world)]
    if backend == "gloo-twin":  # build once here (incremental), not in two ranks at once
        from flash_cann.ascend import native
        native.build()
    _forkserver()
    mp.start_processes(distributed_workers.run_group, nprocs=world, join=True,
                       args=(world, _free_port(), backend, cases, str(out_dir)),
                       start_method="forkserver")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


_NO_TRITON = importlib.util.find_spec("triton") is None
GROUPS = {  # (backend, world): why it is skipped here, or None
    ("gloo", 2): None,
    ("gloo", 4): None,
    ("gloo-triton", 2): ("triton is not installed" if _NO_TRITON else
                         None if INTERPRET else "GPUs run the real kernels (nccl2)"),
    ("gloo-twin", 2): (f"the twin needs {', '.join(native_build.missing())}"
                       if native_build.missing() else None),
    ("nccl", NCCL_GPUS): f"NCCL needs {NCCL_GPUS} GPUs" if INTERPRET else None,
}
PARAMS = [pytest.param(group, case, id=f"{group[0]}{group[1]}-{case}",
                       marks=[pytest.mark.skip(reason=GROUPS[group])] if GROUPS[group] else [])
          for group in GROUPS for case in _cases(*group)]

# The third-party libraries come with the test extra; without them their cases skip
# (under CI=true they fail: the extra is part of the suite).
THIRD_PARTY = {"ring_flash_attn": "ring-flash-attn", "yunchang": "yunchang"}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Each group's results, launched on first use (one launch per group)."""
    results = {}

    def get(group):
        if group not in results:
            results[group] = _launch(*group, tmp_path_factory)
        return results[group]
    return get


@pytest.mark.parametrize("group, case", PARAMS)
def test_case(launched, group, case):
    needs = next((m for m in THIRD_PARTY if case.startswith(m)), None)
    if needs and importlib.util.find_spec(needs) is None:
        message = f"{THIRD_PARTY[needs]} (the test extra) is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    results = launched(group)
    failures = {rank: result[case] for rank, result in enumerate(results)
                if result[case] is not None}
    assert not failures, "\n".join(f"rank {r}:\n{tb}" for r, tb in failures.items())
