"""Mutations of the backward kernel's synchronisation: every explicit sync call site of the
backward's files that a run executes -- PipeBarrier, SetFlag/WaitFlag, CrossCoreSetFlag/
WaitFlag, SyncAll -- has its happens-before edge switched off in turn inside the twin (no
kernel edit, no rebuild), and the race detector must then stop the kernel with a race or a
deadlock. Queue hand-offs are left to the queue rules (one hand-off often orders another's
pipes too). Exceptions would be listed in IMPLIED with their reason, and asserted to stay
uncaught, so the list cannot go stale; there are none."""

from __future__ import annotations

import pytest
import torch

from flash_cann.ascend import native
from flash_cann.backends.cpu import attention as cpu
from flash_cann.backends.twin import launcher as twin
from flash_cann.contract.variant import Variant

from conftest import make_qkv, random_key_padding_mask
from native_build import built

BACKWARD_FILES = ("flash_attention_grad_cube.h", "flash_attention_grad_vector.h",
                  "flash_attention_vector_ops.h", "flash_attention_fractal.h",
                  "flash_attention_features.h", "flash_attention_philox.h")
EXPLICIT = {"PipeBarrier", "SetFlag", "WaitFlag", "CrossCoreSetFlag", "CrossCoreWaitFlag",
            "SyncAll"}
# Sites whose edge another edge always implies; kept because they protect non-queue buffers.
# None since issue 25: the accumulators' M -> FIX flag (WriteAccumulators) was implied by
# the dQ product's queue hand-off while every step had one; the deterministic key pass
# has none (its dQ comes from the query pass), and there the flag is the only order.
IMPLIED: dict[str, str] = {}


def _problems():
    """Small shapes that, together, take every path: key mask + causal + deterministic on 2
    cores; causal without a mask and head_dim 128 (row sums over two column groups); one
    core whose units are single steps (the dK/dV accumulators reused back to back); the
    features: window + ALiBi + dropout + sinks with causal and a mask, and a window (hiding key
    blocks from every query) with softcap alone, and with ALiBi alone, where the band's mask
    reads the scores straight after the feature wrote them; last, the fp16-score kernel
    (causal, key mask, deterministic, 2 cores), for the sites only it runs."""
    g = torch.Generator().manual_seed(11)
    problems = []
    for b, hq, hk, sq, sk, d, causal, masked, det, cores, features in [
            (1, 2, 1, 130, 150, 32, True, True, True, 2, {}),
            (1, 2, 1, 70, 90, 128, True, False, False, 1, {}),
            (1, 1, 1, 100, 300, 32, False, False, False, 1, {}),
            (2, 2, 1, 80, 100, 32, True, True, True, 2,
             dict(window_left=30, alibi_slopes=torch.tensor([[0.3, 0.1]]).expand(2, 2),
                  dropout_p=0.2, rng_state=torch.tensor([7, 1]), sinks=torch.tensor([0.5, -1.0]))),
            (1, 2, 2, 40, 300, 32, False, False, False, 1,
             dict(window_left=20, window_right=5, softcap=3.0)),
            (1, 1, 1, 256, 256, 32, False, False, False, 1,
             dict(window_left=10, window_right=10, alibi_slopes=torch.tensor([[0.2]]))),
            (1, 2, 1, 130, 150, 32, True, True, True, 2, dict(fp16_scores=True))]:
        q, k, v = make_qkv(b, hq, hk, sq, sk, d, torch.float16, "BNSD", generator=g)
        mask = random_key_padding_mask(b, sk, g) if masked else None
        sinks = features.pop("sinks", None)
        variant = Variant(**features)
        out, lse = cpu.forward(q, k, v, mask, scale=0.1, causal=causal, layout="BNSD",
                               variant=variant)
        if sinks is not None:  # the sinks join the denominator (their definition)
            lse = torch.logaddexp(lse, sinks.view(1, -1, 1))
            object.__setattr__(variant, "sinks", sinks)  # Variant.sinks: the sinks branch
        grad_out = torch.randn(out.shape, generator=g).to(out.dtype)
        grad_lse = torch.randn(lse.shape, generator=g)
        problems.append(((grad_out, q, k, v, out, lse, mask, grad_lse),
                         dict(scale=0.1, causal=causal, layout="BNSD", deterministic=det,
                              ai_cores=cores, variant=variant)))
    return problems


def _run(problem) -> str:
    args, options = problem
    try:
        twin.backward(*args, **options)
    except twin.TwinViolation as violation:
        return str(violation)
    return ""


def _line(site: str) -> str:
    return site.split(":")[0]


@pytest.fixture(scope="module")
def mutations():
    built("twin/libflash_cann_twin.so")
    problems = _problems()
    executed: dict[str, tuple[str, list[int]]] = {}  # site -> kind, problems that ran it
    for index, problem in enumerate(problems):
        assert _run(problem) == "", "the unmutated kernel must be race-free"
        for line in twin.sync_sites():
            kind, site, *_ = line.split()
            if kind in EXPLICIT and _line(site) in BACKWARD_FILES:
                executed.setdefault(site, (kind, []))[1].append(index)
    verdicts = {}
    for site, (kind, runs) in sorted(executed.items()):
        message = ""
        with twin.dropped_sync(site):
            for index in runs:
                message = _run(problems[index])
                if message:
                    break
        verdicts[site] = (kind, "race" if " race: " in message else
                          "deadlock" if " deadlock: " in message else message or "NOT CAUGHT")
    return verdicts


def _implied(site: str) -> bool:
    path, line = site.split(":")
    text = (native.ROOT / "op_kernel" / path).read_text().splitlines()[int(line) - 1]
    return any(f"HardEvent::{event}" in text for event in IMPLIED)


def test_the_runs_reach_every_kind_of_sync(mutations):
    kinds = {kind for kind, _ in mutations.values()}
    assert kinds == EXPLICIT, f"sync kinds no run executed: {EXPLICIT - kinds}"


def test_every_explicit_sync_site_is_caught(mutations):
    missed = [f"{kind} {site}" for site, (kind, verdict) in mutations.items()
              if verdict not in ("race", "deadlock") and not _implied(site)]
    assert not missed, f"sync sites whose removal no run catches: {missed}"
    unexpected = [site for site, (kind, verdict) in mutations.items()
                  if verdict in ("race", "deadlock") and _implied(site)]
    assert not unexpected, f"IMPLIED lists sites whose removal is caught: {unexpected}"

