"""Lower the Triton kernels for Ascend with Huawei's compilers, without an NPU or CANN.

Each launch the NPU backend (``backends/triton/npu.py``) would make for a problem goes
through triton-ascend's front end (Triton IR -> ``triton-adapter-opt`` -> linalg) and
``bishengir-compile`` (HFusion, HIVM, on-chip memory planning) for one ``--target``,
up to the hand-off to ``hivmc``, the CANN tool that emits the binary. ``--save-temps``
keeps the HIVM module given to ``hivmc``; :func:`units` reads from it which core type
(cube AIC, vector AIV) runs each library call. With a ``hivmc`` on PATH (a CANN
machine) the same run goes on to the binary, and a lowering counts only if it made one.

Needs an environment where ``triton`` is triton-ascend (``scripts/triton_ascend_env.sh``
builds one) and ``ascendnpu-ir`` provides bishengir-compile. The driver's flags are
triton-ascend 3.2.0's for the 910B (``linalg_to_bin_enable_npu_compile_A2_A3``); the arch
is given here instead of asked from CANN.

    python -m flash_cann.backends.triton.ascend_lowering --out DIR [--arch Ascend910B2 ...]
            [--variants float16-d128-causal-mask,...] [--kernels fwd,...] [--tiles fwd:64:64]
        lowers the variants (default: all of ``VARIANTS``) for the arches (default: both)
        and prints one JSON object per lowering;
    python -m flash_cann.backends.triton.ascend_lowering --search --out DIR
        prints the largest accepted tiles per kernel, head_dim and dtype (triton_npu.TILES).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import inspect
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ARCHES = ("Ascend910B2", "Ascend910B4")
DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128, 256)
KERNELS = ("fwd", "preprocess", "dkdv", "dq")
FLAGS = ("--enable-auto-multi-buffer=True", "--enable-auto-bind-sub-block=True",
         "--enable-hfusion-compile=true", "--enable-hivm-compile=true",
         "--enable-triton-kernel-compile=true")
HANDOFF = "External hivmc run fails"  # bishengir-compile's words where hivmc is missing
# Library calls that must run on the cube (matmuls) and on the vector units (softmax).
CUBE_CALLS = re.compile(r"mma_tile_\w+")
VECTOR_CALLS = re.compile(r"vexp_\w+|\w*reduce_max\w*|\w*reduce_sum\w*")


@dataclasses.dataclass(frozen=True)
class Variant:
    dtype: torch.dtype
    head_dim: int
    causal: bool
    masked: bool

    @property
    def name(self) -> str:
        return (f"{str(self.dtype).removeprefix('torch.')}-d{self.head_dim}"
                f"-{'causal' if self.causal else 'full'}-{'mask' if self.masked else 'nomask'}")


VARIANTS = [Variant(*v) for v in itertools.product(DTYPES, HEAD_DIMS, (False, True),
                                                   (False, True))]


@dataclasses.dataclass
class Lowering:
    kernel: str
    variant: str
    arch: str
    tiles: dict
    outcome: str  # "handoff" (reached hivmc), "binary" (hivmc made it), "error"
    overflow: bool
    units: dict  # callee -> core type ("AIC" / "AIV") and the kernel function calling it
    log: str


def launches(variant: Variant, tiles: dict | None = None):
    """The launches the NPU backend makes for a forward and a backward of this variant
    (small CPU tensors stand in for NPU ones: only dtypes and strides matter, and the
    AI core count, which sets only the grid, is 1), with ``tiles``
    ({kernel: (BLOCK_M, BLOCK_N)}) replacing the table's."""
    from . import npu as triton_npu

    made = []
    saved = triton_npu.launch, triton_npu.ai_cores
    triton_npu.launch, triton_npu.ai_cores = made.append, lambda device: 1
    try:
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 40, variant.head_dim, generator=gen).to(variant.dtype)
                   for _ in range(3))
        mask = torch.ones(1, 40, dtype=torch.bool) if variant.masked else None
        scale = variant.head_dim ** -0.5
        out, lse = triton_npu.forward(q, k, v, mask, scale=scale, causal=variant.causal,
                                      layout="BNSD")
        triton_npu.backward(out, q, k, v, out, lse, mask, None, scale=scale,
                            causal=variant.causal, layout="BNSD")
    finally:
        triton_npu.launch, triton_npu.ai_cores = saved
    for step in made:
        if tiles and step.name in tiles:
            step.constexprs.update(BLOCK_M=tiles[step.name][0], BLOCK_N=tiles[step.name][1])
    return made


def _source(step, backend):
    """The ASTSource triton-ascend's JIT would compile for this launch (its run(): the
    signature and specialisations of the bound arguments)."""
    from triton.compiler.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    kernel = step.kernel
    bound = inspect.signature(kernel.fn).bind(*step.args, **step.constexprs)
    bound.apply_defaults()  # the features' arguments, off unless a launch sets them
    values = list(bound.arguments.values())
    attrs = backend.get_attrs_descriptor(kernel.params, values)
    specialised = attrs.get_constants()
    signature = {p.name: "*i8" if v is None else mangle_type(v)
                 for p, v in zip(kernel.params, values) if not p.is_constexpr}
    constants = {p.name: v for p, v in zip(kernel.params, values)
                 if p.is_constexpr or p.num in specialised or v is None}
    return ASTSource(kernel, signature, constants, attrs)


def bishengir_compile() -> str:
    import ascendnpuir

    return str(Path(ascendnpuir.__file__).parent / "bin" / "bishengir-compile")


def to_linalg(step) -> str:
    """triton-ascend's front end for one launch: Triton IR, then ``triton-adapter-opt`` to
    linalg (the same for every 910B model)."""
    from triton._C.libtriton import ir
    from triton.backends.ascend import compiler as ascend
    from triton.backends.compiler import GPUTarget

    backend = ascend.AscendBackend(GPUTarget("npu", ARCHES[0], 0))
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    metadata = {"target": backend.target, **options.__dict__}
    module = _source(step, backend).make_ir(options, backend.get_codegen_implementation(), {},
                                            context)
    module = ascend.make_ttir(module, metadata, options)
    linalg = ascend.ttir_to_linalg(module, metadata, options, named_ops=True)
    return ascend._parse_linalg_metadata(linalg, metadata)[0]


def plan(step, linalg: str, arch: str, workdir: Path) -> Lowering:
    """bishengir-compile for ``arch``; the HIVM module is kept under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "kernel.ttadapter.mlir"
    source.write_text(linalg)
    done = subprocess.run([bishengir_compile(), str(source), f"--target={arch}", *FLAGS,
                           f"--save-temps={workdir / 'temps'}", "-o", str(workdir / "kernel")],
                          capture_output=True, text=True)
    log = done.stdout + done.stderr
    if done.returncode == 0 and any(workdir.glob("kernel*.o")):
        outcome = "binary"
    elif done.returncode != 0 and HANDOFF in log and "overflow" not in log.lower() \
            and shutil.which("hivmc") is None:
        outcome = "handoff"
    else:
        outcome = "error"
    hivm = workdir / "temps" / "module.hivm.opt.mlir"
    tiles = {k: step.constexprs.get(k) for k in ("BLOCK_M", "BLOCK_N")}
    return Lowering(step.name, "", arch, tiles, outcome, "overflow" in log.lower(),
                    units(hivm.read_text()) if hivm.exists() else {}, log[-3000:])


def lower(step, arch: str, workdir: Path) -> Lowering:
    """Lower one launch for ``arch``, up to the hand-off to hivmc (or the binary)."""
    return plan(step, to_linalg(step), arch, workdir)


def units(hivm: str) -> dict:
    """callee -> (its core type, the kernel entry that calls it) for the cube and vector
    library calls of a HIVM module (``func.func private @callee ... func_core_type<X>``;
    the entries are ``<kernel>_mix_aic`` and ``<kernel>_mix_aiv``)."""
    core_of = dict(re.findall(r"func\.func private @(\w+)\([^{]*\{[^}]*func_core_type<(\w+)>",
                              hivm))
    found = {}
    for entry, body in re.findall(r"func\.func @(\w+_mix_ai[cv])\((.*?)(?=\n  func\.func|\Z)",
                                  hivm, flags=re.S):
        for callee in set(re.findall(r"func\.call @(\w+)", body)):
            if CUBE_CALLS.fullmatch(callee) or VECTOR_CALLS.fullmatch(callee):
                found[callee] = {"core": core_of.get(callee), "caller": entry}
    return found


def _lower_all(jobs, out: Path, kernels=KERNELS):
    """jobs: (variant, arches, tiles); one result per lowering of ``kernels`` and arch, in
    job order. The front end runs once per launch for all arches. The preprocess kernel
    does not depend on causal and mask: lowered once per dtype and head_dim."""
    results = []
    seen = set()
    for variant, arches, tiles in jobs:
        for step in launches(variant, tiles):
            key = (variant.dtype, variant.head_dim, step.name, str(tiles))
            if step.name not in kernels or (step.name == "preprocess" and key in seen):
                continue
            seen.add(key)
            tag = "-".join(f"{k}{v}" for k, v in sorted((tiles or {}).items()))
            linalg = to_linalg(step)
            for arch in arches:
                result = plan(step, linalg, arch, out / arch / variant.name / f"{step.name}{tag}")
                result.variant = variant.name
                results.append(dataclasses.asdict(result))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHES, action="append")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", help="comma-separated Variant names (default: all)")
    parser.add_argument("--tiles", action="append", default=[],
                        help="kernel:BLOCK_M:BLOCK_N instead of the table's")
    parser.add_argument("--kernels", default=",".join(KERNELS),
                        help=f"comma-separated, of {KERNELS} (default: all)")
    parser.add_argument("--search", action="store_true")
    args = parser.parse_args(argv)
    if args.search:
        print(json.dumps(search(args.out)))
        return 0
    tiles = {t.split(":")[0]: tuple(map(int, t.split(":")[1:])) for t in args.tiles}
    wanted = set(args.variants.split(",")) if args.variants else None
    jobs = [(v, tuple(args.arch or ARCHES), tiles) for v in VARIANTS
            if wanted is None or v.name in wanted]
    for result in _lower_all(jobs, args.out, tuple(args.kernels.split(","))):
        print(json.dumps(result))
    return 0


def _largest_accepted(kernel: str, dtype: torch.dtype, head_dim: int, out: Path):
    """The first tile of SEARCH_TILES for which the heaviest variant (causal, padding
    mask) of ``kernel`` plans on the 910B2; the compile check then lowers every variant
    with it."""
    for tile in SEARCH_TILES:
        results = _lower_all([(Variant(dtype, head_dim, True, True), ("Ascend910B2",),
                               {kernel: tile})], out, (kernel,))
        if all(r["outcome"] in ("handoff", "binary") for r in results):
            return tile
    return None


# Candidates by area, then larger BLOCK_M (fewer passes over K and V).
SEARCH_TILES = sorted(itertools.product((128, 64, 32, 16), repeat=2),
                      key=lambda t: (-t[0] * t[1], -t[0]))


def search(out: Path) -> dict:
    """The largest accepted (BLOCK_M, BLOCK_N) per kernel, head_dim and dtype."""
    keys = list(itertools.product(("fwd", "dkdv", "dq"), DTYPES, HEAD_DIMS))
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        found = pool.map(_largest_accepted, *zip(*keys), itertools.repeat(out / "search"))
        return {f"{k}:{d}:{str(t).removeprefix('torch.')}": tile
                for (k, t, d), tile in zip(keys, found)}


if __name__ == "__main__":
    sys.exit(main())
