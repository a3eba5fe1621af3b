"""Under CI=true, missing native tools fail the run instead of skipping its native tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_ci_without_cmake_or_compiler_fails(tmp_path):
    env = {**os.environ, "CI": "true", "PATH": str(tmp_path)}  # an empty PATH: no tools
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--collect-only", str(HERE / "test_cli.py")],
                         env=env, capture_output=True, text=True, timeout=300, cwd=HERE.parent)
    assert run.returncode != 0, run.stdout
    assert "CI=true but cmake, g++, gcc not found" in run.stderr + run.stdout
