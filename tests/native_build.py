"""Test helper: the host-only native build (planner, CANN-shell stand-in driver, twin),
built once per session with the same CMake configuration as `build.sh --host-only`, and
the native tools the suite needs.

Without a tool, its tests skip on a contributor's machine; under CI=true the session
fails at once instead (conftest.py), so a broken CI image cannot pass as ~160 skips."""

from __future__ import annotations

import json
import os
import re
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


# The suite's first native build in a fresh clone is the documented host-only build, run
# as docs/packaging.md prints it: CI then runs that command for free, instead of a second
# build of the same targets in a copy. Its record says what ran and how it ended.
DOCUMENTED_BUILD = re.compile(r"^\./build\.sh --host-only$")
RECORD_NAME = ".documented-build.json"


def documented_build_command() -> str:
    from doc_commands import ALL_DOCS, documented_commands

    found = documented_commands(ALL_DOCS, DOCUMENTED_BUILD)
    if len(found) != 1:
        raise AssertionError(f"expected one `./build.sh --host-only` line in the docs, found "
                             f"{sorted(found) or 'none'}")
    return next(iter(found))


def documented_build_applies() -> bool:
    """The checkout's own build/host is used and nothing is built there yet."""
    if "FLASH_CANN_BUILD_DIR" in os.environ or not native.FROM_CHECKOUT:
        return False
    return not (native.build_dir() / "CMakeCache.txt").is_file()


def run_documented_build() -> None:
    """Runs the documented command in the checkout and records the command, its exit
    status, the output's tail and whether build/host was fresh when it started. build.sh
    takes native.build's lock itself, so the workers' builds wait for it (holding the
    lock here would deadlock it)."""
    out = native.build_dir()
    fresh = not (out / "CMakeCache.txt").is_file()
    command = documented_build_command()
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH",
                        "FLASH_CANN_BUILD_TYPE")}
    done = subprocess.run(["bash", "-c", command], cwd=native.CHECKOUT, env=env,
                          capture_output=True, text=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD_NAME).write_text(json.dumps({
        "command": command, "returncode": done.returncode, "fresh": fresh,
        "tail": (done.stdout + done.stderr)[-4000:]}))


def documented_build_record() -> dict | None:
    path = native.build_dir() / RECORD_NAME
    return json.loads(path.read_text()) if path.is_file() else None
