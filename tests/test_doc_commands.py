"""Every command the docs print for building and installing (README.md, docs/npu.md,
docs/packaging.md, their fenced bash blocks), and which test runs it as printed.

RUN_BY names, for each command, the tests that read it from the docs and run it (through
``bash -c``, in a clean copy of the repository or, for the host-only build, in the fresh
clone CI runs in), or why nothing here can run it. A command
added to or changed in a doc fails ``test_every_documented_command_has_a_test`` until it is
listed here, so a doc change is a test change. This module also runs the ``./build.sh``
lines that no other test runs: ``--host-only`` (the real host-only build: in a fresh
clone the suite's own first build, conftest.py; full tier only, no time limit), ``--help``
and the ``--cann-path`` line.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from doc_commands import ALL_DOCS, clean_copy, documented_commands, every_command
import native_build
from native_build import needs

ROOT = Path(__file__).resolve().parents[1]
NO_CANN = "not run: needs the CANN toolkit, which no machine here has"

RUN_BY = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e .":
        "not run as printed: it downloads torch; CI's .ci/run runs the same line with the "
        "test extra (`-e '.[test]'`, the README's test command below)",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && "
    "flash-cann demo":
        "not run as printed: it downloads torch; `flash-cann demo` runs in "
        "tests/test_cli.py::test_demo_runs_and_passes_its_accuracy_check",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e '.[test]' "
    "&& python -m pytest -q -n 2":
        ["tests/test_suite_rules.py::test_ci_runs_the_readme_test_command"],
    "source /usr/local/Ascend/ascend-toolkit/set_env.sh": NO_CANN + " (CANN's own script)",
    "./build.sh": [
        "tests/test_package.py::test_documented_build_command_without_cann_says_what_is_missing"],
    "./build.sh --cann-path=/usr/local/Ascend/ascend-toolkit/latest --soc=ascend910b":
        ["tests/test_doc_commands.py::test_documented_cann_path_build_parses_and_names_the_path"],
    "./build.sh --host-only":
        ["tests/test_doc_commands.py::test_documented_host_only_build_runs_as_printed"],
    "./build.sh --help": ["tests/test_doc_commands.py::test_documented_build_help_runs_as_printed"],
    "./build_out/custom_opp_<os>_<arch>.run":
        ["tests/test_package.py::test_documented_install_commands_run_as_printed"],
    "source DIR/vendors/flash_cann/bin/set_env.bash":
        ["tests/test_package.py::test_documented_install_commands_run_as_printed"],
    "pip install --no-build-isolation ./framework":
        ["tests/test_framework_install.py::test_the_documented_command_builds_and_installs_the_extension",
         "tests/test_framework_install.py::"
         "test_every_symbol_of_the_installed_extension_resolves_in_the_real_libraries"],
    "pip install build_out/flash_cann_npu-*.whl":
        ["tests/test_framework_install.py::test_the_documented_wheel_builds_and_installs"],
    "flash-cann doctor": ["tests/test_doctor.py::test_the_documented_doctor_command_runs_as_printed"],
    "python -c \"from flash_cann.backends.npu import launcher; "
    "print(launcher.unavailable_reason() or 'NPU backend ready')\"":
        ["tests/test_doctor.py::test_the_documented_readiness_check_runs_as_printed"],
    "pip install triton-ascend==3.2.0":
        ["tests/test_doc_commands.py::test_the_documented_triton_ascend_pin_is_the_tested_one"],
    "python -c \"import torch, torch_npu, flash_cann; ...\"":
        "not run: a placeholder for the user's code, needing torch_npu with CANN",
}


def test_every_documented_command_has_a_test():
    printed = every_command()
    assert set(printed) - set(RUN_BY) == set(), (
        "commands printed in the docs that RUN_BY does not list (add the test that runs each "
        "as printed, or why none can)")
    assert set(RUN_BY) - set(printed) == set(), "RUN_BY lists commands no doc prints any more"


def _test_exists(node_id: str) -> bool:
    path, name = node_id.split("::")
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body)


def test_every_named_test_exists():
    named = [test for tests in RUN_BY.values() if isinstance(tests, list) for test in tests]
    assert [test for test in named if not _test_exists(test)] == []
    reasons = [why for why in RUN_BY.values() if isinstance(why, str)]
    assert all(why.startswith("not run") for why in reasons)


def test_the_inventory_finds_commands_and_skips_comments(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\n# a comment\n./build.sh --x   # why\n\n   # more\n```\n"
                   "```python\nimport x\n```\n./build.sh --y\n")
    assert every_command([doc]) == {"./build.sh --x": ["doc.md"]}


# --- the ./build.sh lines no other test runs -------------------------------------------------

def _build_sh_lines(pattern: str) -> list[str]:
    found = documented_commands(ALL_DOCS, re.compile(pattern))
    assert found, f"no line matching {pattern!r} in {[p.name for p in ALL_DOCS]}"
    return list(found)


def _without_cann() -> dict:
    return {k: v for k, v in os.environ.items()
            if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")}


def _run_printed(command: str, clone: Path, env: dict | None = None):
    return subprocess.run(["bash", "-c", command], cwd=clone, env=env or _without_cann(),
                          capture_output=True, text=True)


@needs("cmake", "g++")
def test_documented_host_only_build_runs_as_printed():
    """`./build.sh --host-only` as docs/packaging.md prints it, in the checkout: it builds
    the host-only targets into build/host with the configuration the Python package uses
    (python/flash_cann/ascend/native.py), so that the package then finds its planner and
    twin built and builds nothing more. In a fresh clone run with xdist (CI) the suite's
    first build was this command (conftest.py) and its record is checked; otherwise the
    command runs here (incremental where build/host exists)."""
    command = native_build.documented_build_command()
    assert re.fullmatch(r"\./build\.sh --host-only", command)
    record = native_build.documented_build_record()
    if record is None:
        done = _run_printed(command, ROOT)
        record = {"command": command, "returncode": done.returncode,
                  "tail": (done.stdout + done.stderr)[-4000:]}
    assert record["command"] == command
    assert record["returncode"] == 0, f"`{command}`:\n{record['tail']}"
    host = ROOT / "build" / "host"
    cache = (host / "CMakeCache.txt").read_text()
    assert "FLASH_CANN_HOST_ONLY:BOOL=ON" in cache and "CMAKE_BUILD_TYPE:STRING=Release" in cache
    libraries = [host / "planner" / "libflash_cann_planner.so",
                 host / "twin" / "libflash_cann_twin.so"]
    assert [lib for lib in libraries if not lib.is_file()] == []
    built = {lib: lib.stat().st_mtime_ns for lib in libraries}
    probe = ("from flash_cann.ascend import native, planner; "
             "print(native.artefact('twin/libflash_cann_twin.so')); "
             "print(planner.plan('Ascend910B2', 1, 8, 1024, 128, dtype='float16', "
             "layout='BNSD', causal=True)['block_dim'])")
    env = dict(_without_cann(), PYTHONPATH=str(ROOT / "python"))
    env.pop("FLASH_CANN_BUILD_DIR", None)
    env.pop("FLASH_CANN_BUILD_TYPE", None)
    used = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert used.returncode == 0, used.stderr
    assert used.stdout.splitlines()[0] == str(host / "twin" / "libflash_cann_twin.so")
    assert int(used.stdout.splitlines()[1]) > 0
    assert "building the planner" not in used.stderr, "the package configured a new build"
    assert {lib: lib.stat().st_mtime_ns for lib in libraries} == built, \
        "the package rebuilt what build.sh --host-only had built"


def test_documented_build_help_runs_as_printed(tmp_path):
    clone = clean_copy(tmp_path / "clone")
    for command in _build_sh_lines(r"^\./build\.sh --help$"):
        done = _run_printed(command, clone)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("Usage: ./build.sh")
        for option in ("--cann-path=DIR", "--soc=LIST", "--host-only", "--torch-npu-extension"):
            assert option in done.stdout


def test_documented_cann_path_build_parses_and_names_the_path(tmp_path):
    """The `--cann-path=... --soc=...` line as printed: its options are accepted, and
    without that toolkit it stops naming the path, having built nothing (the CANN build
    itself is never run here: docs/packaging.md)."""
    clone = clean_copy(tmp_path / "clone")
    for command in _build_sh_lines(r"^\./build\.sh --cann-path="):
        cann = re.search(r"--cann-path=(\S+)", command).group(1)
        if Path(cann).exists():
            pytest.skip(f"{cann} exists: this is a CANN machine, where the line builds for real")
        done = _run_printed(command, clone)
        assert done.returncode != 0
        assert f"--cann-path='{cann}' is not a directory" in done.stderr, done.stderr
        assert not (clone / "build_out").exists()


def test_the_documented_triton_ascend_pin_is_the_tested_one():
    """docs/npu.md's `pip install triton-ascend==X` is the pin scripts/triton_ascend_env.sh
    installs for tests/test_triton_npu.py's lowering (the command itself downloads from
    PyPI: the script runs it, with its other pins)."""
    (command,) = _build_sh_lines(r"^pip install triton-ascend==")
    printed = re.search(r"triton-ascend==(\S+)", command).group(1)
    script = (ROOT / "scripts" / "triton_ascend_env.sh").read_text()
    assert re.search(r"\btriton-ascend==(\S+?)\s", script).group(1) == printed
