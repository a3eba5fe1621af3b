"""The command line: `flash-cann demo` runs the main job end to end, and what cannot run
here is said in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flash_cann.tools import cli
from flash_cann.ascend import native
from flash_cann.contract import ops


def test_demo_runs_and_passes_its_accuracy_check():
    result = subprocess.run([sys.executable, "-m", "flash_cann", "demo", "--seqlen", "1024"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accuracy: PASS" in result.stdout
    for reference in ("torch SDPA (fused)", "naive (materialising)"):
        assert f"flash_cann vs {reference}:" in result.stdout, result.stdout
    assert "less memory" in result.stdout
    assert "timing flash_cann (3 runs after a warm-up)" in result.stdout


def test_help_lists_the_commands_without_markup():
    result = subprocess.run([sys.executable, "-m", "flash_cann", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "demo" in result.stdout
    assert "``" not in result.stdout


def test_plan_help_gives_every_option_help_and_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for needle in ("--dtype {fp16,bf16,float16,bfloat16} input dtype (default: fp16)",
                   "(default: BNSD)", "--causal bottom-right aligned causal mask (default: off)",
                   "default: ascend910b2"):
        assert needle in out, needle


def _one_line_error(capsys, argv):
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["demo", "--backend", "triton"], "flash-cann demo: backend 'triton' (device type 'cuda') "
                                      "cannot run here: install triton"),
    (["demo", "--device", "cuda"], "backend 'triton' (device type 'cuda') cannot run here"),
    (["demo", "--device", "npu"], "backend 'npu' (device type 'npu') cannot run here: "),
    (["demo", "--device", "cpu", "--backend", "triton"],
     "--backend triton runs on device type(s) cuda, npu, not --device cpu"),
])
def test_demo_says_in_one_line_what_is_missing(argv, message, capsys, monkeypatch):
    # As on a machine without a GPU or an NPU, whatever this one has.
    is_available = ops.is_available
    monkeypatch.setattr(ops, "is_available", lambda backend, device_type=None: (
        (device_type or backend.device_type) == "cpu" and is_available(backend, device_type)))
    assert message in _one_line_error(capsys, argv)


@pytest.mark.parametrize("argv, message", [
    (["demo", "--seqlen", "0"], "argument --seqlen: must be a positive integer (got '0')"),
    (["demo", "--seqlen", "x"], "argument --seqlen: must be a positive integer (got 'x')"),
    (["demo", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["demo", "--backend", "nope"], "argument --backend: invalid choice: 'nope'"),
])
def test_demo_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["plan", "--shape", "1,8,128,64"],
                                  ["demo", "--backend", "twin"]])
def test_without_the_native_sources_commands_say_so_in_one_line(argv, capsys, monkeypatch,
                                                                 tmp_path):
    """The C++ sources are missing (a wheel's native_sources/ deleted, say)."""
    monkeypatch.setattr(native, "PROJECT", tmp_path / "op_project")
    native.build.cache_clear()
    try:
        line = _one_line_error(capsys, argv)
    finally:
        native.build.cache_clear()
    assert "built from their C++ sources" in line and "reinstall flash-cann" in line


def test_first_build_says_what_it_is_doing(capsys, monkeypatch, tmp_path):
    commands = []
    monkeypatch.setattr(native, "_run", commands.append)
    monkeypatch.setenv("FLASH_CANN_BUILD_DIR", str(tmp_path))
    native.build.cache_clear()
    try:
        native.build()
    finally:
        native.build.cache_clear()
    assert "building the planner and the CPU twin" in capsys.readouterr().err
    assert [c[1] for c in commands] == ["-S", "--build"]


@pytest.mark.parametrize("preset, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_import_before_torch_makes_openmp_wait_passively(preset, expected):
    """Spinning OpenMP threads collapse the CPU backend beside a busy process
    (benchmarks/cpu_contention.py); the user's own setting wins."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    result = subprocess.run([sys.executable, "-c", "import os, flash_cann; "
                             "print(os.environ['OMP_WAIT_POLICY'])"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.stdout.split() == [expected], result.stderr
