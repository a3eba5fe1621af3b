"""Test helper: the real torch-npu wheel's C++ headers and libtorch_npu.so, to build the
NPU extension against.

The wheel is downloaded from PyPI with pip (``pip download``, no install: installed
without CANN, torch_npu breaks ``import torch``) into ``build/torch_npu_wheel`` and only
``torch_npu/include/`` and ``torch_npu/lib/libtorch_npu.so`` are unpacked. Nothing of it
is committed. If it cannot be had, the test skips with the reason -- and fails under
``CI=true``, where the real headers are the point. A file lock makes the download and
unpacking one process's (pytest-xdist workers share ``build/``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

VERSION = "2.13.0"  # pairs with torch 2.13 (torch_npu's version table)
CACHE = Path(__file__).resolve().parents[1] / "build" / "torch_npu_wheel" / VERSION
LIBRARY = "torch_npu/lib/libtorch_npu.so"


def _unavailable(reason: str):
    message = f"the torch-npu {VERSION} wheel is needed: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _download() -> Path:
    download = CACHE / "download"
    wheels = sorted(download.glob("torch_npu-*.whl"))
    if wheels:
        return wheels[0]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", "-d", str(download),
             f"torch-npu=={VERSION}"], capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as err:
        _unavailable(f"pip download failed: {err}")
    wheels = sorted(download.glob("torch_npu-*.whl"))
    if done.returncode or not wheels:
        _unavailable(f"pip download torch-npu=={VERSION} failed: "
                     f"{(done.stderr or done.stdout).strip()[-500:]}")
    return wheels[0]


def torch_npu_wheel() -> Path:
    """The unpacked wheel's ``torch_npu`` directory (``include/``, ``lib/libtorch_npu.so``)."""
    if torch.__version__.split("+")[0].rsplit(".", 1)[0] != VERSION.rsplit(".", 1)[0]:
        _unavailable(f"its headers pair with torch {VERSION.rsplit('.', 1)[0]}, this is "
                     f"torch {torch.__version__}")
    unpacked = CACHE / "unpacked"
    done = unpacked / ".complete"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            with zipfile.ZipFile(_download()) as wheel:
                members = [m for m in wheel.namelist()
                           if m.startswith("torch_npu/include/") or m == LIBRARY]
                if LIBRARY not in members:
                    _unavailable(f"{wheel.filename} has no {LIBRARY}")
                wheel.extractall(unpacked, members)
            done.touch()
    return unpacked / "torch_npu"
