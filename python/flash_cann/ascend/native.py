"""The native host-only build: the tiling planner and the Ascend C kernel on the CPU
twin, built with CMake from ``op_project/`` on first use (``build.sh --host-only`` runs
the same configuration).

Where the sources come from: the checkout when flash_cann runs from one (``pip install
-e .``, ``PYTHONPATH=python``), else the copies an installed wheel carries in
``native_sources/`` (links into the checkout at build time). The build lives in
``<repo>/build/host`` for a checkout and in ``~/.cache/flash_cann/<version>/host`` for a
wheel (override with ``FLASH_CANN_BUILD_DIR``); it is incremental, so later calls cost a
no-op ``cmake --build``. ``FLASH_CANN_BUILD_TYPE=Debug`` configures a new build directory
unoptimised, with debug info (a debugger on the twin; about 5x faster to compile, slower
to run); the default is Release.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[3]
SHIPPED = Path(__file__).resolve().parent / "native_sources"
FROM_CHECKOUT = (CHECKOUT / "op_project" / "CMakeLists.txt").is_file()
ROOT = CHECKOUT if FROM_CHECKOUT else SHIPPED
PROJECT = ROOT / "op_project"


class NativeBuildError(RuntimeError):
    """The host-only CMake build is unavailable or failed."""


def build_dir() -> Path:
    if "FLASH_CANN_BUILD_DIR" in os.environ:
        return Path(os.environ["FLASH_CANN_BUILD_DIR"])
    if FROM_CHECKOUT:
        return CHECKOUT / "build" / "host"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "flash_cann" / _version() / "host"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("flash-cann")
    except PackageNotFoundError:
        return "unknown"


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise NativeBuildError(f"flash_cann: `{' '.join(command)}` failed:\n{output}")


def unavailable_reason() -> str | None:
    """None if the native build can run here, else what is missing, in one line."""
    if not (PROJECT / "CMakeLists.txt").is_file():
        return (f"the planner and the CPU twin are built from their C++ sources, and "
                f"{PROJECT} is missing: reinstall flash-cann (its wheel ships them)")
    if shutil.which("cmake") is None:
        return ("cmake (>= 3.16) and a C++17 compiler are needed to build the "
                "planner and the CPU twin")
    return None


def _build_type() -> str:
    value = os.environ.get("FLASH_CANN_BUILD_TYPE", "Release")
    if value not in ("Release", "Debug"):
        raise NativeBuildError(f"flash_cann: FLASH_CANN_BUILD_TYPE must be Release or Debug "
                               f"(got {value!r})")
    return value


@functools.lru_cache(maxsize=None)
def build() -> Path:
    """Configure (once) and build the host-only targets; return the build directory."""
    reason = unavailable_reason()
    if reason is not None:
        raise NativeBuildError(f"flash_cann: {reason}")
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "w") as lock:  # one build at a time (tests, CLI)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "CMakeCache.txt").is_file():
            # The first build compiles the planner and the twin: up to a minute of silence.
            print(f"flash_cann: building the planner and the CPU twin in {out} (first use; "
                  f"about a minute)...", file=sys.stderr, flush=True)
            _run(["cmake", "-S", str(PROJECT), "-B", str(out), "-DFLASH_CANN_HOST_ONLY=ON",
                  f"-DCMAKE_BUILD_TYPE={_build_type()}"])
        _run(["cmake", "--build", str(out), "--parallel", str(os.cpu_count() or 1)])
    return out


def artefact(relative: str) -> Path:
    """Path of a built file, e.g. ``planner/libflash_cann_planner.so``."""
    path = build() / relative
    if not path.exists():
        raise NativeBuildError(f"flash_cann: the build did not produce {path}")
    return path
