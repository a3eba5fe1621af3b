"""Build the Triton backend's kernels for a GPU target on a machine without a GPU, and
report each kernel's registers, spill bytes and shared memory (the numbers in NOTES.md).

    python benchmarks/triton_builds.py [--arch 90] [--tma 1] [--configs candidates]
                                       [--head-dims 64,128,256]

The launcher (flash_cann.backends.triton.forward/backward) runs on CPU tensors with
Triton's driver replaced by one that names the target, and every launch turned into a
compile-only warm-up: the kernels, specialisations and configs are exactly those a GPU
run would build. --configs default: the small-problem configs over head_dims, masks,
causal and GQA, plus a packed (TND) forward and a paged decode, unsplit and split;
candidates: every config the autotuner may try, per head_dim (the decode kernel's on
the paged decode, the forward's also on the packed forward).
Needs triton (its bundled ptxas and cuobjdump), no GPU.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


class _TargetDriver:
    """Enough of a Triton driver to compile for ``target`` (launches never happen)."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


def _resource_usage(cubin: bytes, cuobjdump: str) -> tuple[int, int]:
    """(registers, spill bytes) per thread, from the cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return int(match.group(1)), int(match.group(2))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 or 80")
    p.add_argument("--tma", choices=["0", "1"], default="1",
                   help="FLASH_CANN_TRITON_TMA: 1 builds the descriptor path")
    p.add_argument("--configs", choices=["default", "candidates"], default="candidates")
    p.add_argument("--head-dims", default="64,128,256",
                   help="for --configs candidates")
    args = p.parse_args(argv)
    os.environ["FLASH_CANN_TRITON_TMA"] = args.tma

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from flash_cann.backends.triton import cuda as backend
    from flash_cann.contract.variant import Variant

    driver.set_active(_TargetDriver(GPUTarget("cuda", args.arch, 32)))
    built = {}
    compile_and_run = JITFunction.run

    def compile_only(self, *a, grid, warmup, **kwargs):
        kernel = compile_and_run(self, *a, grid=grid, warmup=True, **kwargs)
        name = self.fn.__name__ + ("/packed" if kwargs.get("PACKED_TILES") else "") \
            + ("/tnd" if kwargs.get("VARLEN") and "SeqUsedK" in kwargs else "") \
            + ("/paged" if kwargs.get("PAGED") else "") \
            + ("/split" if kwargs.get("splits", 1) != 1 else "")
        key = (name, kwargs.get("HEAD_DIM"), kwargs.get("CAUSAL"),
               kwargs.get("HAS_MASK"), kwargs.get("USE_TMA"), kwargs.get("BLOCK_M"),
               kwargs.get("BLOCK_N"), kwargs.get("num_warps"), kwargs.get("num_stages"))
        built.setdefault(key, kernel)
        return kernel

    JITFunction.run = compile_only
    gen = torch.Generator().manual_seed(0)

    def run(causal, masked, heads, head_dim, seqlens, layout="BSND", **pinned):
        (hq, hk), (sq, sk) = heads, seqlens
        shape = (lambda h, s: (1, s, h, head_dim)) if layout == "BSND" else (
            lambda h, s: (1, h, s, head_dim))
        q, k, v = (torch.randn(shape(h, s), generator=gen).to(torch.bfloat16)
                   for h, s in ((hq, sq), (hk, sk), (hk, sk)))
        mask = torch.rand(1, sk, generator=gen) < 0.9 if masked else None
        scale = 1 / math.sqrt(head_dim)
        with backend.pinned_configs(**pinned):
            out, lse = backend.forward(q, k, v, mask, scale=scale, causal=causal, layout=layout)
            backend.backward(torch.randn_like(out), q, k, v, out, lse, mask,
                             torch.randn_like(lse), scale=scale, causal=causal, layout=layout)

    def run_packed(head_dim, **pinned):
        """The packed (TND) forward: the grid over real query blocks, causal."""
        lengths = torch.tensor([0, 100, 1, 250])
        cu = lengths.cumsum(0).to(torch.int32)
        q, k, v = (torch.randn(int(cu[-1]), h, head_dim, generator=gen).to(torch.bfloat16)
                   for h in (4, 2, 2))
        variant = Variant(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=250, max_seqlen_k=250)
        with backend.pinned_configs(**pinned):
            backend.forward(q, k, v, None, scale=1 / math.sqrt(head_dim), causal=True,
                            layout="TND", variant=variant)

    def run_cache(head_dim, **pinned):
        """A paged GQA decode, unsplit and split (the decode and combine kernels), with
        BSND queries and with vLLM's packed ones (TND, cache_leftpad)."""
        k_cache, v_cache = (torch.randn(8, 64, 2, head_dim, generator=gen).to(torch.bfloat16)
                            for _ in range(2))
        q = torch.randn(2, 1, 8, head_dim, generator=gen).to(torch.bfloat16)
        table = torch.arange(8, dtype=torch.int32).view(2, 4)
        lengths = torch.tensor([100, 256], dtype=torch.int32)
        # vLLM's call: packed query rows (a prefill chunk, decode rows), cache_leftpad.
        cu_q = torch.tensor([0, 5, 6], dtype=torch.int32)
        packed_q = torch.randn(6, 8, head_dim, generator=gen).to(torch.bfloat16)
        packed = dict(layout="TND", cache_leftpad=torch.tensor([3, 0], dtype=torch.int32),
                      variant=Variant(cu_seqlens_q=cu_q, max_seqlen_q=5))
        with backend.pinned_configs(**pinned):
            for splits in (1, 4):
                backend.kvcache_forward(q, k_cache, v_cache, lengths, None, table,
                                        scale=1 / math.sqrt(head_dim), causal=True,
                                        num_splits=splits)
                backend.kvcache_forward(packed_q, k_cache, v_cache, lengths, None, table,
                                        scale=1 / math.sqrt(head_dim), causal=True,
                                        num_splits=splits, **packed)

    if args.configs == "default":
        for causal, masked, heads, head_dim in itertools.product(
                (False, True), (False, True), ((2, 2), (4, 1)), (16, 59, 64, 80, 128, 256)):
            run(causal, masked, heads, head_dim, (100, 130))
        for head_dim in (64, 128, 256):
            run_packed(head_dim)
            run_cache(head_dim)
    else:
        for head_dim in (int(d) for d in args.head_dims.split(",")):
            for name, kernel in backend.KERNELS.items():
                for config in kernel.candidates(backend._block_d(head_dim)):
                    if name == "decode":
                        run_cache(head_dim, decode=config)
                        continue
                    for causal in (False, True):
                        run(causal, False, (2, 2), head_dim, (300, 300), **{name: config})
                    if name == "fwd":
                        run_packed(head_dim, fwd=config)

    cuobjdump = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    print(f"{'kernel':<20}{'d':>4} {'causal':<6}{'mask':<6}{'tma':<6}{'M x N':>9}{'warps':>6}"
          f"{'stages':>7}{'regs':>6}{'spill':>7}{'smem KiB':>9}")
    for key, kernel in sorted(built.items(), key=lambda kv: str(kv[0])):
        name, head_dim, causal, masked, tma, m, n, warps, stages = key
        regs, spill = _resource_usage(kernel.asm["cubin"], cuobjdump)
        tile = f"{m}x{n}" if n else f"{m}"
        print(f"{name:<20}{head_dim:>4} {causal!s:<6}{masked!s:<6}{tma!s:<6}{tile:>9}"
              f"{warps or '':>6}{stages or '':>7}{regs:>6}{spill:>7}"
              f"{kernel.metadata.shared / 1024:>9.0f}")
    print(f"{len(built)} kernels built for sm_{args.arch}")


if __name__ == "__main__":
    main()
