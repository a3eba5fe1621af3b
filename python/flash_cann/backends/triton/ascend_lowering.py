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
        lowers the variants (default: all of ``VARIANTS``, plain and with features) for
        the arches (default: both) and prints one JSON object per lowering (with an
        overflow's UB need, ``ub_bits``, as bishengir-compile reports it);
    python -m flash_cann.backends.triton.ascend_lowering --search [--table scores] --out DIR
        prints the largest accepted tiles per kernel, head_dim and dtype of one tile
        table (npu.TILES, npu.FEATURE_TILES).
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

from ...contract.variant import Variant as ContractVariant

ARCHES = ("Ascend910B2", "Ascend910B4")
DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128, 256)
KERNELS = ("fwd", "preprocess", "dkdv", "dq", "decode")
FLAGS = ("--enable-auto-multi-buffer=True", "--enable-auto-bind-sub-block=True",
         "--enable-hfusion-compile=true", "--enable-hivm-compile=true",
         "--enable-triton-kernel-compile=true")
HANDOFF = "External hivmc run fails"  # bishengir-compile's words where hivmc is missing
# Library calls that must run on the cube (matmuls) and on the vector units (softmax).
CUBE_CALLS = re.compile(r"mma_tile_\w+")
VECTOR_CALLS = re.compile(r"vexp_\w+|\w*reduce_max\w*|\w*reduce_sum\w*")


# The feature sets lowered besides plain attention (flash_cann.contract.variant): each
# feature alone, then all together; the KV cache's ways of addressing, alone and with
# every feature it takes. Each names its arguments for launches(); "causal" and
# "masked" (a key padding mask) are set by the variant.
FEATURE_SETS = {
    "plain": {},
    "window": dict(window=(24, 8)),
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi=True),
    "dropout": dict(dropout_p=0.1),
    "varlen": dict(varlen=True),
    "sinks": dict(sinks=True),
    "scores": dict(window=(24, -1), softcap=30.0, alibi=True),
    "all": dict(window=(24, -1), softcap=30.0, alibi=True, dropout_p=0.1, varlen=True,
                sinks=True),
    "cache": dict(cache="rows"),
    "paged": dict(cache="paged"),
    "cache-all": dict(cache="paged", window=(24, -1), softcap=30.0, alibi=True, sinks=True),
    # vLLM's call: packed queries over a paged cache, and cache_leftpad.
    "serving": dict(cache="paged", varlen=True, leftpad=True),
}
# The KV cache sets run a forward only: the forward kernel for one query head per kv
# head, the decode kernel for a GQA group.
CACHE_SETS = ("cache", "paged", "cache-all", "serving")


@dataclasses.dataclass(frozen=True)
class Variant:
    dtype: torch.dtype
    head_dim: int
    causal: bool
    masked: bool
    features: str = "plain"

    @property
    def name(self) -> str:
        plain = (f"{str(self.dtype).removeprefix('torch.')}-d{self.head_dim}"
                 f"-{'causal' if self.causal else 'full'}-{'mask' if self.masked else 'nomask'}")
        return plain if self.features == "plain" else f"{plain}-{self.features}"


PLAIN_VARIANTS = [Variant(*v) for v in itertools.product(DTYPES, HEAD_DIMS, (False, True),
                                                         (False, True))]
# Each feature set for every dtype and head_dim (the feature tile table is per head_dim),
# causal (the window: its own right bound) and with a padding mask where the call takes
# one (packed sequences and KV caches do not).
FEATURE_VARIANTS = [
    Variant(dtype, head_dim, name != "window", name not in ("varlen", "all", *CACHE_SETS), name)
    for name in FEATURE_SETS if name != "plain" for dtype in DTYPES for head_dim in HEAD_DIMS]
VARIANTS = PLAIN_VARIANTS + FEATURE_VARIANTS


@dataclasses.dataclass
class Lowering:
    kernel: str
    variant: str
    arch: str
    tiles: dict
    outcome: str  # "handoff" (reached hivmc), "binary" (hivmc made it), "error"
    overflow: bool
    ub_bits: int | None  # an overflow's UB need, as bishengir-compile reports it
    units: dict  # callee -> core type ("AIC" / "AIV") and the kernel function calling it
    log: str


def _contract_variant(features: dict, batch: int, heads_q: int, seqlens: tuple[int, int],
                      cu_seqlens: torch.Tensor | None) -> ContractVariant:
    """The checked arguments (flash_cann.contract.variant.Variant) of a feature set."""
    left, right = features.get("window", (-1, -1))
    slopes = torch.full((batch, heads_q), 0.25) if features.get("alibi") else None
    dropout_p = features.get("dropout_p", 0.0)
    return ContractVariant(
        window_left=left, window_right=right, softcap=features.get("softcap", 0.0),
        alibi_slopes=slopes, dropout_p=dropout_p,
        rng_state=torch.tensor([1, 0]) if dropout_p else None,
        sinks=torch.zeros(heads_q) if features.get("sinks") else None, cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens, max_seqlen_q=seqlens[0] if cu_seqlens is not None else 0,
        max_seqlen_k=seqlens[1] if cu_seqlens is not None else 0)


def launches(variant: Variant, tiles: dict | None = None):
    """The launches the NPU backend makes for a forward and a backward of this variant (a
    forward over the cache with one query head per kv head, then with a GQA group, for
    the KV cache sets). Small CPU tensors stand in for NPU ones: only dtypes, strides
    and which arguments are given matter, and the AI core count, which sets only the
    grid, is 1. ``tiles`` ({kernel: (BLOCK_M, BLOCK_N)}) replace the table's."""
    from . import npu as triton_npu

    made = []
    saved = triton_npu.launch, triton_npu.ai_cores
    triton_npu.launch, triton_npu.ai_cores = made.append, lambda device: 1
    features = FEATURE_SETS[variant.features]
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(variant.dtype)

    scale = variant.head_dim ** -0.5
    try:
        if "cache" in features:
            for heads_kv in (2, 1):
                _cache_forward(triton_npu, features, rand, heads_kv, variant.head_dim,
                               scale, variant.causal)
        else:
            packed = features.get("varlen", False)
            shape = (80, 2, variant.head_dim) if packed else (1, 2, 40, variant.head_dim)
            q, k, v = (rand(*shape) for _ in range(3))
            cu_seqlens = torch.tensor([0, 40, 80], dtype=torch.int32) if packed else None
            contract = _contract_variant(features, 2 if packed else 1, 2, (40, 40), cu_seqlens)
            mask = torch.ones(1, 40, dtype=torch.bool) if variant.masked else None
            layout = "TND" if packed else "BNSD"
            out, lse = triton_npu.forward(q, k, v, mask, scale=scale, causal=variant.causal,
                                          layout=layout, variant=contract)
            triton_npu.backward(out, q, k, v, out, lse, mask, None, scale=scale,
                                causal=variant.causal, layout=layout, variant=contract)
    finally:
        triton_npu.launch, triton_npu.ai_cores = saved
    for step in made:
        if tiles and step.name in tiles:
            step.constexprs.update(BLOCK_M=tiles[step.name][0], BLOCK_N=tiles[step.name][1])
    return made


def _cache_forward(triton_npu, features: dict, rand, heads_kv: int, head_dim: int,
                   scale: float, causal: bool) -> None:
    """A KV cache forward (BSND, 2 query heads, 2 sequences of 4 new rows; "varlen": the
    same rows packed, TND) over a cache of 2 rows of 48 keys, addressed by
    cache_batch_idx ("rows") or as pages of 16 keys through a block table ("paged"),
    from key 0 or ("leftpad") from each sequence's cache_leftpad."""
    packed = features.get("varlen", False)
    q = rand(8, 2, head_dim) if packed else rand(2, 4, 2, head_dim)
    cu_seqlens = torch.tensor([0, 4, 8], dtype=torch.int32) if packed else None
    leftpad = torch.tensor([3, 0], dtype=torch.int32) if features.get("leftpad") else None
    seqlens_k = torch.tensor([40, 48], dtype=torch.int32)
    if features["cache"] == "paged":
        k, v = (rand(6, 16, heads_kv, head_dim) for _ in range(2))
        block_table = torch.arange(6, dtype=torch.int32).reshape(2, 3)
        batch_idx = None
    else:
        k, v = (rand(2, 48, heads_kv, head_dim) for _ in range(2))
        block_table = None
        batch_idx = torch.tensor([1, 0], dtype=torch.int32)
    variant = _contract_variant(features, 2, 2, (4, 48), cu_seqlens)
    triton_npu.kvcache_forward(q, k, v, seqlens_k, batch_idx, block_table, scale=scale,
                               causal=causal, layout="TND" if packed else "BSND",
                               cache_leftpad=leftpad, variant=dataclasses.replace(
                                   variant, cu_seqlens_k=None, max_seqlen_k=0))


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
    linalg = adapt(ascend, module, metadata, options)
    return ascend._parse_linalg_metadata(linalg, metadata)[0]


# triton-adapter-opt (triton-ascend 3.2.0) once died by SIGSEGV in CI on a grid whose every
# launch then lowered on a rerun of the same inputs: a crash by a signal is retried this many
# times (and said on stderr); an error exit, or a crash on every try, fails as before.
ADAPTER_RETRIES = 1


def adapt(ascend, module, metadata, options) -> str:
    """``triton-adapter-opt`` over the Triton IR (ascend.ttir_to_linalg), retried after a
    crash by a signal (ADAPTER_RETRIES)."""
    retries = 0
    while True:
        try:
            return ascend.ttir_to_linalg(module, metadata, options, named_ops=True)
        except subprocess.CalledProcessError as err:
            if err.returncode >= 0 or retries == ADAPTER_RETRIES:
                raise
            retries += 1
            print(f"flash_cann: triton-adapter-opt died by signal {-err.returncode}; "
                  f"retrying ({retries} of {ADAPTER_RETRIES})", file=sys.stderr)


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
    need = re.search(r"ub overflow, requires (\d+) bits", log)
    return Lowering(step.name, "", arch, tiles, outcome, "overflow" in log.lower(),
                    int(need.group(1)) if need else None,
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
    """jobs: (variant, arches, tiles); yields one result per lowering of ``kernels`` and
    arch, in job order. The front end runs once per launch for all arches. The
    preprocess kernel depends on no feature but sinks: lowered once per dtype, head_dim
    and whether there are sinks."""
    seen = set()
    for variant, arches, tiles in jobs:
        for step in launches(variant, tiles):
            key = (variant.dtype, variant.head_dim, step.name, str(tiles),
                   step.constexprs.get("SINKS", False))
            if step.name not in kernels or (step.name == "preprocess" and key in seen):
                continue
            seen.add(key)
            tag = "-".join(f"{k}{v}" for k, v in sorted((tiles or {}).items()))
            linalg = to_linalg(step)
            for arch in arches:
                result = plan(step, linalg, arch, out / arch / variant.name / f"{step.name}{tag}")
                result.variant = variant.name
                yield dataclasses.asdict(result)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHES, action="append")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", help="comma-separated Variant names (default: all)")
    parser.add_argument("--tiles", action="append", default=[],
                        help="kernel:BLOCK_M:BLOCK_N instead of the table's")
    parser.add_argument("--kernels", help=f"comma-separated, of {KERNELS} (default: all; "
                                          "with --search, the table's)")
    parser.add_argument("--search", action="store_true")
    parser.add_argument("--table", choices=tuple(SEARCHED), default="plain",
                        help="the tile table --search sizes (default: plain)")
    args = parser.parse_args(argv)
    if args.search:
        print(json.dumps(search(args.out, args.table,
                                args.kernels and tuple(args.kernels.split(",")))))
        return 0
    tiles = {t.split(":")[0]: tuple(map(int, t.split(":")[1:])) for t in args.tiles}
    wanted = set(args.variants.split(",")) if args.variants else None
    unknown = (wanted or set()) - {v.name for v in VARIANTS}
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)} (names as Variant.name: "
                     f"{VARIANTS[0].name}, {VARIANTS[-1].name}, ...)")
    jobs = [(v, tuple(args.arch or ARCHES), tiles) for v in VARIANTS
            if wanted is None or v.name in wanted]
    for result in _lower_all(jobs, args.out, tuple((args.kernels or ",".join(KERNELS))
                                                   .split(","))):
        print(json.dumps(result), flush=True)
    return 0


# The variant whose tiles each table's search sizes (npu.tile_class): the heaviest that
# table serves (causal; a padding mask where the call takes one).
SEARCHED = {"plain": "plain", "scores": "scores", "dropout": "all", "cache": "cache-all"}
# The kernels each table sizes (a KV cache runs the forward and decode kernels only).
SEARCHED_KERNELS = {"plain": ("fwd", "dkdv", "dq", "decode"), "scores": ("fwd", "dkdv", "dq"),
                    "dropout": ("fwd", "dkdv", "dq"), "cache": ("fwd", "decode")}


def _largest_accepted(kernel: str, dtype: torch.dtype, head_dim: int, out: Path,
                      table: str = "plain"):
    """The first tile of SEARCH_TILES for which the heaviest variant a table serves
    (SEARCHED) plans ``kernel`` on the 910B2 with no UB/L1/L0 overflow (not even one
    that bishengir-compile recovers from by turning code motion off); the compile check
    then lowers every variant with it. The feature tables' search (and the decode
    kernel's) starts at the plain forward tile: a feature never gets a larger one."""
    # The decode kernel runs over KV caches only: its plain tiles are sized on pages.
    features = "paged" if (table, kernel) == ("plain", "decode") else SEARCHED[table]
    variant = Variant(dtype, head_dim, True, "varlen" not in FEATURE_SETS[features]
                      and "cache" not in FEATURE_SETS[features], features)
    from .npu import TILES
    m, n = TILES[("fwd" if kernel == "decode" else kernel, head_dim,
                  str(dtype).removeprefix("torch."))]
    capped = table != "plain" or kernel == "decode"
    for tile in SEARCH_TILES:
        if capped and (tile[0] * tile[1] > m * n or tile[0] > m or tile[1] > n):
            continue
        results = list(_lower_all([(variant, ("Ascend910B2",), {kernel: tile})], out,
                                  (kernel,)))
        if all(r["outcome"] in ("handoff", "binary") for r in results):
            return tile
    return None


# Candidates by area, then larger BLOCK_M (fewer passes over K and V).
SEARCH_TILES = sorted(itertools.product((128, 64, 32, 16), repeat=2),
                      key=lambda t: (-t[0] * t[1], -t[0]))


def search(out: Path, table: str = "plain", kernels=None, head_dims=HEAD_DIMS,
           dtypes=DTYPES) -> dict:
    """The largest accepted (BLOCK_M, BLOCK_N) per kernel (default: the table's,
    SEARCHED_KERNELS), head_dim and dtype for one tile table (npu.TILES, or a table of
    npu.FEATURE_TILES)."""
    keys = list(itertools.product(kernels or SEARCHED_KERNELS[table], dtypes, head_dims))
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        found = pool.map(_largest_accepted, *zip(*keys), itertools.repeat(out / "search"),
                         itertools.repeat(table))
        return {f"{k}:{d}:{str(t).removeprefix('torch.')}": tile
                for (k, t, d), tile in zip(keys, found)}


if __name__ == "__main__":
    sys.exit(main())
