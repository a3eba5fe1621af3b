"""The NPU tier's collection and selection, checked where there is no NPU: `-m npu` selects
exactly tests/test_npu_tier.py's tests, they are collected by the default run (CI's command)
and all skip there saying why, and skipping them leaves pytest's exit status 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASCEND_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_OPP_PATH", "ASCEND_CUSTOM_OPP_PATH",
                    "FAKE_TORCH_NPU_LIB")


def _pytest(*args: str):
    env = {k: v for k, v in os.environ.items() if k not in ASCEND_VARIABLES}
    env["PYTHONPATH"] = str(ROOT / "python")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True)


def _collected(done) -> list[str]:
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_marker_selects_exactly_the_npu_tier():
    tier = _collected(_pytest("--collect-only", "-q", "tests/test_npu_tier.py"))
    assert len(tier) >= 30, tier
    selected = _collected(_pytest("--collect-only", "-q", "-m", "npu",
                                  "tests/test_npu_tier.py", "tests/test_doctor.py"))
    assert selected == tier
    deselected = _collected(_pytest("--collect-only", "-q", "-m", "not npu",
                                    "tests/test_npu_tier.py"))
    assert deselected == []
    names = {re.sub(r"\[.*", "", line.split("::")[1]) for line in tier}
    for covered in ("forward_and_backward", "dropout", "deterministic", "tnd", "decode",
                    "npu_graph", "compiled"):
        assert any(covered in name for name in names), f"no {covered} test in the NPU tier"


def test_without_an_npu_every_tier_test_skips_saying_why_and_pytest_exits_0():
    done = _pytest("-q", "-rs", "-m", "npu", "tests/test_npu_tier.py")
    assert done.returncode == 0, done.stdout[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"=*\s*\d+ skipped in .*", summary), summary
    reasons = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert reasons and all("needs an Ascend NPU with the flash-cann package and extension: "
                           "torch_npu is not installed" in line for line in reasons), reasons[:3]
