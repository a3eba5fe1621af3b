"""The command line: `flash-cann demo` runs the main job end to end."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_passes_its_accuracy_check():
    result = subprocess.run([sys.executable, "-m", "flash_cann", "demo", "--seqlen", "1024"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accuracy: PASS" in result.stdout
    assert "standard attention" in result.stdout and "less memory" in result.stdout


def test_help_lists_the_commands():
    result = subprocess.run([sys.executable, "-m", "flash_cann", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "demo" in result.stdout
