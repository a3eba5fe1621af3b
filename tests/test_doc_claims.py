"""Every statement in the docs of which backend or kernel has which feature is either
generated from the op spec (scripts/gen_docs.py's pieces, checked by tests/test_docs.py)
or asserted here against the spec (``flash_cann.contract.spec.load()``), so a feature
landing in (or leaving) a backend's ``features`` cannot leave a doc saying otherwise.

How: every sentence of README.md, benchmarks/*.md and docs/*.md (docs/design-log.md, the
history, is exempt; code blocks and generated pieces are skipped) that names a feature
and says something is refused, lacking, not supported, not yet there, or only somewhere
(``is_support_statement``) must be listed in ``CLAIMS`` with a fragment of its text and
either a predicate on the spec that holds exactly when the sentence is true, or the
reason it is not a statement about backend support (a refusal every backend shares, a
kernel's internals). A new such sentence fails ``test_every_support_statement_is_classified``
until it is generated or classified; a spec change that falsifies a listed sentence
fails ``test_the_claims_hold``. ``POSITIVE`` lists the sentences that name a backend's or
kernel's features without a negative word (the README's status rows, the kernel pages,
docs/npu.md); docs/api.md's comparison table and the README's backends table are read
cell by cell. The statement forms tests/test_npu_doc_backends.py recognises ("runs on the
`a` and `b` backends", "until the npu backend lists `f`") are checked in every doc too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flash_cann.contract.spec import load
from test_npu_doc_backends import problems as form_problems

ROOT = Path(__file__).resolve().parents[1]
FEATURES = ("varlen", "window", "softcap", "alibi", "dropout", "kvcache", "sinks")


def docs():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "benchmarks").glob("*.md"))
    yield from (p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "design-log.md")


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


GENERATED = re.compile(r"<!-- gen:[\w-]+(?: [\w.-]+)* -->.*?<!-- /gen -->", re.S)
FENCE = re.compile(r"(?ms)^```.*?^```")


def units(text: str) -> list[str]:
    """The sentences (and table cells) of a doc, whitespace flattened, without code
    blocks and with each generated piece replaced by "GENERATED"."""
    text = GENERATED.sub("GENERATED", FENCE.sub("", text))
    out = []
    for para in re.split(r"\n\s*\n", text):
        pieces = ([c for row in para.splitlines() for c in row.split("|")]
                  if para.lstrip().startswith("|") else [para])
        for piece in pieces:
            piece = re.sub(r"\s+", " ", piece).strip()
            out += [s for s in re.split(r"(?<=[.;])\s+(?=[A-Z(`*-])", piece) if s.strip()]
    return out


FEATURE_WORD = re.compile(r"(?i)\b(window(s|_size)?|softcap|soft-capping|alibi|dropout|sinks?|"
                          r"varlen|tnd|packed|kv.cache|kvcache|paged|decod\w*|s_aux|features?)\b")
BACKEND_WORD = re.compile(r"(?i)`(cpu|twin|triton|npu)`|\b(cpu|triton|npu|twin) backends?\b|"
                          r"\bthe twin\b|\bkernels?\b|triton-ascend|\bthe (ascend|cann) op\b|"
                          r"\bon (the )?(cpu|gpu|npu)s?\b|\bbackends?\b")
# Said of a feature, these are support statements whatever else the sentence names.
STRONG = re.compile(r"(?i)(refus\w*|not support\w*|unsupported|\blacks?\b|not yet|"
                    r"\bno (sliding )?(window|softcap|alibi|dropout|sinks?|tnd|varlen|"
                    r"kv.cache|packed)\b)")
# These only next to a backend or kernel.
WEAK = re.compile(r"(?i)(\bhas no\b|\buntil\b|\bonly\b)")


def is_support_statement(sentence: str) -> bool:
    return bool(FEATURE_WORD.search(sentence) and (
        STRONG.search(sentence) or (BACKEND_WORD.search(sentence) and WEAK.search(sentence))))


def _all(*features, backends=None):
    """The predicate: every backend (or those named) computes every feature named, on
    every device type it serves."""
    def holds(spec):
        names = backends or list(spec.backends)
        return all(f in spec.backends[n].features_on(d) for n in names for f in features
                   for d in spec.backends[n].device_types)
    holds.__doc__ = f"{backends or 'every backend'} has {', '.join(features)}"
    return holds


def _forward_only(feature):
    """No backward op takes the feature's arguments (the KV cache: fwd_kvcache)."""
    def holds(spec):
        for op in spec.ops.values():
            if op.feature == feature and op.backward:
                return False
        return True
    return holds


def _only_dtype(dtype, backend):
    def holds(spec):
        return [n for n, b in spec.backends.items() if dtype in b.dtypes] == [backend]
    return holds


def _same_on(backend, device, other):
    def holds(spec):
        b = spec.backends[backend]
        return set(b.features_on(device)) == set(b.features_on(other)) == set(FEATURES)
    return holds


NOT_SUPPORT = "not a statement of which backend has a feature"

# (doc, a fragment of the sentence) -> a predicate on the spec that holds exactly when the
# sentence is true, or the reason it says nothing about backend support.
ASCEND = ["twin", "npu"]  # the Ascend C kernels: on the twin and through aclnn
SHARED_CHECK = "an argument rule every backend shares (contract/checks.py or the API layer)"
INTERNALS = "how a kernel or the planner works inside, not which backend has a feature"
COVERAGE = "what a test covers, not which backend has a feature"
CLAIMS: dict[tuple[str, str], object] = {
    ("README.md", "A backend without a feature raises `NotImplementedError`"):
        "how any backend refuses a feature it lacks (contract/checks.py)",
    ("README.md", "CI drives it through a stand-in of the registration/tiling API"): COVERAGE,
    ("README.md", "CI: every plain kernel variant and a feature grid"): COVERAGE,
    ("benchmarks/NOTES.md", "Now `kvcache_forward` picks `splits`"): INTERNALS,
    ("benchmarks/RESULTS.md", "**Dropout is slow on the Ascend kernels**"):
        _all("dropout", backends=ASCEND),
    ("docs/api.md", "is refused naming `window_size`"): SHARED_CHECK,
    ("docs/api.md", "on the CPU, `block_table` pages and `cache_batch_idx` rows out of range"):
        "a bounds check the cpu backend makes, not a feature",
    ("docs/api.md", "refused (\"does not support dropout\")"):
        "flash-attn-npu's, not a flash-cann backend",
    ("docs/api.md", "`npu_fusion_attention_v2`'s `pse_type`"): "the comparison's sources",
    ("docs/architecture.md", "the argument checks' per-backend features and dtypes"):
        "where the refusals live",
    ("docs/architecture.md", "a backend without the feature now refuses `window_size`"):
        "the recipe for adding a feature, a backend without it in general",
    ("docs/architecture.md", "a sentence written by hand that names a feature with"):
        "this test's own rule",
    ("docs/distributed.md", "Windows need `causal=True`"): SHARED_CHECK,
    ("docs/distributed.md", "Refused inside the context, by name: key padding masks"):
        "the torch context_parallel integration's own refusals, the same for every backend",
    ("docs/distributed.md", "Packed documents need the `varlen` feature"):
        "which backends have varlen is the generated piece; the rest holds for any backend",
    ("docs/kernel.md", "- **Compiles against the public Ascend C headers.**"): COVERAGE,
    ("docs/kernel.md", "The flag keeps a plain call on exactly the plain kernel"): INTERNALS,
    ("docs/kernel.md", "has no forward key: the forward keeps fp32 S"):
        "the fp16-score permission (not a feature) on the forward kernel",
    ("docs/kernel.md", "are read by the kernel only when the tiling data says so"):
        _all("alibi", "dropout", "sinks", backends=ASCEND),
    ("docs/kernel-decode.md", "No key padding mask with TND"): SHARED_CHECK,
    ("docs/kernel-decode.md", "The sink joins here once"): INTERNALS,
    ("docs/kernel-decode.md", "TND with a 5-row prefill, a decode row"):
        _all("kvcache", "varlen", "softcap", backends=["twin"]),
    ("docs/migration.md", "\"Mapped\" = translated exactly"): "the migration table's legend",
    ("docs/migration.md", "0 or > 1 refused as in torch_npu"): SHARED_CHECK,
    ("docs/migration.md", "5, 6 (prefix) refused; 7, 8 only with TND"): SHARED_CHECK,
    ("docs/migration.md", "both give (T, N1, 8)"): SHARED_CHECK,
    ("docs/migration.md", "With TND, full masks are refused"): SHARED_CHECK,
    ("docs/migration.md", "The features the translation produces"):
        "which backends compute them is the generated piece",
    ("docs/migration.md", "`pse` being refused"): SHARED_CHECK,
    ("docs/migration.md", "documents that its varlen path does not support them"):
        "torch_npu's, not a flash-cann backend",
    ("docs/npu.md", "Each feature is an attribute or an optional input of the CANN op"):
        _all("window", "softcap", "dropout", "alibi", "sinks", backends=["npu"]),
    ("docs/npu.md", "Packed variable-length sequences (layout TND, issue 24) reach both ops"):
        _all("varlen", backends=["npu"]),
    ("docs/npu.md", "A torchair graph that uses a feature the Ascend op lacks"):
        "the converters' rule for a feature the npu backend does not list, in general",
    ("docs/npu.md", "the kernels read `cu_seqlens_q/k`, `cache_seqlens`, `block_table`"):
        _all("varlen", "kvcache", "dropout", "alibi", "sinks", backends=["npu"]),
    ("docs/npu.md", "**What is refused under a capture**"):
        "the capture rules (contract/capture.py), the same for every backend",
    ("docs/npu.md", "Sliding windows, soft-capping, train-mode dropout, attention sinks"):
        _all("window", "softcap", "dropout", "sinks", "varlen", backends=["npu", "triton"]),
    ("docs/npu.md", "capture: no host read of an npu tensor in the npu backend's forward"):
        _all(*FEATURES, backends=["npu", "triton"]),
    ("docs/planner.md", "A sliding-window tile visits only the sub-blocks of its band"): INTERNALS,
    ("docs/schedule-model.md", "The split over cores is the kernel's, on the device"): INTERNALS,
    ("docs/schedule-model.md", "*How the planner chooses.*"): INTERNALS,
    ("docs/schedule-model.md", "Dropout misses its 10 %"): _all("dropout", backends=ASCEND),
    ("docs/planner.md", "**Refusals**: the forward's problem checks"): INTERNALS,
}

# Sentences naming a backend's or kernel's features without a negative word.
POSITIVE: dict[tuple[str, str], object] = {
    ("README.md", "ALiBi, dropout, learnable attention sinks, packed variable-length sequences "
                  "and paged KV caches. On an Ascend server it runs its own Ascend C kernels"):
        _all(*FEATURES),
    ("README.md", "the Ascend C forward, backward and decode kernels"):
        lambda spec: spec.backends["npu"].backward and "kvcache" in spec.backends["npu"].features,
    ("README.md", "flash-attn 2.8's features on `cpu` and `triton`"):
        _all(*FEATURES, backends=["cpu", "triton"]),
    ("README.md", "Ascend C **forward** kernel"):
        _all("window", "alibi", "softcap", "dropout", "sinks", backends=ASCEND),
    ("README.md", "Ascend C **backward** kernel"):
        _all("softcap", "dropout", "sinks", backends=ASCEND),
    ("README.md", "Ascend C packed sequences (TND, issue 24), forward and backward"):
        _all("varlen", backends=ASCEND),
    ("README.md", "the features' arguments (window, softcap, ALiBi slopes, dropout rng_state, "
                  "sinks and grad_sinks)"):
        _all("window", "softcap", "alibi", "dropout", "sinks", backends=["npu"]),
    ("README.md", "forward + backward with every feature of the CUDA backend"):
        _same_on("triton", "npu", "cuda"),
    ("README.md", "On the Ascend kernels (`twin`, `npu`) the KV cache is the decode kernel"):
        _all("kvcache", backends=ASCEND),
    ("README.md", "sinks, head_dim up to 256 with all of them"):
        lambda spec: spec.head_dim_max == 256 and _all(*FEATURES, backends=ASCEND)(spec),
    ("docs/kernel-backward.md", "## Features (issue 23): window, ALiBi, softcap, dropout, sinks, "
                                "head_dim ≤ 256"):
        lambda spec: spec.head_dim_max == 256 and _all(
            "window", "alibi", "softcap", "dropout", "sinks", backends=ASCEND)(spec),
    ("docs/kernel-backward.md", "**head_dim up to 256** with every feature"):
        lambda spec: spec.head_dim_max == 256,
    ("docs/api.md", "float32 (float64 with float64 inputs on the CPU)"):
        _only_dtype("float64", "cpu"),
    ("docs/api.md", "paged caches through `block_table`; forward only"): _forward_only("kvcache"),
    ("docs/kernel-decode.md", "Called by both kernels' vector halves"):
        _all("dropout", backends=ASCEND),
    ("docs/kernel.md", "the features (window, softcap, ALiBi, dropout, sinks) as both kernels' "
                       "tiling data carries them"):
        _all("window", "softcap", "alibi", "dropout", "sinks", backends=ASCEND),
}


def _hits():
    for path in docs():
        for sentence in units(path.read_text(encoding="utf-8")):
            if is_support_statement(sentence):
                yield _name(path), sentence


def _claim(doc, sentence, table):
    flat = re.sub(r"\s+", " ", sentence)
    return [key for key in table if key[0] == doc and key[1] in flat]


def test_every_support_statement_is_classified():
    unclassified = [f"{doc}: {s[:200]}" for doc, s in _hits() if not _claim(doc, s, CLAIMS)]
    assert not unclassified, (
        "doc sentences state what a backend supports but are neither generated "
        "(scripts/gen_docs.py) nor listed in tests/test_doc_claims.py's CLAIMS with a spec "
        "predicate:\n" + "\n".join(unclassified))


@pytest.mark.parametrize("table", ["CLAIMS", "POSITIVE"])
def test_every_listed_sentence_is_in_its_doc(table):
    flat = {_name(p): re.sub(r"\s+", " ", GENERATED.sub("GENERATED", p.read_text("utf-8")))
            for p in docs()}
    gone = [key for key in globals()[table] if key[1] not in flat.get(key[0], "")]
    assert not gone, f"{table} lists sentences no doc holds any more (remove them): {gone}"


def _failing(table, spec):
    return [f"{doc}: {fragment!r} ({getattr(why, '__doc__', '') or ''})"
            for (doc, fragment), why in table.items() if callable(why) and not why(spec)]


@pytest.mark.parametrize("table", ["CLAIMS", "POSITIVE"])
def test_the_claims_hold(table):
    wrong = _failing(globals()[table], load())
    assert not wrong, "doc sentences the spec contradicts:\n" + "\n".join(wrong)


def test_the_forms_hold_in_every_doc():
    """tests/test_npu_doc_backends.py's statement forms, in every doc."""
    wrong = [f"{_name(p)}: {w}" for p in docs()
             for w in form_problems(GENERATED.sub("GENERATED", p.read_text("utf-8")))]
    assert not wrong, "\n".join(wrong)


# docs/api.md's comparison table: the flash-cann column's rows, by feature.
API_ROWS = {"sliding window": "window", "ALiBi": "alibi", "softcap": "softcap",
            "dropout": "dropout", "attention sinks": "sinks", "varlen / TND": "varlen",
            "paged KV cache": "kvcache"}


def _has_backward(spec, feature):
    """Some op with the feature has a backward op that takes the feature's arguments."""
    for op in spec.ops.values():
        if (op.feature == feature or any(f == feature for _, f in op.featured())) and \
                op.backward and any(f == feature for _, f in spec.ops[op.backward].featured()):
            return True
    return False


def api_table_problems(text: str, spec) -> list[str]:
    """Each feature row's flash-cann cell says "fwd + bwd" / "fwd" exactly as the spec
    gives the feature to both Ascend backends (twin, npu), "none"/"refused" otherwise."""
    header = next(line for line in text.splitlines()
                  if "flash-cann Ascend kernels (`npu`, `twin`)" in line)
    title = "flash-cann Ascend kernels (`npu`, `twin`)"
    column = [c.strip() for c in header.split("|")].index(title)
    rows = {}
    for line in text[text.index(header):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.split("|")]
        rows[cells[1]] = cells[column]
    wrong = [f"no row {label!r}" for label in API_ROWS if label not in rows]
    for label, feature in API_ROWS.items():
        cell = rows.get(label, "")
        if all(feature in spec.backends[b].features for b in ASCEND):
            said = "fwd + bwd" if _has_backward(spec, feature) else "fwd"
            if not re.match(re.escape(said) + r"(?! \+)\b", cell):
                wrong.append(f"{label}: {cell[:40]!r}, the spec: {said}")
        elif not re.match(r"(none|refused)\b", cell):
            wrong.append(f"{label}: {cell[:40]!r}, but {ASCEND} do not all list {feature}")
    return wrong


def test_the_api_comparison_table_follows_the_spec():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert api_table_problems(text, load()) == []


def _narrowed():
    """The spec without the KV cache on npu and with dropout only on cpu."""
    import dataclasses
    spec = load()
    b = {name: dataclasses.replace(x, features=tuple(
        f for f in x.features if f != "dropout" or name == "cpu"))
        for name, x in spec.backends.items()}
    b["npu"] = dataclasses.replace(b["npu"], features=tuple(
        f for f in b["npu"].features if f != "kvcache"))
    b["triton"] = dataclasses.replace(b["triton"], also_on_features={
        "npu": tuple(f for f in b["triton"].features_on("npu") if f != "dropout")})
    return dataclasses.replace(spec, backends=b)


def test_a_narrowed_spec_falsifies_the_sentences_it_contradicts():
    """The predicates and the table reader read the spec: take the KV cache from npu and
    dropout from all but cpu, and the sentences saying otherwise are named."""
    spec = _narrowed()
    wrong = "\n".join(_failing(CLAIMS, spec) + _failing(POSITIVE, spec))
    for fragment in ("On the Ascend kernels (`twin`, `npu`) the KV cache",
                     "**Dropout is slow on the Ascend kernels**",
                     "Called by both kernels' vector halves",
                     "the kernels read `cu_seqlens_q/k`",
                     "forward + backward with every feature of the CUDA backend"):
        assert fragment in wrong, fragment
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    table = api_table_problems(text, spec)
    assert any(p.startswith("dropout:") for p in table), table
    assert any(p.startswith("paged KV cache:") for p in table), table


@pytest.mark.parametrize("planted", [
    "The twin lacks softcap.",
    "The Ascend C backends have no window, dropout or TND.",
    "The KV cache runs on the cpu and triton backends only.",
    "transformers' sinks (`s_aux`) are refused.",
    "The npu backend does not support packed sequences yet.",
    "Dropout is not yet in the decode kernel.",
])
def test_a_planted_support_statement_must_be_classified(planted):
    """A sentence of the kinds issue 44 found stale is swept up (and, being in no
    CLAIMS entry, fails test_every_support_statement_is_classified)."""
    sentences = units(f"Some text before.\n\n{planted} And more.\n")
    hit = [s for s in sentences if is_support_statement(s)]
    assert hit and not _claim("README.md", hit[0], CLAIMS), (planted, sentences)


def test_a_generated_piece_is_not_swept():
    assert not any(is_support_statement(s) for s in units(
        "Dropout runs on <!-- gen:support dropout -->`cpu` only (not `npu`)<!-- /gen -->."))


def readme_backends_problems(text: str, spec) -> list[str]:
    """README's "Backends: which runs where" table: one row per backend of the spec, its
    device cell naming exactly the device types the backend serves, "(default)" exactly
    where the spec lists it first for its own device type."""
    words = {"cpu": "CPU", "cuda": "CUDA", "npu": "NPU"}
    rows = {}
    for line in text[text.index("## Backends: which runs where"):].splitlines():
        m = re.match(r"\| `(\w+)` \(`backends/\w+/`\) \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    wrong = [f"no row for backend {name!r}" for name in spec.backends if name not in rows]
    wrong += [f"row {name!r}: no such backend in the spec" for name in rows
              if name not in spec.backends]
    for name, cell in rows.items():
        if name not in spec.backends:
            continue
        b = spec.backends[name]
        named = {d for d, w in words.items() if re.search(rf"\b{w}\b", cell)}
        if named != set(b.device_types):
            wrong.append(f"{name}: the row names {sorted(named)}, "
                         f"the spec {sorted(b.device_types)}")
        default = spec.backends_for_device(b.device_type)[0].name == name
        if default != ("(default)" in cell):
            wrong.append(f"{name}: '(default)' {'missing' if default else 'wrong'} ({cell!r})")
    return wrong


def test_the_readme_backends_table_follows_the_spec():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_backends_problems(text, load()) == []


def test_a_changed_backend_changes_the_readme_backends_verdict():
    import dataclasses
    spec = load()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    # twin listed first: the default of CPU tensors; triton no longer on NPUs
    backends = {"twin": spec.backends["twin"],
                **{n: b for n, b in spec.backends.items() if n != "twin"}}
    backends["triton"] = dataclasses.replace(backends["triton"], also_on={})
    wrong = readme_backends_problems(text, dataclasses.replace(spec, backends=backends))
    assert any(w.startswith("twin: '(default)' missing") for w in wrong), wrong
    assert any(w.startswith("cpu: '(default)' wrong") for w in wrong), wrong
    assert any(w.startswith("triton: the row names") for w in wrong), wrong
