"""Rules of the suite itself: under CI=true missing native tools fail the run instead of
skipping its native tests; the fast tier (-m fast) takes only what conftest lists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest

HERE = Path(__file__).resolve().parent


def test_ci_without_cmake_or_compiler_fails(tmp_path):
    env = {**os.environ, "CI": "true", "PATH": str(tmp_path)}  # an empty PATH: no tools
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--collect-only", str(HERE / "test_cli.py")],
                         env=env, capture_output=True, text=True, timeout=300, cwd=HERE.parent)
    assert run.returncode != 0, run.stdout
    assert "CI=true but cmake, g++, gcc not found" in run.stderr + run.stdout


def _item(module: str, **params):
    return SimpleNamespace(path=HERE / module,
                           callspec=SimpleNamespace(params=params) if params else None)


def test_fast_tier_is_what_conftest_lists():
    assert conftest._is_fast(_item("test_api.py"))
    assert not conftest._is_fast(_item("test_a_new_module.py"))  # full tier by default
    assert conftest._is_fast(_item("test_accuracy.py", head_dim=64, seqlens=(128, 128)))
    assert not conftest._is_fast(_item("test_accuracy.py", head_dim=64, seqlens=(1000, 128)))
    assert not conftest._is_fast(_item("test_accuracy.py", head_dim=256, seqlens=(1, 1)))


def test_nothing_cites_files_outside_the_repository():
    """Sources are the repository's files or public ones (repository + path): never the
    team's private notes (shared/..., /work/...), which a reader of the repository cannot
    open."""
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True,
                           cwd=HERE.parent).stdout.split()
    private = re.compile(r"(^|[^A-Za-z0-9_./-])(/work/|shared/)")
    cited = [f"{name}:{number}" for name in files if name != "tests/test_suite_rules.py"
             for number, line in enumerate(_text(HERE.parent / name), 1)
             if private.search(line)]
    assert cited == []


def _text(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return []  # binary files (results, images) cite nothing
