"""scripts/mutants.yaml, the mutation runner's list, is valid against today's sources
(every snippet found exactly once in its file), and the runner refuses a stale list
before running anything. The mutants themselves are not run here: scripts/mutate.py
runs them (README, "Tests and benchmarks")."""

from __future__ import annotations

import dataclasses
import importlib.util
import shlex
import subprocess
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
    assert by_id["r3-host-cmake-planner-cxx11-abi"].native  # CMake, as the docstring says
    assert all(m.native == (Path(m.file).suffix in {".cpp", ".h", ".cmake"}) for m in MUTANTS)


def _fake_repo(tmp_path):
    root = tmp_path / "repo"
    (root / "python").mkdir(parents=True)
    (root / "python" / "a.py").write_text("x = 1\n")
    (root / "k.cpp").write_text("int x = 1;\n")
    return root


def test_a_worker_plants_one_mutant_and_restores_the_file(tmp_path, monkeypatch):
    """Each mutant is tested alone: the copy holds it during pytest and the pristine text
    after; a native mutant rebuilds, and the next Python mutant first rebuilds the pristine
    sources (its tests must not run against the mutant's objects)."""
    root = _fake_repo(tmp_path)
    seen, builds = [], []
    monkeypatch.setattr(mutate, "native_build", lambda tree, build, jobs: (
        builds.append((tree / "k.cpp").read_text()) or (True, "")))
    monkeypatch.setattr(mutate, "pytest", lambda tree, build, *a: (
        seen.append(((tree / "python/a.py").read_text(), (tree / "k.cpp").read_text()))
        or ("caught", "")))
    worker = mutate.Worker(root, ["python/a.py", "k.cpp"], tmp_path / "w", 1, sys.executable)
    listed = subprocess.run(["git", "ls-files"], cwd=worker.tree, capture_output=True, text=True)
    assert listed.stdout.split() == ["k.cpp", "python/a.py"]  # the copy lists its files as a clone
    py = mutate.Mutant(id="p", layer="checks", file="python/a.py", original="x = 1",
                       replacement="x = 2", tests=["t"], why="w")
    native = mutate.Mutant(id="n", layer="kernel", file="k.cpp", original="x = 1",
                           replacement="x = 2", tests=["t"], why="w")
    assert worker.run(py) == ("caught", "")
    assert worker.run(native) == ("caught", "")
    assert worker.run(py) == ("caught", "")
    assert seen == [("x = 2\n", "int x = 1;\n"), ("x = 1\n", "int x = 2;\n"),
                    ("x = 2\n", "int x = 1;\n")]
    # pristine build, the native mutant's build, the pristine rebuild before the 2nd Python one
    assert builds == ["int x = 1;\n", "int x = 2;\n", "int x = 1;\n"]
    assert (worker.tree / "k.cpp").read_text() == "int x = 1;\n"
    assert (worker.tree / "python/a.py").read_text() == "x = 1\n"


def test_a_native_mutant_that_does_not_build_is_an_error_and_is_restored(tmp_path, monkeypatch):
    root = _fake_repo(tmp_path)
    monkeypatch.setattr(mutate, "native_build", lambda tree, build, jobs: (
        ((tree / "k.cpp").read_text() == "int x = 1;\n"), "boom"))
    monkeypatch.setattr(mutate, "pytest", lambda *a: pytest.fail("must not run the tests"))
    worker = mutate.Worker(root, ["python/a.py", "k.cpp"], tmp_path / "w", 1, sys.executable)
    native = mutate.Mutant(id="n", layer="kernel", file="k.cpp", original="x = 1",
                           replacement="x = (", tests=["t"], why="w")
    assert worker.run(native) == ("error (does not build)", "boom")
    assert (worker.tree / "k.cpp").read_text() == "int x = 1;\n"


def test_the_lists_of_each_area_are_loaded(tmp_path):
    """scripts/mutants/*.yaml add to scripts/mutants.yaml; an id is unique across them."""
    assert set(mutate.default_lists()[1:]) == set(mutate.MORE_MUTANTS.glob("*.yaml"))
    first, second = _write(tmp_path, [_entry()]), tmp_path / "more.yaml"
    second.write_text(yaml.safe_dump([_entry()]))
    with pytest.raises(mutate.ListError, match="duplicate id"):
        mutate.load([first, second])


def test_the_json_counts_each_result_once(tmp_path):
    """--json is rewritten after every mutant (a run stopped from outside keeps its rows);
    its counts classify each row by its result."""
    rows = [{"result": r} for r in ("caught", "caught", "survived", "not run (deadline)",
                                    "error (does not build)", "error (selection fails unmutated)")]
    path = tmp_path / "m.json"
    mutate.write_json(path, rows)
    written = yaml.safe_load(path.read_text())
    assert (written["caught"], written["survived"], written["not_run"], written["errors"]) == (2, 1, 1, 2)
    assert written["rows"] == rows


def test_a_build_stopped_by_its_named_guard_is_a_catch(tmp_path, monkeypatch):
    """build_fails_with: the build failing with that message catches the mutant (a
    compile-time guard); failing with any other message is still an error."""
    root = _fake_repo(tmp_path)
    monkeypatch.setattr(mutate, "native_build", lambda tree, build, jobs: (
        (tree / "k.cpp").read_text() == "int x = 1;\n", "k.cpp: error: x is deprecated"))
    monkeypatch.setattr(mutate, "pytest", lambda *a: pytest.fail("must not run the tests"))
    worker = mutate.Worker(root, ["python/a.py", "k.cpp"], tmp_path / "w", 1, sys.executable)
    guarded = mutate.Mutant(id="n", layer="kernel", file="k.cpp", original="x = 1",
                            replacement="x = 2", tests=["t"], why="w",
                            build_fails_with="x is deprecated")
    assert worker.run(guarded)[0] == "caught (build)"
    other = dataclasses.replace(guarded, build_fails_with="static assertion failed")
    assert worker.run(other)[0] == "error (does not build)"
    mutate.write_json(tmp_path / "m.json", [{"result": "caught (build)"}])
    assert yaml.safe_load((tmp_path / "m.json").read_text())["caught"] == 1
