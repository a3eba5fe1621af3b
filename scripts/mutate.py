#!/usr/bin/env python3
"""Mutation runner: plants each mutant of scripts/mutants.yaml alone in a scratch copy of
the repository and runs the tests that must catch it.

    python scripts/mutate.py                 # every mutant; exit 0 iff all are caught
    python scripts/mutate.py --list          # validate and list, run nothing
    python scripts/mutate.py --only ID ...   # some mutants
    python scripts/mutate.py --layer checks  # one layer (repeatable)

A mutant is a file path, an exact original snippet (found exactly once in that file, or
the run stops before testing anything: a stale path or snippet after a move is an error,
never a pass), its replacement, and the pytest arguments that must catch it. For each:

1. a scratch copy of the git-tracked files (symlinks kept: the packaged spec is a link),
   the mutant applied;
2. a mutant of native code (C/C++, CMake) gets its own fresh host build in the copy
   (configure + build, about 25 s on 2 cores); the others share one build of the
   pristine copy (FLASH_CANN_BUILD_DIR), since their native sources are unchanged. A
   native mutant that does not build is an error, not a catch;
3. pytest with PYTHONPATH=<copy>/python and CI=true (missing native tools fail instead of
   skipping), stopping at the first failure: exit status 1 = caught, 0 = survived,
   anything else (collection error, no tests, timeout) = error.

Before the mutants, every distinct test selection runs once on the pristine copy and must
pass (--no-baseline skips that): a selection that fails unmutated would "catch" anything.
The run prints id, layer, result and seconds per mutant, then a summary; it exits non-zero
if any mutant survived or errored, or any snippet is not found exactly once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = Path(__file__).with_name("mutants.yaml")
# The layers the list must cover (issue 29), and those later issues added code to.
LAYERS = ("kernel", "race-detector", "triton", "cpu", "checks", "kvcache", "host-path",
          "planner", "model", "packaging", "api", "integrations", "layout")
NATIVE_SUFFIXES = {".c", ".cc", ".cpp", ".h", ".hpp", ".cmake"}
FIELDS = {"id", "layer", "file", "original", "replacement", "tests", "why"}
OPTIONAL = {"env", "timeout"}


class ListError(Exception):
    """The mutant list is malformed or stale."""


@dataclass
class Mutant:
    id: str
    layer: str
    file: str
    original: str
    replacement: str
    tests: list[str]
    why: str
    env: dict[str, str] = field(default_factory=dict)
    timeout: int = 900

    @property
    def native(self) -> bool:
        path = Path(self.file)
        return path.suffix in NATIVE_SUFFIXES or path.name == "CMakeLists.txt"

    def selection(self) -> tuple:
        return tuple(self.tests), tuple(sorted(self.env.items()))


def load(path: Path = MUTANTS) -> list[Mutant]:
    """The mutant list, checked for shape (not yet against the sources: see check)."""
    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list):
        raise ListError(f"{path}: expected a list of mutants")
    mutants, seen = [], set()
    for i, entry in enumerate(entries):
        where = f"{path.name}[{i}] ({entry.get('id', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict):
            raise ListError(f"{where}: not a mapping")
        missing, unknown = FIELDS - set(entry), set(entry) - FIELDS - OPTIONAL
        if missing or unknown:
            raise ListError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}")
        m = Mutant(**entry)
        if m.id in seen:
            raise ListError(f"{where}: duplicate id {m.id!r}")
        seen.add(m.id)
        if m.layer not in LAYERS:
            raise ListError(f"{where}: layer {m.layer!r} is not one of {', '.join(LAYERS)}")
        if not m.original or m.original == m.replacement:
            raise ListError(f"{where}: the replacement must differ from a non-empty original")
        if not m.tests or not all(isinstance(t, str) for t in m.tests):
            raise ListError(f"{where}: tests must be a non-empty list of pytest arguments")
        mutants.append(m)
    return mutants


def occurrences(m: Mutant, root: Path = ROOT) -> int:
    path = root / m.file
    if not path.is_file():
        return 0
    return path.read_text().count(m.original)


def check(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """What is stale: each mutant whose snippet is not found exactly once in its file."""
    problems = []
    for m in mutants:
        n = occurrences(m, root)
        if n != 1:
            state = "file missing" if not (root / m.file).is_file() else f"found {n} times"
            problems.append(f"{m.id}: {m.file}: the original snippet is not found exactly "
                            f"once ({state})")
    return problems


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True,
                         capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def copy_tree(root: Path, files: list[str], dest: Path) -> None:
    """The working-tree content of the tracked files, symlinks kept as links."""
    for rel in files:
        src, dst = root / rel, dest / rel
        if not os.path.lexists(src):
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def apply(m: Mutant, tree: Path) -> None:
    path = tree / m.file
    text = path.read_text()
    if text.count(m.original) != 1:
        raise ListError(f"{m.id}: snippet not found exactly once in the scratch copy")
    path.write_text(text.replace(m.original, m.replacement))


def native_build(tree: Path, build: Path, jobs: int) -> tuple[bool, str]:
    """Configure and build the host-only targets, as flash_cann.ascend.native does."""
    for command in (["cmake", "-S", str(tree / "op_project"), "-B", str(build),
                     "-DFLASH_CANN_HOST_ONLY=ON", "-DCMAKE_BUILD_TYPE=Release"],
                    ["cmake", "--build", str(build), "--parallel", str(jobs)]):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            return False, (result.stdout + result.stderr)[-3000:]
    return True, ""


def pytest(tree: Path, build: Path, tests: list[str], env: dict[str, str], python: str,
           timeout: int) -> tuple[str, str]:
    """('caught' | 'survived' | 'error', log tail)."""
    run_env = {**os.environ, "PYTHONPATH": str(tree / "python"), "FLASH_CANN_BUILD_DIR": str(build),
               "CI": "true", "PYTHONDONTWRITEBYTECODE": "1", **env}
    command = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        result = subprocess.run(command, cwd=tree, env=run_env, capture_output=True, text=True,
                                timeout=timeout)
    except subprocess.TimeoutExpired:
        return "error", f"timed out after {timeout} s"
    log = (result.stdout + result.stderr)[-3000:]
    return {0: "survived", 1: "caught"}.get(result.returncode, "error"), log


def imports_from(tree: Path, python: str) -> Path:
    """Where flash_cann is imported from with the runner's PYTHONPATH."""
    out = subprocess.run([python, "-c", "import flash_cann, sys; print(flash_cann.__file__)"],
                         cwd=tree, env={**os.environ, "PYTHONPATH": str(tree / "python")},
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip()).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="validate and list; run nothing")
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants")
    parser.add_argument("--layer", action="append", choices=LAYERS, help="run this layer")
    parser.add_argument("--mutants", type=Path, default=MUTANTS)
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the pristine run of each test selection")
    parser.add_argument("--jobs", type=int, default=2, help="parallel native build jobs")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for pytest")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the log of each run")
    args = parser.parse_args(argv)

    try:
        mutants = load(args.mutants)
    except (ListError, TypeError) as error:
        print(f"mutate: {error}", file=sys.stderr)
        return 2
    problems = check(mutants)
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            problems.append(f"unknown ids: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.layer:
        mutants = [m for m in mutants if m.layer in args.layer]
    if problems:
        print("mutate: the mutant list is stale, nothing was run:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.id:40} {m.layer:14} {m.file}  [{' '.join(m.tests)}]")
        print(f"{len(mutants)} mutants, {len({m.layer for m in mutants})} layers")
        return 0

    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="flash-cann-mutate-"))
    rows: list[tuple[str, str, str, float]] = []
    try:
        files = tracked_files(ROOT)
        pristine = scratch / "pristine"
        copy_tree(ROOT, files, pristine)
        if imports_from(pristine, args.python) != (pristine / "python/flash_cann/__init__.py").resolve():
            print("mutate: PYTHONPATH does not select the scratch copy's flash_cann", file=sys.stderr)
            return 2
        shared_build = scratch / "build-pristine"
        t0 = time.monotonic()
        ok, log = native_build(pristine, shared_build, args.jobs)
        if not ok:
            print(f"mutate: the pristine native build failed:\n{log}", file=sys.stderr)
            return 2
        print(f"pristine copy and native build: {time.monotonic() - t0:.0f} s", flush=True)
        if not args.no_baseline:
            selections = {}
            for m in mutants:
                selections.setdefault(m.selection(), m)
            for (tests, env), m in selections.items():
                t0 = time.monotonic()
                state, log = pytest(pristine, shared_build, list(tests), dict(env), args.python,
                                    m.timeout)
                print(f"baseline {' '.join(tests)}: {'passes' if state == 'survived' else state} "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
                if state != "survived":
                    print(f"mutate: the selection fails without a mutant:\n{log}", file=sys.stderr)
                    return 2
        for m in mutants:
            t0 = time.monotonic()
            tree = scratch / f"mutant-{m.id}"
            shutil.copytree(pristine, tree, symlinks=True)
            apply(m, tree)
            build = shared_build
            state, log = "", ""
            if m.native:
                build = tree / "build" / "host"
                ok, log = native_build(tree, build, args.jobs)
                if not ok:
                    state = "error (does not build)"
            if not state:
                state, log = pytest(tree, build, m.tests, m.env, args.python, m.timeout)
            seconds = time.monotonic() - t0
            rows.append((m.id, m.layer, state, seconds))
            print(f"{m.id:40} {m.layer:14} {state:10} {seconds:6.0f} s", flush=True)
            if args.verbose or state != "caught":
                print("    " + log.strip().replace("\n", "\n    ")[-2000:], flush=True)
            if not args.keep:
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        if args.keep:
            print(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    print()
    print(f"| id | layer | result | seconds |\n|---|---|---|---:|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]:.0f} |")
    caught = sum(r[2] == "caught" for r in rows)
    survived = sum(r[2] == "survived" for r in rows)
    errors = len(rows) - caught - survived
    print(f"\n{len(rows)} mutants: {caught} caught, {survived} survived, {errors} errors; "
          f"{time.monotonic() - started:.0f} s in all")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
