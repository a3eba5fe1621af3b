"""Test helper: the host-only native build (planner, CANN-shell stand-in driver, twin),
built once per session with the same CMake configuration as `build.sh --host-only`, and
the native tools the suite needs.

Without a tool, its tests skip on a contributor's machine; under CI=true the session
fails at once instead (conftest.py), so a broken CI image cannot pass as ~160 skips."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from flash_cann.ascend import native

# cmake (>= 3.16) and a C++17 compiler build the planner, the twin and the stand-ins;
# gcc builds the C stand-in libraries of the NPU extension's tests.
NATIVE_TOOLS = ("cmake", "g++", "gcc")
ON_CI = os.environ.get("CI") == "true"


def missing(*tools: str) -> list[str]:
    return [tool for tool in tools or NATIVE_TOOLS if shutil.which(tool) is None]


def needs(*tools: str) -> pytest.MarkDecorator:
    """Skip marker for tests that need ``tools`` (never reached on CI without them)."""
    absent = missing(*tools)
    return pytest.mark.skipif(bool(absent), reason=f"needs {' and '.join(absent)}")


def built(relative: str):
    """Path of a native artefact; skips the test if the toolchain is missing (fails
    under CI=true)."""
    try:
        return native.artefact(relative)
    except native.NativeBuildError as error:
        if "cmake (>= 3.16)" in str(error) and not ON_CI:
            pytest.skip(str(error))
        raise


def run(relative: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(built(relative)), *args], capture_output=True, text=True,
                          timeout=3600)
