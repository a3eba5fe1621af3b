"""Test helper: the host-only native build (planner, CANN-shell stand-in driver, twin),
built once per session with the same CMake configuration as `build.sh --host-only`."""

from __future__ import annotations

import subprocess

import pytest

from flash_cann import native


def built(relative: str):
    """Path of a native artefact; skips the test if the toolchain is missing."""
    try:
        return native.artefact(relative)
    except native.NativeBuildError as error:
        if "cmake (>= 3.16)" in str(error):
            pytest.skip(str(error))
        raise


def run(relative: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(built(relative)), *args], capture_output=True, text=True,
                          timeout=600)
