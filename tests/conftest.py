"""Shared test helpers: input factories for every layout, fresh random inputs per case."""

from __future__ import annotations

import os
import threading
import zlib

import pytest
import torch

import native_build

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


# Test tiers. `-m fast` is the contributor's loop (<= 60 s of CPU on the 2-core CI
# machine): the contract, the API and its errors, the op registration, and a slice of
# the accuracy grid -- no native build, no subprocess. The full suite (plain pytest,
# what CI runs) adds everything else. A module lands in the fast tier only by being
# listed here, so a new module is in the full tier until someone measures it.
FAST_MODULES = {"test_api.py", "test_errors.py", "test_ops.py", "test_spec.py", "test_layering.py",
                "test_reference.py", "test_accuracy.py", "test_host_path.py",
                "test_mutants.py", "test_serving.py", "test_docs.py", "test_doc_claims.py"}


# Tests of other modules in the fast tier, by name prefix: cheap and central.
FAST_TESTS = {"test_features.py": ("test_bad_feature_arguments_are_named",
                                   "test_batched_features_match_the_oracle"),
              "test_npu_fusion_attention.py": ("test_refusals_name_the_argument",
                                               "test_tnd_refusals_name_the_argument",
                                               "test_sparse_modes_match_the_oracle"),
              "test_npu_fusion_attention_grid.py": ("test_left_bound_at_and_past",),
              # the cpu backend's small fuzz budget (the larger ones are the full suite's)
              "test_fuzz.py": ("test_cpu_fast_matches_oracle",)}


def _is_fast(item) -> bool:
    if item.path.name in FAST_TESTS:
        return item.name.startswith(FAST_TESTS[item.path.name])
    if item.path.name not in FAST_MODULES:
        return False
    params = getattr(item, "callspec", None)
    if item.path.name == "test_accuracy.py" and params is not None:
        # The grid's smallest corner: head_dim 64, at most 128 x 128 scores per head.
        seqlen_q, seqlen_k = params.params.get("seqlens", (0, 0))
        return params.params.get("head_dim") == 64 and seqlen_q * seqlen_k <= 128 * 128
    return True


# pytest-xdist (CI: `-n 2`, README). A module's tests run on one worker, so that its
# module- and session-scoped fixtures (the lowering grid, the stand-in and extension
# builds, the context-parallel launches) run once; the two modules that share the NPU
# extension's session build are one unit. SPREAD modules -- many independent tests and
# no fixture broader than a test's (the native build is locked and incremental) -- go
# test by test to whichever worker is free. Workers take the modules of LONGEST_FIRST
# first (each a minute or more on CI), then the other modules, then the spread tests,
# so that the two workers finish together.
XDIST_UNITS = {"test_npu_capture.py": "npu_extension", "test_npu_extension.py": "npu_extension"}
SPREAD = {"test_accuracy.py", "test_features.py", "test_op_host.py", "test_ops.py"}
LONGEST_FIRST = ("test_triton_npu.py", "test_triton_interpreter.py", "test_wheel.py")


def xdist_unit(nodeid: str) -> str:
    """The unit of work a test goes to a worker in: its module's, or itself if spread."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    return nodeid if name in SPREAD else XDIST_UNITS.get(name, path)


def _xdist_order(item) -> tuple:
    name = item.path.name
    if name in SPREAD:
        return (2, 0)
    return (0, LONGEST_FIRST.index(name)) if name in LONGEST_FIRST else (1, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, the scopes being xdist_unit's, in the workers'
    collection order (_xdist_order)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_fast(item):
            item.add_marker(pytest.mark.fast)
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike
        items.sort(key=_xdist_order)


def pytest_configure(config):
    """Registers the tier marker. Under CI=true a missing native tool fails the session
    at once: without it the planner, twin, CANN-shell and packaging tests would all skip,
    and CI would pass."""
    config.addinivalue_line("markers", "fast: the <= 60 s tier (-m fast); see conftest.py")
    config.addinivalue_line("markers", "npu: needs a real Ascend NPU (-m npu; "
                                       "tests/test_npu_tier.py); skips without one")
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # The controller of xdist workers: they run in _xdist_order's order, and their
        # torch threads sleep when idle, instead of spinning on the cores the other
        # worker needs (two workers of two threads on CI's two cores).
        config.option.loadscopereorder = False
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    absent = native_build.missing()
    if native_build.ON_CI and absent:
        raise pytest.UsageError(
            f"CI=true but {', '.join(absent)} not found on PATH: the native tests need "
            f"cmake (>= 3.16) and a C++17 compiler (g++, gcc); see README.md, Two commands")


def pytest_sessionstart(session):
    """The xdist controller builds the native targets (planner, twin) while its workers
    start on the longest modules, which need none; the workers' tests then find the
    build done (native.build's lock) instead of waiting on it in turn. In a fresh clone
    (CI) that first build is the documented command itself, `./build.sh --host-only`
    (docs/packaging.md), run as printed; tests/test_doc_commands.py checks its record."""
    config = session.config
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") \
            and not native_build.missing():
        threading.Thread(target=_build_native, daemon=True).start()


def _build_native():
    from flash_cann.ascend import native

    try:
        if native_build.documented_build_applies():
            native_build.run_documented_build()
        native.build()
    except native.NativeBuildError:
        pass  # the tests that need the build report its error


def make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype,
             layout="BNSD", device="cpu", generator=None):
    """Random q, k, v in ``layout`` (BNSD, BSND or BSH)."""
    def shape(heads, seqlen):
        if layout == "BNSD":
            return (batch, heads, seqlen, head_dim)
        if layout == "BSND":
            return (batch, seqlen, heads, head_dim)
        return (batch, seqlen, heads * head_dim)  # BSH

    def rand(*s):
        return torch.randn(s, generator=generator, dtype=torch.float32).to(device, dtype)

    return (rand(*shape(heads_q, seqlen_q)), rand(*shape(heads_kv, seqlen_k)),
            rand(*shape(heads_kv, seqlen_k)))


def random_key_padding_mask(batch, seqlen_k, generator=None, device="cpu"):
    """Keep a random prefix of keys per sequence (at least one), plus random holes."""
    lengths = torch.randint(1, seqlen_k + 1, (batch,), generator=generator)
    mask = torch.arange(seqlen_k).unsqueeze(0) < lengths.unsqueeze(1)
    holes = torch.rand(batch, seqlen_k, generator=generator) < 0.1
    return (mask & ~holes).to(device)


@pytest.fixture
def gen(request):
    """A generator seeded from the test's id: fresh inputs per case, reproducible runs."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
