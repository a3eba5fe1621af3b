"""docs/npu.md's statements about which backend runs which feature, checked against the op
spec (flash_cann.contract.spec: each backend's `features`), so the page cannot say a feature
runs on some backends "only" or that the npu backend does not list it yet when the spec
gives it to npu. The statement forms recognised (prose is re-flowed, so whitespace and line
breaks do not matter):

* "<feature> runs on the `a`, `b` and `c` backends[ only]": exactly the backends whose
  features list it (all of them, when "only" is absent);
* "the npu backend lists `f` [and|/] `g`": npu lists each;
* "until (the npu backend|it) lists `f`", "as soon as ... lists `f`", "does not list `f`":
  a future tense, so npu must NOT list f (else the statement is stale).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flash_cann.contract.spec import load

DOC = Path(__file__).resolve().parents[1] / "docs" / "npu.md"
NAMES = {"the kv cache": "kvcache", "kv-cache decoding": "kvcache", "packed sequences": "varlen",
         "tnd": "varlen", "the window": "window", "softcap": "softcap", "alibi": "alibi",
         "dropout": "dropout", "sinks": "sinks"}
BACKTICKED = r"`\w+`(?:(?:,| and| /|,? or) `\w+`)*"
RUNS_ON = re.compile(rf"(?i)\b({'|'.join(map(re.escape, NAMES))}) runs on the ({BACKTICKED})"
                     r" backends?( only)?")
LISTS = re.compile(rf"(?i)\bthe npu backend lists ({BACKTICKED})")
NOT_YET = re.compile(rf"(?i)\b(?:until|as soon as) (?:the npu backend|it) lists ({BACKTICKED})"
                     rf"|\bdoes not list ({BACKTICKED})")


def _ticked(text: str) -> list[str]:
    return re.findall(r"`(\w+)`", text)


def statements(text: str) -> list[tuple[str, str, tuple]]:
    """(kind, the matched text, its arguments) for each recognised statement."""
    flat = re.sub(r"\s+", " ", text)
    found = []
    for m in RUNS_ON.finditer(flat):
        found.append(("runs_on", m.group(0), (NAMES[m.group(1).lower()], _ticked(m.group(2)))))
    for m in LISTS.finditer(flat):
        found.append(("lists", m.group(0), tuple(_ticked(m.group(1)))))
    for m in NOT_YET.finditer(flat):
        found.append(("not_yet", m.group(0), tuple(_ticked(m.group(1) or m.group(2)))))
    return found


def problems(text: str, spec=None) -> list[str]:
    spec = spec or load()
    having = {f: sorted(n for n, b in spec.backends.items() if f in b.features)
              for f in {f for b in spec.backends.values() for f in b.features}}
    npu = set(spec.backends["npu"].features)
    wrong = []
    for kind, said, args in statements(text):
        if kind == "runs_on":
            feature, backends = args
            unknown = [b for b in backends if b not in spec.backends]
            if unknown:
                wrong.append(f"{said!r}: no backend {unknown} in the spec")
            elif sorted(backends) != having.get(feature, []):  # with "only" or without
                wrong.append(f"{said!r}: the spec gives {feature} to {having.get(feature)}")
        elif kind == "lists":
            wrong += [f"{said!r}: npu does not list {f}" for f in args if f not in npu]
        else:
            wrong += [f"{said!r}: stale, npu lists {f}" for f in args if f in npu]
    return wrong


def test_docs_npu_md_says_what_the_spec_says_about_backends():
    text = DOC.read_text()
    assert statements(text), "no backend statement recognised in docs/npu.md"
    assert problems(text) == []


@pytest.mark.parametrize("planted", [
    "The KV cache runs on the `cpu`\nand `triton` backends only so far.",
    "Packed sequences run as soon as the npu backend lists `varlen` / `kvcache`.",
    "TND and decode skip until it lists `varlen` / `kvcache`;",
    "The KV cache runs on the `cpu`, `twin` and `triton` backends.",
    "Dropout runs on the `cpu`, `twin`, `triton`, `npu` and `gpu` backends.",
])
def test_a_stale_statement_is_caught(planted):
    assert problems(planted), planted


def test_true_statements_pass():
    assert problems("The KV cache runs on the `cpu`,\n`twin`, `triton` and `npu` backends: ...; "
                    "since the npu backend lists `varlen` and `kvcache`;") == []
