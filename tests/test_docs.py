"""The docs are checked against the code: every statement scripts/gen_docs.py generates
from the op spec (the README's feature table, the dtypes, head_dim and which backends
have a feature, wherever a doc states them) is current, every committed result file is indexed
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


def test_every_generated_statement_is_current():
    gen = _gen_docs()
    assert gen.stale() == [], (
        "generated statements differ from the spec: run python scripts/gen_docs.py")


def _narrowed():
    """The spec with less in it: the npu backend without the KV cache, triton on NPUs
    without packed sequences, cpu without float64, head_dim up to 128."""
    import dataclasses
    from flash_cann.contract import spec as spec_mod
    spec = spec_mod.load()
    b = dict(spec.backends)
    b["npu"] = dataclasses.replace(b["npu"], features=tuple(
        f for f in b["npu"].features if f != "kvcache"))
    triton = b["triton"]
    b["triton"] = dataclasses.replace(triton, also_on_features={"npu": tuple(
        f for f in triton.features_on("npu") if f != "varlen")})
    b["cpu"] = dataclasses.replace(b["cpu"], dtypes=tuple(
        d for d in b["cpu"].dtypes if d != "float64"))
    return dataclasses.replace(spec, backends=b, head_dim_max=128)


def test_every_generated_statement_follows_the_spec():
    """Each doc's generated pieces change with the spec (the generators read it, no
    copy): a feature, a dtype or a limit changing makes every doc that states it stale."""
    gen = _gen_docs()
    assert set(gen.stale(_narrowed())) >= {
        "README.md", "docs/api.md", "docs/npu.md", "docs/migration.md", "docs/distributed.md"}
    spec = _narrowed()
    assert gen.support(spec, "kvcache") == (
        "`cpu`, `twin` and `triton` only (not `npu`)")
    assert gen.support(spec, "varlen") == (
        "`cpu`, `twin`, `triton` on CUDA and `npu` only (not `triton` on NPUs)")
    assert "KV cache" not in gen.features(spec, "npu")
    assert gen.dtypes(spec) == ("float16 and bfloat16 on every backend "
                                "(also float32 on `cpu`)")
    assert gen.head_dim(spec) == "1-128"


@pytest.mark.parametrize("text, says", [
    ("a <!-- gen:nonesuch -->x<!-- /gen -->", "no generator 'nonesuch'"),
    ("a <!-- gen:support nofeature -->x<!-- /gen -->", "no feature 'nofeature'"),
    ("a <!-- gen:features nobackend -->x<!-- /gen -->", "no backend 'nobackend'"),
    ("a <!-- gen:dtypes -->x", "without its"),
    ("a\n<!-- gen:dtypes -->x<!-- /gen --> b", "starts a line"),
    ("a <!-- gen:feature-table -->x<!-- /gen -->", "several lines"),
])
def test_a_malformed_marker_is_named(text, says):
    gen = _gen_docs()
    with pytest.raises(SystemExit, match=says):
        gen.render(text)


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


# A count of mutants, tests, cases or instantiations: "92 mutants", "1,077 GPU tests",
# "Six mutants", "one of 24 instantiations", "all 85 sites". 0 is a rule ("to 0 survivors"),
# not a count.
NUMBER = (r"(?:[1-9][\d,]*|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
          r"thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|"
          r"forty|fifty|hundred)")
COUNT = re.compile(rf"(?i)\b{NUMBER}\**(?: [\w/+-]+){{0,2}} (?:mutants|tests|cases|"
                   r"instantiations|survivors|sync(?: call)? sites)\b|"
                   rf"\ball {NUMBER} (?:sites|instantiations)\b")


@pytest.mark.parametrize("path", list(_docs()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_count_in_the_docs(path):
    """Mutants, tests, cases and kernel instantiations grow with every issue: a count
    quoted in a doc goes stale (docs/design-log.md, the history, is exempt)."""
    text = re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))
    hits = [m.group(0) for m in COUNT.finditer(text)]
    assert not hits, f"{path.name} quotes counts (they go stale; say what, not how many): {hits}"


def test_the_count_pattern_finds_counts():
    for text in ("49 mutants", "Six mutants (`scripts/mutants.yaml`)", "1,077 GPU tests",
                 "(26 cases, about 13 s)", "one of 24 instantiations", "all 16 instantiations",
                 "the 74 sync call sites", "all 85 sites", "18 tests;", "92 mutants",
                 "one of **16** instantiations"):
        assert COUNT.search(text), text
    for text in ("to 0 survivors", "1, 3, 7, 24 and 48 cores in the tests",
                 "head_dim 128 only", "in both of those cases", "six or more lines"):
        assert not COUNT.search(text), text


def _headings(path: Path) -> list[str]:
    fence, found = False, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            found.append(line.lstrip("#").strip())
    return found


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def link_problems(path: Path) -> list[str]:
    """Relative links of a doc that lead nowhere: a missing file, or an anchor no heading
    of the target has."""
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    wrong = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            shown = dest.relative_to(ROOT) if ROOT in dest.parents else dest
            wrong.append(f"{target}: no file {shown}")
        elif anchor and dest.suffix == ".md":
            slugs = [_slug(h) for h in _headings(dest)]
            slugs += [f"{s}-{i}" for s in set(slugs) for i in range(1, slugs.count(s))]
            if anchor not in slugs:
                wrong.append(f"{target}: no heading of {dest.name} has the anchor #{anchor}")
    return wrong


@pytest.mark.parametrize("path", list(_docs()), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_leads_somewhere(path):
    wrong = link_problems(path)
    assert not wrong, f"{path.name}: {wrong}"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A title: `x` (y)\n\n[ok](#a-title-x-y) [bad](b.md) "
                                   "[anchor](#nowhere) [web](https://example.org/x#y)\n")
    wrong = link_problems(tmp_path / "a.md")
    assert len(wrong) == 2 and "b.md" in wrong[0] and "#nowhere" in wrong[1], wrong


# `docs/kernel-decode.md, "The decode kernel"`: a doc cited with a section title, in the docs and
# in the sources' comments (a comment's line break and `//` / `#` inside the title allowed).
CITED = re.compile(r"\b(?:docs/)?([\w-]+)\.md(?:#[\w-]+)?(?:,|:| \(|,? )\s*\\?\""
                   r"([A-Z`*](?:[^\"\\\n]|\n\s*(?://|#)?){1,80}?)\\?\"")
SOURCES = ("README.md", "benchmarks", "docs", "python", "op_host", "op_kernel", "twin",
           "framework", "scripts", "tests")


def _cited_sections():
    pages = {p.stem: [h.lower() for h in _headings(p)] for p in (ROOT / "docs").glob("*.md")}
    for top in SOURCES:
        base = ROOT / top
        for path in ([base] if base.is_file() else sorted(base.rglob("*"))):
            if path.suffix not in (".md", ".py", ".h", ".cpp") or path.name == "design-log.md":
                continue
            for m in CITED.finditer(path.read_text(encoding="utf-8", errors="replace")):
                if m.group(1) not in pages:
                    continue
                title = re.sub(r"\s+", " ", re.sub(r"\n\s*(?://|#)?", " ", m.group(2))).strip()
                yield path, m.group(1), title, pages[m.group(1)]


def test_every_cited_section_exists():
    """A doc cited with a section title ("docs/kernel-decode.md, \"The decode kernel\"")
    has a heading that starts with it, so a page split or a renamed heading cannot leave
    a pointer to nothing."""
    wrong = [f"{p.relative_to(ROOT)}: {page}.md, {title!r}"
             for p, page, title, heads in _cited_sections()
             if not any(h.startswith(title.lower()) for h in heads)]
    assert not wrong, "citations of sections no doc has:\n" + "\n".join(wrong)
