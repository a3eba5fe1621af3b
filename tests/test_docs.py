"""The docs are checked against the code: the README's feature table is the one
scripts/gen_docs.py generates from the op spec, every committed result file is indexed
in benchmarks/RESULTS.md, no committed doc cites source line numbers (they move with
every edit; docs/design-log.md, the history, is exempt), and the README stays a
one-page entry point."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"

# `name.h:123`, `name.py:12-40`, "line 123", "lines 10-20".
LINE_NUMBER = re.compile(
    r"\b[\w./-]+\.(?:h|hpp|c|cc|cpp|py|yaml|sh|cmake|txt|toml)\b:\d+|\b[Ll]ines? \d+")


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_feature_table_is_generated_from_the_spec():
    gen = _gen_docs()
    text = README.read_text(encoding="utf-8")
    assert gen.render(text) == text, (
        "README.md's feature table differs from the spec: run python scripts/gen_docs.py")


def test_the_feature_table_follows_the_spec():
    """A backend losing a feature in the spec changes its cell (the generator reads the
    spec, not a copy of the table)."""
    gen = _gen_docs()
    from flash_cann.contract import spec as spec_mod
    import dataclasses
    spec = spec_mod.load()
    twin = spec.backends["twin"]
    narrowed = dataclasses.replace(twin, features=tuple(f for f in twin.features
                                                       if f != "softcap"))
    changed = dataclasses.replace(spec, backends={**spec.backends, "twin": narrowed})
    rows = {line.split(" | ")[0]: line for line in gen.table(changed).splitlines()}
    softcap = rows["| softcap (Gemma 2)"].split(" | ")
    heads = gen.table(changed).splitlines()[0].split(" | ")
    twin_col = next(i for i, h in enumerate(heads) if h.startswith("`twin`"))
    assert softcap[twin_col] == "no"
    assert gen.table(changed) != gen.table(spec)


def test_every_result_file_is_indexed():
    text = RESULTS.read_text(encoding="utf-8")
    files = sorted(p.name for p in (ROOT / "benchmarks" / "results").iterdir() if p.is_file())
    missing = [name for name in files if f"[`{name}`](results/{name})" not in text]
    assert not missing, f"benchmarks/RESULTS.md does not index: {missing}"


def _docs():
    yield README
    yield RESULTS
    yield ROOT / "benchmarks" / "NOTES.md"
    for path in sorted((ROOT / "docs").glob("*.md")):
        if path.name != "design-log.md":
            yield path


@pytest.mark.parametrize("path", list(_docs()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_source_line_numbers_in_the_docs(path):
    hits = [f"{n}: {m.group(0)}" for n, line in enumerate(path.read_text(encoding="utf-8")
                                                         .splitlines(), 1)
            for m in LINE_NUMBER.finditer(line)]
    assert not hits, f"{path.name} cites source line numbers (they go stale): {hits[:10]}"


def test_the_pattern_finds_line_numbers():
    for text in ("see `flash_attention_vector.h:212`", "kernel_tpipe.h:205-212",
                 "at line 40 of", "lines 10-20"):
        assert LINE_NUMBER.search(text), text
    for text in ("head_dim 128", "ratio 1:2", "https://example.org:8080/x", "1,440 lines"):
        assert not LINE_NUMBER.search(text), text


def test_the_readme_is_one_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; the limit is 250 (details go to docs/)"


@pytest.mark.parametrize("path", list(_docs()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_mutant_count_in_the_docs(path):
    """scripts/mutants.yaml grows with every issue: a count quoted in a doc goes stale."""
    hits = re.findall(r"\b\d[\d,]* (?:\S+ )?mutants\b", path.read_text(encoding="utf-8"))
    assert not hits, f"{path.name} quotes a mutant count (it goes stale): {hits}"
