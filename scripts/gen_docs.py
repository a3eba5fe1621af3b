#!/usr/bin/env python3
"""Generate the docs' statements of which backend supports what from the op spec.

Everything generated comes from ``python/flash_cann/contract/flash_cann_ops.yaml``
(through ``flash_cann.contract.spec``): the backends, their device types and dtypes, their
``features`` / ``also_on_features``, whether they compute the backward, the head_dim
limits and which op arguments belong to each feature. A doc (README.md, docs/*.md,
benchmarks/*.md; docs/design-log.md, the history, is never touched) holds a generated
piece between two markers::

    <!-- gen:NAME ARG... -->generated text<!-- /gen -->

inline, inside a sentence (the opening marker must not start a line: Markdown would take
it for an HTML block), or as a block, with the markers on lines of their own. NAME is one
of ``GENERATORS`` below. ``--check`` exits 1 when a committed piece differs from what the
spec gives (tests/test_docs.py runs the same comparison), naming the file and the piece.

    python scripts/gen_docs.py           # rewrite every generated piece
    python scripts/gen_docs.py --check   # compare only
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from flash_cann.contract import spec as spec_mod  # noqa: E402
from flash_cann.contract.variant import FEATURES  # noqa: E402

README = ROOT / "README.md"
# <!-- gen:NAME ARG... -->TEXT<!-- /gen -->
MARKER = re.compile(r"<!-- gen:([\w-]+)((?: [\w.-]+)*) -->(.*?)<!-- /gen -->", re.S)

# What each feature is (the semantics: python/flash_cann/contract/variant.py) and the
# public arguments that carry it; the op arguments come from the spec.
TITLES = {
    "varlen": ("packed variable-length sequences",
               "`flash_attn_varlen_*`, `layout=\"TND\"`"),
    "window": ("sliding window (Mistral, Gemma)", "`window_size=(left, right)`"),
    "softcap": ("softcap (Gemma 2)", "`softcap`"),
    "alibi": ("ALiBi (BLOOM, MPT)", "`alibi_slopes`"),
    "dropout": ("dropout", "`dropout_p`, `generator=`"),
    "kvcache": ("KV cache, paged (decode)", "`flash_attn_with_kvcache`, `block_table=`"),
    "sinks": ("attention sinks (gpt-oss; vLLM's `s_aux`)", "`sinks`"),
}
# The features in running prose.
PROSE = {
    "varlen": "packed variable-length sequences (TND)",
    "window": "sliding windows",
    "softcap": "softcap",
    "alibi": "ALiBi",
    "dropout": "dropout",
    "kvcache": "the paged KV cache for decoding",
    "sinks": "attention sinks",
}
DEVICE_NAMES = {"cpu": "CPUs", "cuda": "CUDA", "npu": "NPUs"}
# How far each (backend, device type) is verified: the README's status levels.
LEVELS = {
    ("cpu", "cpu"): "ran on CPU",
    ("twin", "cpu"): "ran on the twin, race-checked on the twin",
    ("triton", "cuda"): "ran on GPU",
    ("triton", "npu"): "lowered for the 910B2/B4; untested on an NPU",
    ("npu", "npu"): "compiles against public headers; untested on an NPU",
}


class DocError(SystemExit):
    """A doc's markers are malformed or name an unknown generator or argument."""


def _columns(spec):
    return [(b, d) for b in spec.backends.values() for d in b.device_types]


def _op_arguments(spec, feature):
    """The torch ops that serve ``feature`` -> the op arguments that belong to it."""
    found = {}
    for op in spec.ops.values():
        names = [n for n, f in op.featured() if f == feature]
        if op.feature == feature or names:
            found[op.name] = names
    return found


def _cell(spec, backend, device, feature):
    if feature not in backend.features_on(device):
        return "no"
    return "fwd + bwd" if has_backward(spec, backend, feature) else "fwd"


def has_backward(spec, backend, feature) -> bool:
    """Whether ``backend`` computes ``feature``'s gradient: it computes backward ops and a
    backward op takes the feature's arguments."""
    ops = [spec.ops[name] for name in _op_arguments(spec, feature)]
    return backend.backward and any(
        op.backward and feature in {f for _, f in spec.ops[op.backward].featured()}
        for op in ops)


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ticked(names) -> list[str]:
    return [f"`{n}`" for n in names]


def _labels(spec, having) -> list[str]:
    """`b` for a backend that has it on every device type it serves, else `b` on D."""
    labels = []
    for b in spec.backends.values():
        on = [d for d in b.device_types if having(b, d)]
        if on == list(b.device_types):
            labels.append(f"`{b.name}`")
        labels += [f"`{b.name}` on {DEVICE_NAMES.get(d, d)}" for d in on
                   if on != list(b.device_types)]
    return labels


def _feature_args(args) -> list[str]:
    for name in args:
        if name not in FEATURES:
            raise DocError(f"no feature {name!r} (the features: {', '.join(FEATURES)})")
    return list(args)


def _backend(spec, name):
    if name not in spec.backends:
        raise DocError(f"no backend {name!r} in the spec ({', '.join(spec.backends)})")
    return spec.backends[name]


def table(spec=None, *args) -> str:
    """The README's feature table: one row per feature, one column per (backend, device)."""
    spec = spec or spec_mod.load()
    cols = _columns(spec)
    head = ["feature", "arguments (op arguments)"] + [
        f"`{b.name}` on {d} ({LEVELS.get((b.name, d), 'unverified')})" for b, d in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for feature in FEATURES:
        title, public = TITLES[feature]
        args_ = _op_arguments(spec, feature)
        names = list(dict.fromkeys(n for ns in args_.values() for n in ns))
        ops = ", ".join(f"`{n}`" for n in names) or "op " + ", ".join(f"`{o}`" for o in args_)
        row = [title, f"{public} ({ops})"] + [_cell(spec, b, d, feature) for b, d in cols]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def features(spec, backend, device=None) -> str:
    """``features npu``: the features the backend computes (on ``device``, default its
    own device type), in prose, with the forward-only ones said so."""
    b = _backend(spec, backend)
    have = b.features_on(device or b.device_type)
    if not have:
        return "no optional feature"
    return _and(PROSE[f] + ("" if has_backward(spec, b, f) else " (forward only)")
                for f in FEATURES if f in have)


def support(spec, *names) -> str:
    """``support varlen window``: which backends compute every feature named: "every
    backend (`cpu`, ...)" or "`a` and `b` only (not `c`)"."""
    wanted = _feature_args(names)
    yes = _labels(spec, lambda b, d: all(f in b.features_on(d) for f in wanted))
    no = _labels(spec, lambda b, d: not all(f in b.features_on(d) for f in wanted))
    if not no:
        return f"every backend ({_and(yes)})"
    if not yes:
        return f"no backend (not {_and(no)})"
    return f"{_and(yes)} only (not {_and(no)})"


def backends(spec) -> str:
    """``backends``: every backend of the spec."""
    return _and(_ticked(spec.backends))


def dtypes(spec) -> str:
    """``dtypes``: the dtypes every backend computes, then each backend's further ones."""
    common = [d for d in next(iter(spec.backends.values())).dtypes
              if all(d in b.dtypes for b in spec.backends.values())]
    more = [f"{_and(x for x in b.dtypes if x not in common)} on `{b.name}`"
            for b in spec.backends.values() if set(b.dtypes) - set(common)]
    text = f"{_and(common)} on every backend"
    return text + (f" (also {'; '.join(more)})" if more else "")


def head_dim(spec) -> str:
    """``head-dim``: the head_dim range of every backend."""
    return f"{spec.head_dim_min}-{spec.head_dim_max}"


GENERATORS = {"feature-table": table, "features": features, "support": support,
              "backends": backends, "dtypes": dtypes, "head-dim": head_dim}


def piece(name: str, args: list[str], spec) -> str:
    if name not in GENERATORS:
        raise DocError(f"no generator {name!r} (scripts/gen_docs.py has: "
                       f"{', '.join(GENERATORS)})")
    try:
        return GENERATORS[name](spec, *args)
    except TypeError as exc:
        raise DocError(f"gen:{name} {' '.join(args)}: {exc}") from None


def render(text: str, spec=None, where: str = "doc") -> str:
    """``text`` with every generated piece rewritten from ``spec``."""
    spec = spec or spec_mod.load()
    if text.count("<!-- gen:") != len(MARKER.findall(text)):
        raise DocError(f"{where}: a `<!-- gen:` marker without its `<!-- /gen -->`")

    def one(m):
        name, args, old = m.group(1), m.group(2).split(), m.group(3)
        new = piece(name, args, spec)
        if old.startswith("\n"):  # a block: markers on lines of their own
            return f"<!-- gen:{name}{m.group(2)} -->\n{new}\n<!-- /gen -->"
        if "\n" in new:
            raise DocError(f"{where}: gen:{name} gives several lines: put its markers on "
                           "lines of their own")
        line_start = text.rfind("\n", 0, m.start()) + 1
        if not text[line_start:m.start()].strip():
            raise DocError(f"{where}: the inline piece gen:{name} starts a line (Markdown "
                           "would take it for an HTML block): move it after a word")
        return f"<!-- gen:{name}{m.group(2)} -->{new}<!-- /gen -->"

    return MARKER.sub(one, text)


def docs():
    """The docs that may hold generated pieces (design-log.md, the history, never)."""
    yield README
    yield from sorted((ROOT / "benchmarks").glob("*.md"))
    yield from (p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "design-log.md")


def stale(spec=None) -> list[str]:
    """The docs whose generated pieces differ from the spec."""
    spec = spec or spec_mod.load()
    out = []
    for path in docs():
        text = path.read_text(encoding="utf-8")
        if render(text, spec, path.name) != text:
            out.append(path.relative_to(ROOT).as_posix())
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    spec = spec_mod.load()
    if args.check:
        wrong = stale(spec)
        if wrong:
            print(f"generated statements differ from the spec in {', '.join(wrong)}: run "
                  "python scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    for path in docs():
        text = path.read_text(encoding="utf-8")
        new = render(text, spec, path.name)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {path.relative_to(ROOT).as_posix()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
