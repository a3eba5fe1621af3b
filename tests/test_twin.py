"""The Ascend C forward kernel (op_kernel/) run on the CPU twin of the Ascend C API
(twin/): the twin's rule checks fire, and the kernel matches the float64 oracle
across dtypes, masks, GQA, head dims, tails and core counts.

What this verifies and what it cannot: docs/twin.md and docs/kernel-backward.md ("What the twin proves")."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import torch

import flash_cann
from flash_cann.tools import accuracy
from flash_cann.ascend import planner
from flash_cann.backends.twin import launcher as twin
from flash_cann.contract import layout as layouts
from flash_cann.contract.variant import Variant

from conftest import make_qkv, random_key_padding_mask
from native_build import built, needs, run


@pytest.fixture(scope="module", autouse=True)
def twin_library():
    built("twin/libflash_cann_twin.so")


def test_rule_checks_fire():
    """tests/twin/twin_rule_tests.cpp: each hardware rule, broken once, is caught."""
    result = run("twin_tests/twin_rule_tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"(\d+) of \1 twin rule tests passed", result.stdout), result.stdout


ROOT = Path(__file__).resolve().parents[1]


@needs("g++")
def test_every_backward_member_compiles():
    """tests/twin/instantiate_backward.cpp explicitly instantiates every backward cube and
    vector class, which compiles each member -- also one no tiling key calls for that dtype
    (the kernel's own build compiles only the members it calls). A compile of its own, not
    part of the build, so that such a member failing is this test's failure."""
    result = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                             f"-I{ROOT / 'twin/include'}", f"-I{ROOT / 'op_kernel'}",
                             str(ROOT / "tests/twin/instantiate_backward.cpp")],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-6000:]


def _twin_rules() -> dict[str, str]:
    """Every Require/Fail call in twin/ -> its rule id ("[R07] " in its message)."""
    rules, missing = {}, []
    for path in sorted((ROOT / "twin").rglob("*")):
        if path.suffix not in (".h", ".cpp"):
            continue
        text = path.read_text()
        for call in re.finditer(r"(?<![\w:])(?:twin::)?(?:Require|Fail)\((?!site, parts)", text):
            if re.search(r"void\s*$", text[:call.start()]):
                continue  # the definitions in core.h
            body = text[call.end():text.index(";", call.end())]
            where = f"{path.relative_to(ROOT)}:{text[:call.start()].count(chr(10)) + 1}"
            found = re.search(r'"\[(R\d+)\] "', body)
            if found is None:
                missing.append(where)
            else:
                assert found.group(1) not in rules, f"rule id {found.group(1)} used twice: {where}"
                rules[found.group(1)] = where
    assert not missing, f"twin rules without an id (add \"[Rnn] \" to the message): {missing}"
    return rules


def test_every_twin_rule_has_a_negative_test():
    """Issue 16: a rule (Require/Fail) of twin/ without a test in twin_rule_tests.cpp that
    makes it fire fails here."""
    rules = _twin_rules()
    tested = set(re.findall(r'"(R\d+)"', (ROOT / "tests/twin/twin_rule_tests.cpp").read_text()))
    untested = {rule: where for rule, where in rules.items() if rule not in tested}
    assert not untested, f"twin rules no test makes fire: {untested}"
    assert not tested - set(rules), f"tests name rules that do not exist: {tested - set(rules)}"


def _planned_bytes(q, k, mask, causal, layout, scale):
    """The planner's per-level buffer figures for the problem (plan["levels"])."""
    b, hq, sq, d = layouts.sizes(q, layout)
    hk, sk = layouts.sizes(k, layout)[1:3]
    plan = planner.plan("Ascend910B2", b, hq, sq, d, heads_kv=hk, seqlen_k=sk,
                        dtype=str(q.dtype).removeprefix("torch."), layout=layout, causal=causal,
                        has_mask=mask is not None, scale=scale)
    return {level["level"]: level["used"] for level in plan["levels"]}


def _check(q, k, v, mask, causal, layout, cores=None):
    """The twin's result matches the oracle, and the bytes the kernel allocated per
    memory level (every InitBuffer, measured by the twin) are the planner's figures."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    allocated = {}
    results = accuracy.check_against_oracle(
        lambda q_, k_, v_: twin.forward(q_, k_, v_, mask, scale=scale, causal=causal,
                                        layout=layout, ai_cores=cores, allocated=allocated),
        q, k, v, scale=scale, causal=causal, layout=layout, key_padding_mask=mask,
        backward="none")
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))
    assert allocated == _planned_bytes(q, k, mask, causal, layout, scale)


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_matches_oracle(dtype, causal, masked, heads, gen):
    q, k, v = make_qkv(2, *heads, 100, 150, 64, dtype, "BSND", generator=gen)
    mask = random_key_padding_mask(2, 150, gen) if masked else None
    _check(q, k, v, mask, causal, "BSND")


@pytest.mark.parametrize("head_dim", [64, 128, 80, 17, 256])
def test_head_dims(head_dim, gen):
    """Including head dims that are not powers of two (80, and 17, padded to 32)."""
    q, k, v = make_qkv(1, 4, 2, 70, 90, head_dim, torch.float16, "BNSD", generator=gen)
    _check(q, k, v, random_key_padding_mask(1, 90, gen), True, "BNSD")


@pytest.mark.parametrize("seqlens", [(1, 1), (17, 17), (1000, 1000), (17, 1000), (1000, 17),
                                     (1, 1000), (17, 63)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_sequence_tails(seqlens, gen):
    """sk63: a key block one key short of the 64 keys the planner picks here, so the cube
    zero-fills a single row of the last 16-row fractal of K and V in L1 (a stale V row
    there turns P.V into NaN, since P is 0 but the twin's L1 starts as NaN)."""
    if seqlens == (17, 63):
        plan = planner.plan("Ascend910B2", 1, 4, 17, 64, heads_kv=2, seqlen_k=63, dtype="bfloat16",
                            layout="BNSD", causal=True, has_mask=True, scale=0.125)
        assert plan["tiling"]["block_k"] == 64, "sk63 no longer ends one key short of a block"
    q, k, v = make_qkv(1, 4, 2, *seqlens, 64, torch.bfloat16, "BNSD", generator=gen)
    _check(q, k, v, random_key_padding_mask(1, seqlens[1], gen), True, "BNSD")


@pytest.mark.parametrize("cores", [1, 3, 7, 24, 48])
def test_core_counts(cores, gen):
    """Splits over core counts that do and do not divide the work."""
    q, k, v = make_qkv(3, 5, 5, 333, 333, 64, torch.float16, "BNSD", generator=gen)
    _check(q, k, v, None, True, "BNSD", cores)


def _tiling(sq, sk, d, causal, masked, cores, heads=(2, 1)):
    from flash_cann.ascend import planner
    return planner.plan("Ascend910B2", 1, heads[0], sq, d, heads_kv=heads[1], seqlen_k=sk,
                        causal=causal, has_mask=masked, aic_cores=cores)["tiling"]


@pytest.mark.parametrize("causal,masked,dtype", [(False, False, torch.float16),
                                                 (True, True, torch.bfloat16)],
                         ids=["full-fp16", "causal-mask-bf16"])
def test_several_rounds_and_stack_tails(causal, masked, dtype, gen):
    """Three rounds per tile (512 + 512 + 276 keys: a last round of 5 sub-blocks, the
    last one partial), 4 tiles on one core, so every ring slot and the rescale-factor
    ring are reused across rounds and tiles."""
    sq, sk, d = 200, 1300, 64
    t = _tiling(sq, sk, d, causal, masked, 1)
    keys_per_round = t["block_k"] * t["key_stack"]
    assert sk > 2 * keys_per_round and sk % keys_per_round % t["block_k"] != 0
    assert t["used_cores"] == 1 and 2 * sq > 2 * t["block_q"]
    q, k, v = make_qkv(1, 2, 1, sq, sk, d, dtype, "BNSD", generator=gen)
    mask = random_key_padding_mask(1, sk, gen) if masked else None
    _check(q, k, v, mask, causal, "BNSD", cores=1)


@pytest.mark.parametrize("masked,dtype", [(False, torch.float16), (True, torch.bfloat16)],
                         ids=["fp16", "mask-bf16"])
def test_1024_key_rounds(masked, dtype, gen):
    """Long non-causal key sequences run 1024-key rounds, whose row reductions fold the
    block results past the 64th: four full rounds and a last one of 700 keys (width 704,
    88 blocks per row), four tiles on one core (two heads of 128 + 2 rows)."""
    sq, sk, d = 130, 4796, 128
    t = _tiling(sq, sk, d, False, masked, 1)
    assert t["block_k"] * t["key_stack"] == 1024 and t["used_cores"] == 1
    q, k, v = make_qkv(1, 2, 1, sq, sk, d, dtype, "BNSD", generator=gen)
    mask = random_key_padding_mask(1, sk, gen) if masked else None
    _check(q, k, v, mask, False, "BNSD", cores=1)


@pytest.mark.parametrize("causal,masked,dtype", [(False, False, torch.float16),
                                                 (True, True, torch.bfloat16)],
                         ids=["fp16", "causal-mask-bf16"])
def test_160_row_tiles_for_long_keys(causal, masked, dtype, gen):
    """Key sequences >= 16k at head_dim 128 run 160-row tiles with single L0A/L0C buffers
    (80 rows per vector core): a full tile and a 10-row one on one core, 17 rounds each."""
    sq, sk, d = 170, 16400, 128
    t = _tiling(sq, sk, d, causal, masked, 1, heads=(1, 1))
    assert t["block_q"] == 160 and t["l0a_buffers"] == 1 and t["l0c_buffers"] == 1
    q, k, v = make_qkv(1, 1, 1, sq, sk, d, dtype, "BSND", generator=gen)
    mask = random_key_padding_mask(1, sk, gen) if masked else None
    _check(q, k, v, mask, causal, "BSND", cores=1)


def test_round_stream_crosses_tiles(gen):
    """The cube's S runs two rounds ahead of its P.V over the core's whole tile stream:
    one-round tiles (a short key sequence) on one core, so S is two tiles ahead of P.V and
    every entry of the cube's tile ring is live; bottom-right causal with seqlen_q >
    seqlen_k puts keyless tiles (skipped by the cube) between them."""
    sq, sk, d = 300, 100, 32
    t = _tiling(sq, sk, d, True, False, 1, heads=(3, 1))
    assert t["block_k"] * t["key_stack"] >= sk and t["used_cores"] == 1 and t["block_q"] < sq - sk
    q, k, v = make_qkv(1, 3, 1, sq, sk, d, torch.float16, "BNSD", generator=gen)
    _check(q, k, v, None, True, "BNSD", cores=1)


def test_256_row_tiles(gen):
    """Long query sequences with head_dim <= 64 run 256-row tiles (128 rows per vector
    core), with a partial last tile and rows past the diagonal of a several-round tile."""
    sq, sk, d = 1100, 700, 48
    t = _tiling(sq, sk, d, True, True, 2)
    assert t["block_q"] == 256 and t["used_cores"] == 2
    q, k, v = make_qkv(1, 2, 1, sq, sk, d, torch.float16, "BSND", generator=gen)
    _check(q, k, v, random_key_padding_mask(1, sk, gen), True, "BSND", cores=2)


def _tnd(lens_q, lens_k, heads, d, dtype, gen):
    """Packed (TND) q, k, v and the cu_seqlens of sequences of the given lengths."""
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
          for lens in (lens_q, lens_k)]
    q, k, v = (torch.randn(int(c[-1]), h, d, generator=gen).to(dtype)
               for c, h in ((cu[0], heads[0]), (cu[1], heads[1]), (cu[1], heads[1])))
    return q, k, v, Variant(cu_seqlens_q=cu[0], cu_seqlens_k=cu[1], max_seqlen_q=max(lens_q),
                            max_seqlen_k=max(lens_k))


# (layout, heads, seqlens, causal, masked, dtype, features, cores): head_dim 128, forced
# into 256-row tiles in two 128-row cube passes at small shapes.
PASS_CASES = {
    "mask-fp16": ("BNSD", (2, 2), (300, 700), False, True, torch.float16, {}, 1),
    "causal-gqa-bf16": ("BSND", (4, 2), (300, 300), True, False, torch.bfloat16, {}, 2),
    "window-alibi": ("BNSD", (2, 1), (290, 600), False, False, torch.float16,
                     dict(window_left=100, window_right=20, alibi=True), 1),
    "tnd-causal": ("TND", (2, 1), ((260, 40, 0), (300, 100, 5)), True, False, torch.float16, {}, 2),
}


@pytest.mark.parametrize("case", list(PASS_CASES))
def test_256_row_tiles_in_cube_passes(case, gen):
    """The 256-row tile at head_dim 128 in two 128-row cube passes (TilingData cubeRows;
    docs/kernel.md "The cube in row passes"), forced at small shapes: a 256-row tile of two
    passes beside short tiles of one, two rounds with a partial last sub-block, the S and O
    slots' row halves, V of a round kept in L1 for both passes, race detector on. The result
    matches the oracle, is bit for bit the plan of 128-row tiles (the rows' arithmetic does
    not depend on how they are cut into tiles), and the bytes allocated are the plan's."""
    layout, heads, seqlens, causal, masked, dtype, features, cores = PASS_CASES[case]
    d = 128
    features = dict(features)
    alibi = features.pop("alibi", False)
    if layout == "TND":
        q, k, v, variant = _tnd(*seqlens, heads, d, dtype, gen)
        batch, (sq, sk) = len(seqlens[0]), (max(seqlens[0]), max(seqlens[1]))
    else:
        batch, (sq, sk) = 1, seqlens
        q, k, v = make_qkv(batch, *heads, sq, sk, d, dtype, layout, generator=gen)
        slopes = torch.rand(heads[0], generator=gen).expand(batch, heads[0]) if alibi else None
        variant = Variant(alibi_slopes=slopes, **features)
    mask = random_key_padding_mask(batch, sk, gen) if masked else None
    scale = 1.0 / math.sqrt(d)
    tokens = (q.shape[0], k.shape[0]) if layout == "TND" else (0, 0)
    plan = planner.plan("Ascend910B2", batch, heads[0], sq, d, heads_kv=heads[1], seqlen_k=sk,
                        dtype=str(dtype).removeprefix("torch."), layout=layout, causal=causal,
                        has_mask=masked, scale=scale, aic_cores=cores,
                        features=planner.variant(window=(variant.window_left, variant.window_right),
                                                 alibi="head" if alibi else None, tokens=tokens,
                                                 cube_passes=1))
    assert (plan["tiling"]["block_q"], plan["tiling"]["cube_rows"]) == (256, 128)

    def run(mode, allocated=None):
        with twin.cube_passes(mode):
            return twin.forward(q, k, v, mask, scale=scale, causal=causal, layout=layout,
                                variant=variant, ai_cores=cores, allocated=allocated)

    allocated = {}
    passes = run(1, allocated)
    assert allocated == {level["level"]: level["used"] for level in plan["levels"]}
    whole = run(-1)
    assert all(torch.equal(a, b) for a, b in zip(passes, whole))
    results = accuracy.check_against_oracle(
        lambda *_: passes, q, k, v, scale=scale, causal=causal, layout=layout,
        key_padding_mask=mask, backward="none", variant=variant)
    assert all(r.ok for r in results), "\n" + "\n".join(map(str, results))


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


def test_planner_refusal_is_reported(gen):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float16, generator=gen)
    with pytest.raises(twin.TwinViolation, match="planner refused: heads_q"):
        twin.forward(q, k[:, :1].expand(1, 3, 8, 16).contiguous(), v[:, :1].expand(1, 3, 8, 16)
                     .contiguous(), None, scale=0.1, causal=False, layout="BNSD")


def test_demo_shows_the_twin():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "flash_cann", "demo", "--backend", "twin"],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "backend 'twin'" in result.stdout and "accuracy: PASS" in result.stdout
