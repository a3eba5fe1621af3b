"""The shared libraries Python loads with ctypes export their C ABI and nothing else.

Anything more is a hazard in a process that holds torch: a toolchain that links libstdc++
statically exports that copy of it, the dynamic linker then resolves part of the library
against torch's libstdc++ and part against its own, and the first call crashes (seen on
an image whose g++ wrapper links libstdc++ statically, with torch 2.11 on Python 3.12).
op_project/CMakeLists.txt gives both libraries a version script; this checks its effect
on the libraries as built here, whatever the toolchain.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from native_build import ON_CI, built

LIBRARIES = ("planner/libflash_cann_planner.so", "twin/libflash_cann_twin.so")


def defined_dynamic_symbols(path) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        message = "nm (binutils) is needed to read the libraries' dynamic symbols"
        if ON_CI:
            pytest.fail(message)
        pytest.skip(message)
    listing = subprocess.run([nm, "-D", "--defined-only", "--format=posix", str(path)],
                             capture_output=True, text=True, check=True, timeout=3600)
    return [line.split()[0] for line in listing.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("relative", LIBRARIES)
def test_only_the_c_abi_is_exported(relative):
    symbols = defined_dynamic_symbols(built(relative))
    assert symbols, f"{relative} exports nothing"
    others = [name for name in symbols if not name.startswith("flash_cann_")]
    assert not others, f"{relative} exports {len(others)} symbols beyond its C ABI, e.g. {others[:5]}"


def test_every_bound_function_is_exported():
    """The version script hides no function the Python side binds (binding sets argtypes
    on each, which fails for a missing one)."""
    from flash_cann.ascend import planner
    from flash_cann.backends.twin import launcher
    planner._library()
    launcher._library()
