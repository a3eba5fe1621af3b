"""A built wheel, installed, keeps what the checkout has: `flash-cann plan` and the twin
build from the C++ sources the wheel ships (flash_cann/ascend/native_sources), with no
checkout beside it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import native_build

ROOT = Path(__file__).resolve().parents[1]


def _source_copy(destination: Path) -> Path:
    """The checkout without what builds and installs leave in it (links kept), so that
    the wheel is built from the sources alone, never from a stale build/ directory."""
    shutil.copytree(ROOT, destination, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "build_out", "__pycache__", "*.egg-info", ".pytest_cache"))
    return destination


@native_build.needs("cmake", "g++")
def test_an_installed_wheel_builds_the_planner_and_the_twin(tmp_path):
    source = _source_copy(tmp_path / "checkout")
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation,
                    "-w", str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("flash_cann-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install puts in site-packages
    # Debug: the test asks whether the shipped sources build, not how fast they run (an
    # unoptimised build compiles about 5x faster).
    env = dict(os.environ, PYTHONPATH=str(site), FLASH_CANN_BUILD_DIR=str(tmp_path / "build"),
               FLASH_CANN_BUILD_TYPE="Debug")
    run = [sys.executable, "-m", "flash_cann", "plan", "--shape", "1,8,1024,128", "--causal"]
    done = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tiling" in done.stdout.lower(), done.stdout
    probe = ("import flash_cann.ascend.native as n; print(n.FROM_CHECKOUT, n.PROJECT); "
             "print(n.artefact('twin/libflash_cann_twin.so'))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from_checkout, project = done.stdout.split("\n")[0].split(" ", 1)
    assert from_checkout == "False" and project.startswith(str(site)), done.stdout


def test_an_unknown_build_type_is_refused_by_name(monkeypatch):
    from flash_cann.ascend import native

    monkeypatch.setenv("FLASH_CANN_BUILD_TYPE", "Fast")
    with pytest.raises(native.NativeBuildError, match="FLASH_CANN_BUILD_TYPE must be Release "
                                                      "or Debug"):
        native._build_type()
    monkeypatch.setenv("FLASH_CANN_BUILD_TYPE", "Debug")
    assert native._build_type() == "Debug"
