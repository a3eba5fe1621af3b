"""scripts/mutants.yaml, the mutation runner's list, is valid against today's sources
(every snippet found exactly once in its file), and the runner refuses a stale list
before running anything. The mutants themselves are not run here: scripts/mutate.py
runs them (README, "Tests and benchmarks")."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


mutate = _runner()
MUTANTS = mutate.load()


def test_the_list_is_large_and_covers_every_layer():
    assert len(MUTANTS) >= 30
    assert len({m.id for m in MUTANTS}) == len(MUTANTS)
    assert {m.layer for m in MUTANTS} == set(mutate.LAYERS)


@pytest.mark.parametrize("m", MUTANTS, ids=[m.id for m in MUTANTS])
def test_each_snippet_is_found_exactly_once(m):
    assert (ROOT / m.file).is_file(), f"{m.id}: {m.file} does not exist (moved?)"
    assert mutate.occurrences(m) == 1, f"{m.id}: the original snippet of {m.file} is stale"
    assert m.why.strip()


@pytest.mark.parametrize("m", MUTANTS, ids=[m.id for m in MUTANTS])
def test_each_selection_names_existing_tests(m):
    """The test files (and node ids' files) a mutant's selection runs exist."""
    files = [a.split("::")[0] for a in m.tests if a.startswith("tests/")]
    assert files, f"{m.id}: no test file in {shlex.join(m.tests)}"
    for f in files:
        assert (ROOT / f).is_file(), f"{m.id}: {f} does not exist"


def _write(tmp_path, entries) -> Path:
    path = tmp_path / "mutants.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def _entry(**changes):
    entry = {"id": "x", "layer": "checks", "file": "python/flash_cann/contract/checks.py",
             "original": "min(lengths) < 0", "replacement": "False", "tests": ["tests/x.py"],
             "why": "w"}
    entry.update(changes)
    return entry


@pytest.mark.parametrize("entry, message", [
    (_entry(original="a snippet that is in no file"), "not found exactly once"),
    (_entry(file="python/flash_cann/moved_away.py"), "file missing"),
    (_entry(original="import"), "not found exactly once"),   # several times
])
def test_a_stale_entry_stops_the_run_before_any_test(tmp_path, capsys, entry, message):
    assert mutate.main(["--mutants", str(_write(tmp_path, [entry]))]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("entries, message", [
    ([_entry(), _entry()], "duplicate id"),
    ([_entry(layer="elsewhere")], "is not one of"),
    ([_entry(tests=[])], "non-empty list"),
    ([_entry(replacement="min(lengths) < 0")], "must differ"),
    ([{"id": "x"}], "missing"),
])
def test_a_malformed_list_is_refused(tmp_path, capsys, entries, message):
    assert mutate.main(["--list", "--mutants", str(_write(tmp_path, entries))]) == 2
    assert message in capsys.readouterr().err


def test_native_mutants_are_rebuilt():
    """A mutant of C/C++ or CMake gets its own native build; Python ones share one."""
    by_id = {m.id: m for m in MUTANTS}
    assert by_id["race-waitflag-orders-every-pipe"].native
    assert by_id["kernel-fwd-lse-sign"].native
    assert not by_id["host-bwd-key-without-deterministic"].native
    assert all(m.native == (Path(m.file).suffix in {".cpp", ".h"}) for m in MUTANTS)
