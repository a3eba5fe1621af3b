"""The Triton kernels lowered for Ascend by Huawei's compilers (triton-ascend 3.2.0,
bishengir-compile 1.2.0), with no NPU and no CANN: every plain launch the NPU backend
makes (forward, preprocess, dK/dV, dQ; float16/bfloat16; causal or not; padding mask or
not; head_dim 64/128/256) and a grid of its feature launches (each feature alone and
combined, KV caches through the forward and decode kernels; FEATURE_GRID) for
Ascend910B2, and a covering part of them (every kernel at every dtype and head_dim;
ARCH_COVER) for Ascend910B4, up to the hand-off to `hivmc` (the CANN tool that emits
the binary; with one on PATH a binary is required).

The environment (triton-ascend cannot share one with upstream triton) is built by
scripts/triton_ascend_env.sh into build/triton-ascend-env, once; its site-packages go in
front of this interpreter's in the subprocesses. Under CI=true a failure to build it
fails the tests; elsewhere they skip with the reason.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = ROOT / "build" / "triton-ascend-env"
ARCHES = ("Ascend910B2", "Ascend910B4")
MATMUL_KERNELS = ("fwd", "dkdv", "dq")
MATMUL_AND_DECODE = (*MATMUL_KERNELS, "decode")


def build_ascend_env(directory: Path, python: str = sys.executable) -> str:
    """PYTHONPATH for a subprocess whose `triton` is triton-ascend, after building the
    environment if needed; fails (CI=true) or skips with the reason if it cannot."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:  # xdist workers
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([str(ROOT / "scripts" / "triton_ascend_env.sh"), str(directory)],
                              env=dict(os.environ, PYTHON=python), capture_output=True,
                              text=True)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = directory / "lib" / version / "site-packages"
    if done.returncode or not (site / "triton" / "backends" / "ascend").is_dir():
        reason = (f"could not build the triton-ascend environment "
                  f"(scripts/triton_ascend_env.sh):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return os.pathsep.join([str(site), str(ROOT / "python")])


@pytest.fixture(scope="session")
def ascend_env():
    return build_ascend_env(ENV)


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception),
                                         ("", pytest.skip.Exception)])
def test_an_environment_that_cannot_be_built_fails_ci_else_skips(ci, outcome, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="could not build the triton-ascend environment"):
        build_ascend_env(tmp_path / "env", python=str(tmp_path / "no-python"))


def lower(env_path: str, out: Path, *args: str) -> list[dict]:
    """Run flash_cann.backends.triton.ascend_lowering; its results, one dict per lowering."""
    done = subprocess.run([sys.executable, "-m", "flash_cann.backends.triton.ascend_lowering", "--out", str(out),
                           *args], env=dict(os.environ, PYTHONPATH=env_path),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


# The feature variants CI lowers, (feature set, dtype, head_dim) (FEATURE_VARIANTS holds
# every set for every dtype and head_dim; `python -m flash_cann.backends.triton.
# ascend_lowering` lowers them all): each feature alone and the KV cache's two ways of
# addressing at head_dim 128, and the combinations at every head_dim (the feature
# tables' tiles differ per head_dim) -- but the one with dropout at 128 only: its ten
# Philox rounds cost bishengir-compile ~35 s of CPU per launch and target, the other
# variants ~2 s. The dtypes alternate so that each half of every_variant gets about as
# much work.
FEATURE_GRID = [
    *((name, "bfloat16", 128) for name in ("window", "softcap", "alibi", "varlen", "sinks",
                                           "cache", "paged")),
    ("scores", "float16", 64), ("scores", "bfloat16", 128), ("scores", "float16", 256),
    ("cache-all", "float16", 64), ("cache-all", "bfloat16", 128), ("cache-all", "float16", 256),
    ("all", "float16", 128), ("serving", "bfloat16", 128),
]


def feature_grid():
    from flash_cann.backends.triton.ascend_lowering import FEATURE_VARIANTS

    return [v for v in FEATURE_VARIANTS
            if (v.features, str(v.dtype).removeprefix("torch."), v.head_dim) in FEATURE_GRID]


# The second target. The two 910B models differ, for bishengir-compile, only in their
# core counts (24 / 20 AI cores; the same UB, L1 and L0 sizes and alignments, which its
# memory planning and overflow checks read): test_the_targets_differ_only_in_core_counts
# checks that in the target spec of every launch lowered for both. So the 910B4 lowers a
# covering part of the grid -- every kernel (forward, preprocess, dK/dV, dQ; decode
# through the KV cache sets) at every dtype and head_dim, the four causal x mask corners
# each at least once, and the tile tables but dropout's (plain, "scores", "cache") at
# each head_dim -- and the 910B2 all of it. (The whole grid for both cost twice the
# compiles, the dropout forward's ~35 s included.) The modules themselves cannot be
# compared: bishengir-compile places buffers (UB offsets, workspace order) and names
# values differently from run to run, on one target too.
ARCH_COVER = [("float16", 64, False, False), ("float16", 128, True, True),
              ("float16", 256, False, True), ("bfloat16", 64, True, False),
              ("bfloat16", 128, True, True), ("bfloat16", 256, False, False)]
FEATURE_COVER = ("scores", "cache-all")  # the feature tile tables, at three head_dims each


def arch_cover():
    """The variants lowered for the 910B4: ARCH_COVER's plain ones and FEATURE_COVER's."""
    from flash_cann.backends.triton.ascend_lowering import PLAIN_VARIANTS

    plain = [v for v in PLAIN_VARIANTS if (str(v.dtype).removeprefix("torch."), v.head_dim,
                                           v.causal, v.masked) in ARCH_COVER]
    return plain + [v for v in feature_grid() if v.features in FEATURE_COVER]


@dataclasses.dataclass
class Grid:
    results: list[dict]  # one per lowering, as ascend_lowering prints them
    out: Path  # <out>/<arch>/<variant>/<kernel>/temps/module.hivm.opt.mlir


@pytest.fixture(scope="module")
def every_variant(ascend_env, tmp_path_factory):
    """The plain variants and the feature grid for the 910B2, ARCH_COVER for the 910B4:
    four processes (CI's two cores), one per dtype and one for the dropout variant on the
    910B2 (the front end runs once per launch; each (dtype, head_dim) preprocess once),
    and the 910B4's. The dropout variant lowers its forward kernel only
    (DROPOUT_KERNELS): its ten Philox rounds cost bishengir-compile ~35 s per launch and
    target, as much as a third of the rest of the grid (its dK/dV and dQ were lowered by
    hand: docs/npu.md)."""
    from flash_cann.backends.triton.ascend_lowering import PLAIN_VARIANTS

    out = tmp_path_factory.mktemp("ascend")
    variants = PLAIN_VARIANTS + feature_grid()
    first, second = ("--arch", ARCHES[0]), ("--arch", ARCHES[1])
    heavy = ",".join(v.name for v in variants if _dropout(v))
    jobs = [(*first, "--variants", ",".join(v.name for v in variants
                                            if str(v.dtype) == dtype and not _dropout(v)))
            for dtype in ("torch.float16", "torch.bfloat16")]
    jobs.append((*first, "--variants", heavy, "--kernels", ",".join(DROPOUT_KERNELS)))
    jobs.append((*second, "--variants", ",".join(v.name for v in arch_cover())))
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        runs = pool.map(lambda job: lower(ascend_env, out, *job), jobs)
        return Grid([r for run in runs for r in run], out)


# The kernels CI lowers for the dropout variant (see every_variant).
DROPOUT_KERNELS = ("fwd",)


def _dropout(v) -> bool:
    from flash_cann.backends.triton.ascend_lowering import FEATURE_SETS

    return bool(FEATURE_SETS[v.features].get("dropout_p"))


def _describe(r):
    return f"{r['arch']} {r['kernel']} {r['variant']} {r['tiles']}: {r['outcome']}\n{r['log']}"


def _lowerings(variants) -> int:
    """How many launches one target lowers for ``variants``: each plain variant's fwd,
    dK/dV, dQ; a preprocess per dtype x head_dim, and one with sinks per dtype x head_dim
    with a (non-cache, non-dropout) sinks variant; each feature variant's fwd, dK/dV,
    dQ, or a KV cache's fwd and decode, or the dropout variant's DROPOUT_KERNELS."""
    from flash_cann.backends.triton.ascend_lowering import CACHE_SETS, FEATURE_SETS

    def kernels(v):
        if v.features in CACHE_SETS:
            return 2
        return len(DROPOUT_KERNELS) if _dropout(v) else 3

    preprocess = {(v.dtype, v.head_dim, bool(FEATURE_SETS[v.features].get("sinks")))
                  for v in variants if v.features not in CACHE_SETS and not _dropout(v)}
    return sum(map(kernels, variants)) + len(preprocess)


def test_every_variant_reaches_the_binary_step(every_variant):
    from flash_cann.backends.triton.ascend_lowering import CACHE_SETS, PLAIN_VARIANTS

    results = every_variant.results
    grid, cover = PLAIN_VARIANTS + feature_grid(), arch_cover()
    assert _lowerings(PLAIN_VARIANTS) == 24 * 3 + 6
    by_arch = {arch: [r for r in results if r["arch"] == arch] for arch in ARCHES}
    assert len(by_arch[ARCHES[0]]) == _lowerings(grid)
    assert len(by_arch[ARCHES[1]]) == _lowerings(cover)
    lowered = {(r["variant"], r["kernel"]) for r in by_arch[ARCHES[0]]}
    for features in ("window", "softcap", "alibi", "varlen", "sinks", "scores"):
        assert {k for v, k in lowered if v.endswith(f"-{features}")} >= set(MATMUL_KERNELS)
    assert {k for v, k in lowered if v.endswith("-all") and not v.endswith("-cache-all")} \
        == set(DROPOUT_KERNELS)
    for features in CACHE_SETS:
        assert {k for v, k in lowered if v.endswith(f"-{features}")} == {"fwd", "decode"}
    # The 910B4's part: every kernel at every dtype and head_dim (decode: at each head_dim),
    # each causal x mask corner.
    names = {v.name: v for v in grid}
    covered = {(r["kernel"], names[r["variant"]].dtype, names[r["variant"]].head_dim)
               for r in by_arch[ARCHES[1]]}
    assert covered >= {(k, v.dtype, v.head_dim) for v in PLAIN_VARIANTS
                       for k in ("fwd", "preprocess", "dkdv", "dq")}
    assert {h for k, _, h in covered if k == "decode"} == {64, 128, 256}
    assert {(v.causal, v.masked) for v in cover if v.features == "plain"} == {
        (c, m) for c in (False, True) for m in (False, True)}
    assert {(v.features, v.head_dim) for v in cover if v.features != "plain"} == {
        (f, h) for f in FEATURE_COVER for h in (64, 128, 256)}
    wanted = "binary" if shutil.which("hivmc") else "handoff"
    failed = [r for r in results if r["outcome"] != wanted or r["overflow"]]
    assert not failed, "\n\n".join(map(_describe, failed[:5]))


TARGET_SPEC = re.compile(r"dlti\.target_system_spec = (.*?>>>)")
CORE_COUNT = re.compile(r'("(?:AI|CUBE|VECTOR)_CORE_COUNT", )(\d+)')


def test_the_targets_differ_only_in_core_counts(every_variant):
    """Why the 910B4 lowers only ARCH_COVER and FEATURE_COVER: for each launch lowered for
    both targets, the HIVM modules' target specs (the figures bishengir-compile takes
    from the target: buffer sizes, alignments, core counts) are the same but for the
    core counts (24 AI / 48 vector cores on the 910B2, 20 / 40 on the 910B4)."""
    from flash_cann.backends.triton.ascend_lowering import FEATURE_SETS, PLAIN_VARIANTS

    names = {v.name: v for v in PLAIN_VARIANTS + feature_grid()}

    def launch(r):  # a preprocess is lowered under the first variant of its process to need it
        v = names[r["variant"]]
        if r["kernel"] != "preprocess":
            return r["variant"], r["kernel"]
        return v.dtype, v.head_dim, bool(FEATURE_SETS[v.features].get("sinks"))

    def spec(r):
        hivm = (every_variant.out / r["arch"] / r["variant"] / r["kernel"] / "temps"
                / "module.hivm.opt.mlir").read_text()
        [target] = TARGET_SPEC.findall(hivm)
        return CORE_COUNT.sub(r"\1N", target), sorted(int(n) for _, n in CORE_COUNT.findall(target))

    first = {launch(r): r for r in every_variant.results if r["arch"] == ARCHES[0]}
    second = [r for r in every_variant.results if r["arch"] == ARCHES[1]]
    assert len(second) == _lowerings(arch_cover())
    for r in second:
        (b2, b2_counts), (b4, b4_counts) = spec(first[launch(r)]), spec(r)
        assert (b2_counts, b4_counts) == ([24, 24, 48], [20, 20, 40]), _describe(r)
        assert b2 == b4 and "UB_SIZE" in b2 and "L0C_SIZE" in b2, _describe(r)


def misplaced(kernel: str, units: dict) -> list[str]:
    """What is not where it belongs in a kernel's HIVM module: every mma call must be an
    AIC (cube) function called from the kernel's cube half; exp (and, forward and
    decode, the row max and sum) must be AIV (vector) functions called from its vector
    half."""
    cube = {k: v for k, v in units.items() if k.startswith("mma_tile_")}
    vector = {k: v for k, v in units.items() if k not in cube}
    wanted = ["mma_tile_", "vexp_"] + (["reduce_max", "reduce_sum"] if kernel in ("fwd", "decode")
                                       else [])
    problems = [f"no {w} call" for w in wanted if not any(w in k for k in units)]
    problems += [f"{k}: {v}" for k, v in cube.items()
                 if v["core"] != "AIC" or not v["caller"].endswith("_mix_aic")]
    problems += [f"{k}: {v}" for k, v in vector.items()
                 if v["core"] != "AIV" or not v["caller"].endswith("_mix_aiv")]
    return problems


def test_matmuls_on_the_cube_and_softmax_on_the_vector_units(every_variant):
    for r in every_variant.results:
        if r["kernel"] in MATMUL_AND_DECODE:
            assert not misplaced(r["kernel"], r["units"]), _describe(r)


def test_the_next_larger_tile_overflows(ascend_env, tmp_path):
    """The check can fail: the search's candidate just above the table's forward tile
    (float16, head_dim 128) in area is reported as an overflow of the 910B2's buffers."""
    from flash_cann.backends.triton.ascend_lowering import SEARCH_TILES
    from flash_cann.backends.triton.npu import TILES

    m, n = TILES[("fwd", 128, "float16")]
    larger = [t for t in SEARCH_TILES if t[0] * t[1] > m * n][-1]  # the smallest larger area
    [r] = lower(ascend_env, tmp_path, "--arch", "Ascend910B2", "--kernels", "fwd", "--variants",
                "float16-d128-causal-mask", "--tiles", f"fwd:{larger[0]}:{larger[1]}")
    assert r["outcome"] == "error" and r["overflow"], _describe(r)
    assert "overflow, requires" in r["log"], _describe(r)


@pytest.mark.parametrize("returncodes, lowered", [
    ([-11, 0], True),      # one crash by a signal: retried, lowered
    ([-11, -11], False),   # a crash on every try fails
    ([1], False),          # an error exit is never retried
])
def test_the_adapter_is_retried_once_after_a_crash_by_a_signal(returncodes, lowered, capsys):
    from flash_cann.backends.triton import ascend_lowering

    class Ascend:  # triton-ascend's compiler module: ttir_to_linalg runs the adapter
        calls = 0

        def ttir_to_linalg(self, module, metadata, options, named_ops):
            code = returncodes[self.calls]
            self.calls += 1
            if code:
                raise subprocess.CalledProcessError(code, ["triton-adapter-opt"])
            return "linalg"

    ascend = Ascend()
    if lowered:
        assert ascend_lowering.adapt(ascend, "ttir", {}, None) == "linalg"
        assert "died by signal 11; retrying (1 of 1)" in capsys.readouterr().err
    else:
        with pytest.raises(subprocess.CalledProcessError):
            ascend_lowering.adapt(ascend, "ttir", {}, None)
    assert ascend.calls == len(returncodes)


@pytest.mark.parametrize("exit_code, log, hivmc, outcome, ub_bits", [
    # bishengir-compile planned the kernel and stopped where hivmc would take over
    (1, "error: External hivmc run fails", False, "handoff", None),
    # an overflow stops at the same hand-off: it is an error, with the UB need it reports
    (1, "error: ub overflow, requires 1896448 bits\nerror: External hivmc run fails", False,
     "error", 1896448),
    # with a hivmc on PATH a lowering counts only if it made the binary
    (1, "error: External hivmc run fails", True, "error", None),
    (0, "", True, "binary", None),
], ids=["handoff", "overflow", "hivmc-failed", "binary"])
def test_plan_reads_the_outcome_of_a_compiler_run(tmp_path, monkeypatch, exit_code, log, hivmc,
                                                   outcome, ub_bits):
    """ascend_lowering.plan on a stand-in bishengir-compile that prints a log and exits as
    the real one does (no triton-ascend needed): the outcome, the overflow and its UB
    need, the launch's tiles."""
    import shutil as shutil_module

    from flash_cann.backends.triton import ascend_lowering
    from flash_cann.backends.triton.npu import Launch

    fake = tmp_path / "bishengir-compile"
    fake.write_text(f"#!{sys.executable}\n"
                    "import sys\n"
                    f"sys.stderr.write({log!r})\n"
                    f"if {exit_code} == 0:\n"
                    "    open(sys.argv[sys.argv.index('-o') + 1] + '.o', 'w').close()\n"
                    f"sys.exit({exit_code})\n")
    fake.chmod(0o755)
    which = shutil_module.which
    monkeypatch.setattr(ascend_lowering, "bishengir_compile", lambda: str(fake))
    monkeypatch.setattr(ascend_lowering.shutil, "which", lambda name: (
        ("/usr/local/Ascend/bin/hivmc" if hivmc else None) if name == "hivmc" else which(name)))
    step = Launch("fwd", None, (1,), (), {"BLOCK_M": 64, "BLOCK_N": 32})
    r = ascend_lowering.plan(step, "module {}", "Ascend910B2", tmp_path / "work")
    assert (r.outcome, r.overflow, r.ub_bits) == (outcome, ub_bits is not None, ub_bits), r.log
    assert r.tiles == {"BLOCK_M": 64, "BLOCK_N": 32} and r.kernel == "fwd"
    assert (tmp_path / "work" / "kernel.ttadapter.mlir").read_text() == "module {}"


# The tile table (npu.TILES, or a table of npu.FEATURE_TILES) each feature set's launches
# take, written out: a left window bound, softcap or ALiBi need "scores" ("cache" over a KV
# cache), dropout needs "dropout" whatever else is on; a right bound alone (the causal
# mask), packed sequences, sinks and a KV cache alone keep the plain tiles.
TILE_TABLES = {"plain": "plain", "window": "scores", "softcap": "scores", "alibi": "scores",
               "dropout": "dropout", "varlen": "plain", "sinks": "plain", "scores": "scores",
               "all": "dropout", "cache": "plain", "paged": "plain", "cache-all": "cache",
               "serving": "plain"}


@pytest.mark.parametrize("features", list(TILE_TABLES))
def test_each_launch_takes_its_tile_table(features):
    """The NPU host's launches (recorded, not run: ascend_lowering.launches, no
    triton-ascend needed) at every head_dim take the tiles of their feature set's table:
    the tiles a launch gets are the ones the compile check proved to fit."""
    import torch

    from flash_cann.backends.triton.ascend_lowering import FEATURE_SETS, Variant, launches
    from flash_cann.backends.triton.npu import FEATURE_TILES, PREPROCESS_ROWS, TILES

    assert set(TILE_TABLES) == set(FEATURE_SETS)
    name = TILE_TABLES[features]
    table = TILES if name == "plain" else FEATURE_TILES[name]
    for head_dim in (64, 128, 256):
        steps = launches(Variant(torch.float16, head_dim, True, False, features))
        assert steps
        for step in steps:
            if step.name == "preprocess":
                assert step.constexprs["BLOCK_M"] == PREPROCESS_ROWS
                continue
            tiles = (step.constexprs["BLOCK_M"], step.constexprs["BLOCK_N"])
            assert tiles == table[(step.name, head_dim, "float16")], (features, step.name,
                                                                       head_dim)


def test_units_reads_the_core_type_of_each_call():
    """units() and misplaced() on a HIVM module in the form bishengir-compile writes, and
    on mutations: the matmul in the vector half, a forward without its row max and sum."""
    from flash_cann.backends.triton.ascend_lowering import units

    def module(mma_core, mma_caller):
        return f"""module {{
  func.func private @mma_tile_half_to_float(memref<?xf16>) attributes {{hacc.always_inline, hivm.func_core_type = #hivm.func_core_type<{mma_core}>}}
  func.func private @vexp_1d_float(memref<?xf32>) attributes {{hivm.func_core_type = #hivm.func_core_type<AIV>}}
  func.func @k_mix_aic(%arg0: i64) attributes {{hivm.func_core_type = #hivm.func_core_type<AIC>}} {{
    {"func.call @mma_tile_half_to_float(%a)" if mma_caller == "aic" else ""}
  }}
  func.func @k_mix_aiv(%arg0: i64) attributes {{hivm.func_core_type = #hivm.func_core_type<AIV>}} {{
    func.call @vexp_1d_float(%b)
    {"func.call @mma_tile_half_to_float(%a)" if mma_caller == "aiv" else ""}
  }}
}}"""
    assert units(module("AIC", "aic")) == {
        "mma_tile_half_to_float": {"core": "AIC", "caller": "k_mix_aic"},
        "vexp_1d_float": {"core": "AIV", "caller": "k_mix_aiv"}}
    assert not misplaced("dq", units(module("AIC", "aic")))
    assert misplaced("dq", units(module("AIV", "aiv"))) == [
        "mma_tile_half_to_float: {'core': 'AIV', 'caller': 'k_mix_aiv'}"]
    assert misplaced("fwd", units(module("AIC", "aic"))) == ["no reduce_max call",
                                                            "no reduce_sum call"]


@pytest.fixture(scope="module")
def fake_torch_npu(tmp_path_factory):
    """The fake torch_npu's library (an "npu" device in host memory), built as
    test_npu_extension builds it: against the real torch-npu wheel's headers."""
    import torch
    import torch.utils.cpp_extension

    from torch_npu_wheel import torch_npu_wheel

    if shutil.which("g++") is None:
        pytest.skip("needs g++ to build the fake torch_npu")
    wheel = torch_npu_wheel()
    lib = tmp_path_factory.mktemp("fake_npu") / "libtorch_npu.so"
    torch_lib = Path(torch.__file__).parent / "lib"
    subprocess.run(["g++", "-std=c++17", "-fPIC", "-O0", "-shared",
                    "-Wl,-soname,libtorch_npu.so",
                    f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
                    *[f"-isystem{p}" for p in torch.utils.cpp_extension.include_paths()],
                    f"-isystem{wheel / 'include'}",
                    str(STANDINS / "fake_npu" / "fake_torch_npu.cpp"), "-o", str(lib),
                    f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"],
                   check=True, capture_output=True)
    return lib


STANDINS = Path(__file__).resolve().parent / "npu_standins"


def _scenarios(python_path: str, lib: Path, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDINS / "fake_npu"), python_path]),
               FAKE_TORCH_NPU_LIB=str(lib), LOWERING_DIR=str(out))
    env.pop("ASCEND_CUSTOM_OPP_PATH", None)
    done = subprocess.run([sys.executable, str(STANDINS / "fake_npu" / "triton_scenarios.py")],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_npu_tensors_reach_the_triton_kernels(ascend_env, fake_torch_npu, tmp_path):
    """Without the CANN package, NPU tensors default to the Triton backend (and
    use_backend("triton") selects it): forward and backward through torch.ops.flash_cann,
    four persistent launches over the 910B2's 24 AI cores, each lowered for real; with
    features on (window, softcap, ALiBi, sinks) too, the feature tiles in the launches."""
    from flash_cann.backends.triton.npu import FEATURE_TILES

    results = _scenarios(ascend_env, fake_torch_npu, tmp_path)
    assert "error" not in results, results["error"]
    assert results["default_backend"] == "triton"
    featured = {s["kernel"]: s for s in results["features"]["launched"]}
    assert featured["fwd"]["features"].pop("SINKS")  # the saved lse carries the sink on
    assert featured["preprocess"]["features"] == {"SINKS": True}  # (and its gradient)
    assert results["features"]["grad_sinks"] == ["npu", [4]]
    for kernel in MATMUL_KERNELS:
        assert featured[kernel]["features"] == {"LEFT_BOUNDED": True, "SOFTCAP": True,
                                                "ALIBI": True, "CAUSAL": True}
        assert tuple(featured[kernel]["tiles"]) == FEATURE_TILES["scores"][
            (kernel, 64, "float16")]
    for run in (results["default"], results["use_backend"], results["features"]):
        assert run["out"] == ["npu", [2, 40, 4, 64]]
        assert run["grads"] == [["npu", [2, 40, 4, 64]], ["npu", [2, 40, 2, 64]],
                                ["npu", [2, 40, 2, 64]]]
        assert [s["kernel"] for s in run["launched"]] == ["fwd", "preprocess", "dkdv", "dq"]
        for step in run["launched"]:
            assert step["grid"] == [24] and step["persistent"], step
            assert step["tma"] in (False, None), step  # preprocess has no USE_TMA
            assert step["outcome"] == "handoff" and not step["overflow"], step


def test_npu_without_a_backend_names_what_to_install(fake_torch_npu, tmp_path):
    """No CANN package and no triton-ascend (this interpreter's triton is upstream's):
    the error names both."""
    results = _scenarios(str(ROOT / "python"), fake_torch_npu, tmp_path)
    assert results["default_backend"] == "npu"
    error = results["error"]
    assert error.startswith("NotImplementedError: flash_cann has no backend loaded for device "
                            "type 'npu': npu: flash-cann's NPU extension"), error
    assert "; triton: triton-ascend is not installed" in error and "pip install triton-ascend" \
        in error, error


@pytest.mark.parametrize("runnable, expected", [
    ({"npu", "triton"}, "npu"), ({"triton"}, "triton"), (set(), "npu")])
def test_npu_default_is_the_cann_package_then_triton(runnable, expected, monkeypatch):
    """NPU tensors go to the CANN package when it can run, else to Triton (triton-ascend),
    else to the first (whose error _serving reports with every candidate's reason)."""
    from flash_cann.contract import ops

    monkeypatch.setattr(ops, "is_available", lambda backend, device_type=None:
                        backend.name in runnable)
    assert ops.backend_for("npu").name == expected
    assert ops.backend_for("cpu").name == "cpu"


def test_use_backend_triton_selects_it_on_cuda_and_npu(monkeypatch):
    from flash_cann.contract import ops

    monkeypatch.setattr(ops, "is_available", lambda backend, device_type=None:
                        backend.name == "npu")
    with ops.use_backend("triton"):
        assert ops.backend_for("npu").name == ops.backend_for("cuda").name == "triton"
        assert ops.backend_for("cpu").name == "cpu"
    assert ops.backend_for("npu").name == "npu"
