"""Rules of the suite itself: under CI=true missing native tools fail the run instead of
skipping its native tests; the fast tier (-m fast) takes only what conftest lists."""

from __future__ import annotations

import os
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
