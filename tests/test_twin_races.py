"""The mutation table of the forward kernel's synchronisation (issue 10): every sync call
site the kernel executes -- PipeBarrier, SetFlag/WaitFlag, the queue hand-offs (EnQue/
DeQue, FreeTensor/AllocTensor), CrossCoreSetFlag/WaitFlag, SyncAll -- has its
happens-before edge switched off in turn inside the twin (no kernel edit, no rebuild),
and the twin's race detector must then stop the kernel with a race or a deadlock.

A queue hand-off that another hand-off between the same pipes, issued later, already
orders counts as "covered" only when dropping both makes the detector report a race on
the buffer of the queue itself. PipeBarriers that no mutation catches are listed in
GUARDS_NOTHING (reported to the lead; this file asserts they still guard nothing, so the
list cannot go stale). The table is docs/twin.md's "Mutation table", regenerated with
FLASH_CANN_REGENERATE_DOCS=1.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from flash_cann.backends.twin import launcher as twin
from flash_cann.contract.variant import PLAIN

from conftest import make_qkv, random_key_padding_mask
from native_build import built
from flash_cann.contract.variant import Variant

DOC = Path(__file__).resolve().parents[1] / "docs" / "twin.md"
BEGIN, END = "<!-- mutation table: begin -->", "<!-- mutation table: end -->"

# Every kind whose removal must be caught (or, for hand-offs, shown covered).
ASSERTED = {"PipeBarrier", "SetFlag", "WaitFlag", "EnQue", "DeQue", "CrossCoreSetFlag",
            "CrossCoreWaitFlag", "SyncAll"}
HAND_OFFS = {"EnQue", "DeQue"}

# PipeBarriers that order nothing a later barrier does not already order (reported to the
# lead; the kernel is K's to change). None in the pipelined kernel.
GUARDS_NOTHING: dict[str, str] = {}

# Event-ring bookkeeping with no access on one side: the SetFlag that marks a ring's
# buffers free before their first fill, and the WaitFlag that takes the last "free" at the
# end of the kernel. They carry no happens-before edge a mutation could remove; without
# them the first fill would wait forever and the kernel would end with events set.
BALANCES_EVENTS = {
    "flash_attention_cube.h:63": "EventRing::Init marks every buffer free (nothing precedes it)",
    "flash_attention_cube.h:94": "EventRing::Drain takes the last 'free' of every buffer "
                                 "(nothing follows it)",
}


def _problems():
    """Small shapes on ONE AI core, so that it runs several query tiles and several key
    blocks each and reuses every buffer: causal diagonal, key padding mask, key and query
    tails, head_dim 17 (zero-padded fractals), two rounds of keys (700 > 512), query tiles
    that see no key (causal, seqlen_q > seqlen_k); and the FEATURES kernel with every
    feature on: a two-sided window whose left edge skips the first sub-blocks of a round
    (KeyRound.firstSub) and whole rounds, ALiBi, softcap, dropout and sinks, with and
    without causal; and the 256-row tile in two
    cube row passes at head_dim 128 (causal, key mask)."""
    g = torch.Generator().manual_seed(7)
    problems = []
    for sq, sk, d, causal, masked in [(100, 150, 64, True, True), (150, 260, 17, False, False),
                                      (40, 700, 32, True, False), (300, 100, 32, True, True)]:
        q, k, v = make_qkv(1, 4, 2, sq, sk, d, torch.float16, "BNSD", generator=g)
        mask = random_key_padding_mask(1, sk, g) if masked else None
        problems.append((q, k, v, mask, causal, PLAIN))
    # The second without ALiBi: softcap's result then goes straight to the key bias.
    for sq, sk, causal, window, alibi in [(200, 1100, False, (300, 40), True),
                                          (300, 300, True, (64, -1), False)]:
        q, k, v = make_qkv(1, 4, 2, sq, sk, 32, torch.float16, "BNSD", generator=g)
        mask = random_key_padding_mask(1, sk, g)
        variant = Variant(window_left=window[0], window_right=window[1], softcap=8.0,
                              alibi_slopes=torch.rand(1, 4, generator=g) if alibi else None,
                              dropout_p=0.3, rng_state=torch.tensor([2**40 + 5, 11]),
                              sinks=torch.randn(4, generator=g))
        problems.append((q, k, v, mask, causal, variant))
    # The 256-row tile in two cube row passes (forced at head_dim 128): a tile of two passes
    # and one of one, two rounds each, so the round-sized V ring and the L0A ring shared by
    # Q and P are reused.
    q, k, v = make_qkv(1, 2, 1, 300, 700, 128, torch.float16, "BNSD", generator=g)
    problems.append((q, k, v, random_key_padding_mask(1, 700, g), True, PLAIN, 1))
    return problems


def _run(problem) -> str:
    q, k, v, mask, causal, variant, *cube_passes = problem
    try:
        with twin.cube_passes(cube_passes[0] if cube_passes else 0):
            twin.forward(q, k, v, mask, scale=0.1, causal=causal, layout="BNSD", variant=variant,
                         ai_cores=1)
    except twin.TwinViolation as violation:
        return str(violation).removeprefix("flash_cann twin: ")
    return ""


def _verdict(message: str) -> str:
    if " race: " in message:
        return "race"
    return "deadlock" if " deadlock: " in message else ("other: " + message if message else "")


def _short(message: str) -> str:
    """'file:line: race: PIPE_X ...' -> 'race at file:line (PIPE_X ...) vs file:line'."""
    match = re.search(r"([\w.]+:\d+): (?:\[R\d+\] )?race: (\w+ \w+) of (\w+)[^(]*(?:\(the buffer[^)]*\) )?"
                      r"\([^)]*\) conflicts with the (\w+ \w+) at \S*?([\w.]+:\d+)", message)
    if match:
        site, mine, memory, other, other_site = match.groups()
        return f"{mine} {site} / {other} {other_site} on {memory}"
    return message.split(": ", 1)[-1][:80]


@pytest.fixture(scope="module")
def table():
    built("twin/libflash_cann_twin.so")
    problems = _problems()
    executed: dict[str, tuple[str, str | None, list[int]]] = {}  # site -> kind, queue, problems
    for index, problem in enumerate(problems):
        assert _run(problem) == "", "the unmutated kernel must be race-free"
        for line in twin.sync_sites():
            kind, site, *queue = line.split()
            entry = executed.setdefault(site, (kind, queue[1] if queue else None, []))
            entry[2].append(index)
    rows = []
    for site, (kind, queue, runs) in sorted(executed.items()):
        if "twin" in site:  # the twin's own rule tests are no kernel
            continue
        message = ""
        with twin.dropped_sync(site):
            for index in runs:
                message = _run(problems[index])
                if message:
                    break
        verdict, detail = _verdict(message), _short(message) if message else ""
        if not verdict and kind in HAND_OFFS and queue:
            verdict, detail = _covered(site, kind, queue, executed, problems)
        rows.append((kind, site, verdict or "NOT CAUGHT", detail))
    return rows


def _covered(site, kind, queue, executed, problems):
    """A hand-off whose removal another hand-off masks: find the one that, dropped with
    it, exposes a race on this queue's own buffer."""
    for other, (other_kind, _, runs) in sorted(executed.items()):
        if other == site or other_kind != kind:
            continue
        with twin.dropped_sync(f"{site},{other}"):
            for index in runs:
                message = _run(problems[index])
                if " race: " in message and f"{queue})" in _buffer_of(message):
                    return "covered", f"by {kind} {other}: {_short(message)}"
    return "", ""


def _buffer_of(message: str) -> str:
    match = re.search(r"\(the buffer initialised at \S*?([\w.]+:\d+\))", message)
    return match.group(1) if match else ""


def _markdown(rows) -> str:
    lines = ["| sync site | kind | with its edge removed | first conflict (pipe access site / other) |",
             "|---|---|---|---|"]
    for kind, site, verdict, detail in rows:
        if verdict == "NOT CAUGHT" and site in GUARDS_NOTHING:
            verdict = "guards nothing: " + GUARDS_NOTHING[site]
        elif verdict == "NOT CAUGHT" and site in BALANCES_EVENTS:
            verdict = "no edge (event bookkeeping): " + BALANCES_EVENTS[site]
        lines.append(f"| `{site}` | {kind} | {verdict} | {detail} |")
    return "\n".join(lines)


def _doc_markdown(rows) -> str:
    """docs/twin.md's table: the sites counted per file, kind and verdict. Sites are
    named by source line in the twin (and in the printed per-site table above); the doc
    cites no line numbers, so it changes only when a verdict or a site count does."""
    counts: dict[tuple[str, str, str], int] = {}
    for line in _markdown(rows).splitlines()[2:]:
        site, kind, verdict = (cell.strip().strip("`") for cell in line.split(" | ")[:3])
        key = (site.lstrip("| `").rsplit(":", 1)[0], kind, verdict)
        counts[key] = counts.get(key, 0) + 1
    lines = ["| file | kind | with its edge removed | sites |", "|---|---|---|---:|"]
    lines += [f"| `{f}` | {k} | {v} | {n} |" for (f, k, v), n in sorted(counts.items())]
    return "\n".join(lines)


def test_every_sync_site_is_caught(table):
    print("\n" + _markdown(table))
    missed = [f"{kind} {site}" for kind, site, verdict, _ in table
              if kind in ASSERTED and verdict == "NOT CAUGHT"
              and site not in GUARDS_NOTHING and site not in BALANCES_EVENTS]
    assert not missed, f"sync sites whose removal no run catches: {missed}"
    stale = [site for site in {**GUARDS_NOTHING, **BALANCES_EVENTS}
             if not any(s == site and v == "NOT CAUGHT" for _, s, v, _ in table)]
    assert not stale, f"GUARDS_NOTHING/BALANCES_EVENTS list sites that are caught or gone: {stale}"
    assert not [row for row in table if row[2].startswith("other")], table


def test_the_table_in_the_docs_is_current(table):
    text = DOC.read_text()
    begin, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    current = "\n" + _doc_markdown(table) + "\n"
    if os.environ.get("FLASH_CANN_REGENERATE_DOCS") == "1":
        DOC.write_text(text[:begin] + current + text[end:])
        return
    assert text[begin:end] == current, (
        "docs/twin.md's mutation table is stale: FLASH_CANN_REGENERATE_DOCS=1 pytest "
        "tests/test_twin_races.py")
