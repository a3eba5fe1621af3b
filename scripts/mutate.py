#!/usr/bin/env python3
"""Mutation runner: plants each mutant of scripts/mutants.yaml and scripts/mutants/*.yaml
alone in a scratch copy of the repository and runs the tests that must catch it.

    python scripts/mutate.py                 # every mutant; exit 0 iff all are caught
    python scripts/mutate.py --list          # validate and list, run nothing
    python scripts/mutate.py --only ID ...   # some mutants
    python scripts/mutate.py --layer checks  # one layer (repeatable)
    python scripts/mutate.py --workers 8     # eight scratch copies at once (a big machine)

A mutant is a file path, an exact original snippet (found exactly once in that file, or
the run stops before testing anything: a stale path or snippet after a move is an error,
never a pass), its replacement, and the pytest arguments that must catch it.

Each worker owns one scratch copy of the git-tracked files (symlinks kept: the packaged
spec is a link) and one host build of it (FLASH_CANN_BUILD_DIR); when no native mutant is
selected, the workers share one pristine build. For each mutant it takes:

1. the mutant is written into the copy;
2. a mutant of native code (C/C++, CMake) rebuilds the copy's host build incrementally
   (only what includes the file recompiles; a kernel header recompiles the twin's kernel
   units, minutes in Release: FLASH_CANN_BUILD_TYPE=Debug builds about 5x faster and runs
   the tests slower). A native mutant that does not build is an error, not a catch --
   unless its entry's build_fails_with names the compile-time guard that must stop it
   (a -Werror diagnostic, a static_assert) and the build log shows that message;
3. pytest with PYTHONPATH=<copy>/python and CI=true (missing native tools fail instead of
   skipping), stopping at the first failure: exit status 1 = caught, 0 = survived,
   anything else (collection error, no tests, timeout) = error;
4. the file is restored; after a native mutant the build is brought back to the pristine
   sources before the worker's next Python mutant runs (Python mutants go first, so this
   happens rarely).

Before the mutants, every distinct test selection runs once on a pristine copy and must
pass (--no-baseline skips that): a selection that fails unmutated would "catch" anything,
so its mutants are reported as errors.
The run prints id, layer, result and seconds per mutant, then a summary (--json writes the
rows); it exits non-zero if any mutant survived or errored, or any snippet is not found
exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
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
# More lists, one per area, so that people adding mutants in parallel do not edit one file.
MORE_MUTANTS = Path(__file__).with_name("mutants")
# The layers the list must cover (issue 29), and those later issues added code to.
LAYERS = ("kernel", "race-detector", "triton", "cpu", "checks", "kvcache", "host-path",
          "planner", "model", "packaging", "api", "integrations", "layout")
NATIVE_SUFFIXES = {".c", ".cc", ".cpp", ".h", ".hpp", ".cmake"}
FIELDS = {"id", "layer", "file", "original", "replacement", "tests", "why"}
OPTIONAL = {"env", "timeout", "build_fails_with"}


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
    timeout: int = 1800
    # A compile-time guard's message (a -Werror diagnostic, a static_assert): a native
    # mutant whose build fails with it is caught by the build CI runs; any other build
    # failure stays an error (a replacement that does not compile proves nothing).
    build_fails_with: str = ""

    @property
    def native(self) -> bool:
        path = Path(self.file)
        return path.suffix in NATIVE_SUFFIXES or path.name == "CMakeLists.txt"

    def selection(self) -> tuple:
        return tuple(self.tests), tuple(sorted(self.env.items()))


def default_lists() -> list[Path]:
    return [MUTANTS, *sorted(MORE_MUTANTS.glob("*.yaml"))]


def load(paths: Path | list[Path] | None = None) -> list[Mutant]:
    """The mutant lists, checked for shape (not yet against the sources: see check)."""
    if paths is None:
        paths = default_lists()
    elif isinstance(paths, Path):
        paths = [paths]
    mutants, seen = [], set()
    for path in paths:
        mutants += _load_one(path, seen)
    return mutants


def _load_one(path: Path, seen: set[str]) -> list[Mutant]:
    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list):
        raise ListError(f"{path}: expected a list of mutants")
    mutants = []
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
    """The files a fresh clone of the working tree has (tracked, or untracked and not
    ignored); in a copy without git metadata, every file outside build outputs and caches."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=root, capture_output=True)
    if listed.returncode == 0:
        return [p for p in listed.stdout.decode().split("\0") if p]
    skip = {".git", ".venv", "build", "build_out", "__pycache__", ".pytest_cache",
            ".hypothesis"}
    return [str(path.relative_to(root)) for path in sorted(root.rglob("*"))
            if (path.is_file() or path.is_symlink())
            and not skip & set(path.relative_to(root).parts)]


def copy_tree(root: Path, files: list[str], dest: Path) -> None:
    """The working-tree content of the tracked files, symlinks kept as links, in a git
    repository of its own whose index holds exactly those files: tests that list the
    repository's files (`git ls-files`: the docs' clean copies, the citation rules) see
    in the copy what they see in a checkout."""
    copied = [rel for rel in files if os.path.lexists(root / rel)]  # not deleted in the tree
    for rel in copied:
        src, dst = root / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    for command in (["git", "init", "-q"], ["git", "add", "-f", "--", *copied]):
        subprocess.run(command, cwd=dest, check=True, capture_output=True)


def apply(m: Mutant, tree: Path) -> str:
    """Writes the mutant into the copy; returns the file's pristine text."""
    path = tree / m.file
    text = path.read_text()
    if text.count(m.original) != 1:
        raise ListError(f"{m.id}: snippet not found exactly once in the scratch copy")
    path.write_text(text.replace(m.original, m.replacement))
    return text


def native_build(tree: Path, build: Path, jobs: int) -> tuple[bool, str]:
    """Configures (once) and builds the host-only targets, as flash_cann.ascend.native does;
    later calls rebuild only what changed."""
    commands = [["cmake", "--build", str(build), "--parallel", str(jobs)]]
    if not (build / "CMakeCache.txt").is_file():
        commands.insert(0, ["cmake", "-S", str(tree / "op_project"), "-B", str(build),
                            "-DFLASH_CANN_HOST_ONLY=ON",
                            f"-DCMAKE_BUILD_TYPE={os.environ.get('FLASH_CANN_BUILD_TYPE', 'Release')}"])
    for command in commands:
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


class Worker:
    """One scratch copy and its host build; plants one mutant at a time."""

    def __init__(self, root: Path, files: list[str], home: Path, jobs: int, python: str,
                 build: Path | None = None):
        self.tree, self.build = home / "tree", build or home / "build"
        self.jobs, self.python = jobs, python
        copy_tree(root, files, self.tree)
        self.stale_build = True     # the build does not match the copy's sources

    def ensure_pristine_build(self) -> tuple[bool, str]:
        if not self.stale_build:
            return True, ""
        ok, log = native_build(self.tree, self.build, self.jobs)
        self.stale_build = not ok
        return ok, log

    def baseline(self, m: Mutant) -> tuple[str, str]:
        return pytest(self.tree, self.build, m.tests, m.env, self.python, m.timeout)

    def run(self, m: Mutant) -> tuple[str, str]:
        if not m.native:
            ok, log = self.ensure_pristine_build()
            if not ok:
                return "error (pristine build)", log
        pristine = apply(m, self.tree)
        try:
            if m.native:
                self.stale_build = True
                ok, log = native_build(self.tree, self.build, self.jobs)
                if not ok:
                    caught = bool(m.build_fails_with) and m.build_fails_with in log
                    return ("caught (build)" if caught else "error (does not build)"), log
            return pytest(self.tree, self.build, m.tests, m.env, self.python, m.timeout)
        finally:
            (self.tree / m.file).write_text(pristine)


def run_all(workers: list[Worker], jobs: list, task) -> list:
    """task(worker, job) for every job, each worker taking the next job when free; results
    in the order of jobs."""
    todo: queue.Queue = queue.Queue()
    for i, job in enumerate(jobs):
        todo.put((i, job))
    results: list = [None] * len(jobs)

    def loop(worker: Worker) -> None:
        while True:
            try:
                i, job = todo.get_nowait()
            except queue.Empty:
                return
            results[i] = task(worker, job)

    threads = [threading.Thread(target=loop, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="validate and list; run nothing")
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants")
    parser.add_argument("--layer", action="append", choices=LAYERS, help="run this layer")
    parser.add_argument("--file", action="append", metavar="PATH",
                        help="run the mutants of this source file (repeatable)")
    parser.add_argument("--kind", choices=("native", "python"),
                        help="run only the mutants of native code, or only the others")
    parser.add_argument("--mutants", type=Path, action="append",
                        help="a mutant list (repeatable); default: scripts/mutants.yaml and "
                             "scripts/mutants/*.yaml")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the pristine run of each test selection")
    parser.add_argument("--workers", type=int, default=1,
                        help="scratch copies run at once, each with its own build")
    parser.add_argument("--jobs", type=int, default=2, help="parallel build jobs per worker")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for pytest")
    parser.add_argument("--json", type=Path, help="write the result rows here")
    parser.add_argument("--deadline", type=float, metavar="SECONDS",
                        help="start no mutant after this many seconds (the rest: not run)")
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
    if args.file:
        mutants = [m for m in mutants if m.file in args.file]
    if args.kind:
        mutants = [m for m in mutants if m.native == (args.kind == "native")]
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
    lock = threading.Lock()
    rows: list[dict] = []
    try:
        files = tracked_files(ROOT)
        count = max(1, min(args.workers, len(mutants)))
        # Without native mutants every worker tests against one pristine build.
        shared = None if any(m.native for m in mutants) else scratch / "build"
        workers = [Worker(ROOT, files, scratch / f"worker{i}", args.jobs, args.python, shared)
                   for i in range(count)]
        if imports_from(workers[0].tree, args.python) != \
                (workers[0].tree / "python/flash_cann/__init__.py").resolve():
            print("mutate: PYTHONPATH does not select the scratch copy's flash_cann", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        builders = workers[:1] if shared else workers
        for (ok, log) in run_all(builders, builders, lambda w, _: w.ensure_pristine_build()):
            if not ok:
                print(f"mutate: the pristine native build failed:\n{log}", file=sys.stderr)
                return 2
        for w in workers:
            w.stale_build = False
        print(f"{count} scratch copies, {len(builders)} native builds: "
              f"{time.monotonic() - t0:.0f} s", flush=True)
        deadline = started + args.deadline if args.deadline else None
        # selections that fail unmutated (their mutants error) or were not run in time
        broken: dict[tuple, str] = {}
        if not args.no_baseline:
            selections = {}
            for m in mutants:
                selections.setdefault(m.selection(), m)

            def baseline(worker: Worker, m: Mutant) -> tuple[str, str]:
                t1 = time.monotonic()
                if deadline is not None and t1 > deadline:
                    return "not run (deadline)", ""
                state, log = worker.baseline(m)
                with lock:
                    print(f"baseline {' '.join(m.tests)}: "
                          f"{'passes' if state == 'survived' else state} "
                          f"({time.monotonic() - t1:.0f} s)", flush=True)
                    if state != "survived":
                        print("    " + log.strip().replace("\n", "\n    ")[-2000:], flush=True)
                return state, log

            results = run_all(workers, list(selections.values()), baseline)
            for key, (state, _) in zip(selections, results):
                if state != "survived":
                    broken[key] = (state if state.startswith("not run")
                                   else "error (selection fails unmutated)")

        def one(worker: Worker, m: Mutant) -> dict:
            t1 = time.monotonic()
            if m.selection() in broken:
                state, log = broken[m.selection()], ""
            elif deadline is not None and t1 > deadline:
                state, log = "not run (deadline)", ""
            else:
                state, log = worker.run(m)
            row = {"id": m.id, "layer": m.layer, "file": m.file, "result": state,
                   "seconds": round(time.monotonic() - t1, 1)}
            with lock:
                rows.append(row)
                if args.json:  # as it goes: a run stopped from outside keeps what it did
                    write_json(args.json, rows)
                print(f"{m.id:40} {m.layer:14} {state:10} {row['seconds']:6.0f} s", flush=True)
                if args.verbose or not state.startswith("caught"):
                    print("    " + log.strip().replace("\n", "\n    ")[-2000:], flush=True)
            return row

        # Python mutants first: they share the pristine build, which a native one disturbs.
        ordered = sorted(mutants, key=lambda m: m.native)
        rows = run_all(workers, ordered, one)
    finally:
        if args.keep:
            print(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    print()
    print("| id | layer | result | seconds |\n|---|---|---|---:|")
    for row in rows:
        print(f"| {row['id']} | {row['layer']} | {row['result']} | {row['seconds']:.0f} |")
    caught = sum(r["result"].startswith("caught") for r in rows)
    survived = sum(r["result"] == "survived" for r in rows)
    not_run = sum(r["result"].startswith("not run") for r in rows)
    errors = len(rows) - caught - survived - not_run
    print(f"\n{len(rows)} mutants: {caught} caught, {survived} survived, {errors} errors, "
          f"{not_run} not run; "
          f"{time.monotonic() - started:.0f} s in all")
    if args.json:
        write_json(args.json, rows)
    return 0 if caught == len(rows) else 1


def write_json(path: Path, rows: list[dict]) -> None:
    """The result rows and their counts by result (caught, survived, not run, errors)."""
    counts = {"caught": 0, "survived": 0, "not_run": 0, "errors": 0}
    for row in rows:
        result = row["result"]
        key = ("not_run" if result.startswith("not run") else "caught" if result.startswith("caught")
               else "survived" if result == "survived" else "errors")
        counts[key] += 1
    path.write_text(json.dumps({"rows": rows, **counts}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
