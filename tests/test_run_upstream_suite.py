"""scripts/run_upstream_suite.py on a stand-in upstream file (tests/upstream_fake/): the
file imports flash_attn with only the alias installed, and the runner prints the counts
and the reasons grouped, in one process and with pytest-xdist's workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAKE = REPO / "tests" / "upstream_fake" / "fake_test_flash_attn.py"


def _run(*pytest_args):
    env = {k: v for k, v in os.environ.items() if k != "FLASH_CANN_AS_FLASH_ATTN"}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "run_upstream_suite.py"),
                           str(FAKE), "-q", *pytest_args], capture_output=True, text=True,
                          timeout=3600, cwd=REPO, env=env)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_counts_and_grouped_reasons(workers):
    run = _run(*workers)
    assert run.returncode == 1, run.stdout + run.stderr  # pytest's: tests failed
    summary = run.stdout[run.stdout.index("upstream suite through flash_cann's alias"):]
    assert ("1 passed, 3 failed, 1 error, 1 skipped, 1 xfailed, 0 xpassed"
            in summary.splitlines()[0]), summary
    lines = summary.splitlines()
    one_reason = next(i for i, line in enumerate(lines)
                      if "failed: RuntimeError: block_table holds N blocks, too few" in line)
    assert lines[one_reason].split()[0] == "2"  # both parameters, one group, listed first
    assert "test_fails_for_one_reason[3]" in summary and "test_fails_for_one_reason[17]" in summary
    assert any(line.split()[0] == "1" and "failed: assert" in line for line in lines)
    assert any("error: ValueError: fixture could not start" in line for line in lines)
    assert any("needs flash-attn's compiled CUDA module" in line for line in lines)


def test_pytest_arguments_pass_through():
    run = _run("-k", "passes")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 0 failed, 0 error, 0 skipped" in run.stdout


def test_a_missing_file_is_named():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "run_upstream_suite.py"),
                          "no/such/test_flash_attn.py"], capture_output=True, text=True,
                         timeout=3600, cwd=REPO)
    assert run.returncode == 2 and "no such file" in run.stderr
