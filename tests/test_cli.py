"""The command line: `flash-cann demo` runs the main job end to end, and what cannot run
here is said in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import native_build

from flash_cann.tools import cli
from flash_cann.ascend import native, planner
from flash_cann.contract import ops


def test_demo_runs_and_passes_its_accuracy_check():
    result = subprocess.run([sys.executable, "-m", "flash_cann", "demo", "--seqlen", "1024"],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "accuracy: PASS" in result.stdout
    for reference in ("torch SDPA (fused)", "naive (materialising)"):
        assert f"flash_cann vs {reference}:" in result.stdout, result.stdout
    assert "its peak memory (< 1: less)" in result.stdout
    assert "timing flash_cann (3 runs after a warm-up)" in result.stdout


def test_help_lists_the_commands_without_markup():
    result = subprocess.run([sys.executable, "-m", "flash_cann", "--help"], capture_output=True,
                            text=True, timeout=3600)
    assert result.returncode == 0 and "demo" in result.stdout
    assert "``" not in result.stdout


def test_plan_help_gives_every_option_help_and_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for needle in ("--dtype {fp16,bf16,float16,bfloat16} input dtype (default: fp16)",
                   "(default: BNSD; with --decode BSND", "--causal bottom-right aligned causal mask (default: off)",
                   "default: ascend910b2"):
        assert needle in out, needle


def _one_line_error(capsys, argv):
    """The one error style of every subcommand: exit 2, one line on stderr."""
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flash-cann: error: "), captured.err
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["demo", "--backend", "triton"], "flash-cann: error: there is no CUDA device here "
                                      "(torch.cuda.is_available() is False); run on another "
                                      "with --device cpu"),
    (["demo", "--device", "cuda"], "there is no CUDA device here"),
    (["demo", "--device", "npu"], "backend 'npu' (device type 'npu') cannot run here: "),
    (["demo", "--device", "cpu", "--backend", "triton"],
     "--backend triton runs on device type(s) cuda, npu, not --device cpu"),
])
def test_demo_says_in_one_line_what_is_missing(argv, message, capsys, monkeypatch):
    # As on a machine without a GPU or an NPU, whatever this one has.
    is_available = ops.is_available
    monkeypatch.setattr(ops, "is_available", lambda backend, device_type=None: (
        (device_type or backend.device_type) == "cpu" and is_available(backend, device_type)))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert message in _one_line_error(capsys, argv)


@pytest.mark.parametrize("argv, message", [
    (["demo", "--seqlen", "0"], "argument --seqlen: must be a positive integer (got '0')"),
    (["demo", "--seqlen", "x"], "argument --seqlen: must be a positive integer (got 'x')"),
    (["demo", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["demo", "--backend", "nope"], "argument --backend: invalid choice: 'nope'"),
    (["plan"], "the following arguments are required: --shape"),
    (["nope"], "argument command: invalid choice: 'nope'"),
])
def test_bad_arguments_exit_2_in_the_one_style(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert f"flash-cann: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--shape", "1,8,128"], "--shape must be B,N,S,D (got '1,8,128')"),
    (["--cores", "0"], "--cores must be in 1..24, the AI cores of Ascend910B2 (got 0)"),
    (["--cores", "1000"], "--cores must be in 1..24, the AI cores of Ascend910B2 (got 1000)"),
    (["--soc", "ascend910b3", "--cores", "21"], "--cores must be in 1..20"),
    (["--soc", "nope"], "unknown SoC 'nope'; choose one of"),
    (["--deterministic"], "--deterministic applies to --backward only"),
])
def test_plan_refuses_in_the_one_style(argv, message, capsys):
    # Built beforehand: a first build says so on stderr (a progress line, not an error).
    native_build.built("planner/libflash_cann_planner.so")
    capsys.readouterr()
    line = _one_line_error(capsys, ["plan", "--shape", "1,8,128,64", *argv])
    assert line.startswith(f"flash-cann: error: {message}"), line


def test_plan_takes_cores_within_the_socs():
    assert cli.main(["plan", "--shape", "1,8,128,64", "--cores", "24", "--json"]) == 0


def test_output_cut_short_by_its_reader_ends_quietly():
    """`flash-cann plan ... | head`: the reader is gone before the first write. stdout
    block-buffered, as a shell's pipe gives it (PYTHONUNBUFFERED unset): the plan (~5 KB)
    stays in the buffer until the command's own flush."""
    native_build.built("planner/libflash_cann_planner.so")  # a first build writes to stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    process = subprocess.Popen([sys.executable, "-m", "flash_cann", "plan", "--shape",
                                "1,8,4096,64"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=3600) == 141
    assert stderr == ""


@pytest.mark.parametrize("argv", [["plan", "--shape", "1,8,128,64"],
                                  ["demo", "--backend", "twin"]])
def test_without_the_native_sources_commands_say_so_in_one_line(argv, capsys, monkeypatch,
                                                                 tmp_path):
    """The C++ sources are missing (a wheel's native_sources/ deleted, say)."""
    monkeypatch.setattr(native, "PROJECT", tmp_path / "op_project")
    caches = (native.build, planner._library)  # as in a fresh process
    for cache in caches:
        cache.cache_clear()
    try:
        line = _one_line_error(capsys, argv)
    finally:
        for cache in caches:
            cache.cache_clear()
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


# `flash-cann plan` and the API take the same request the same way: accepted or refused
# alike, and the same normalised window (the plan's variant, the op's checked Variant).
# (causal, window, softcap, dropout, seqlen_k); the queries' seqlen is 128.
CLI_API_REQUESTS = [
    pytest.param(True, (4096, 0), 0.0, 0.0, 128, id="mistral-causal-window"),
    pytest.param(True, (16, 5), 0.0, 0.0, 128, id="causal-ignores-right"),
    pytest.param(True, (16, -1), 0.0, 0.0, 128, id="causal-left"),
    pytest.param(False, (16, 0), 0.0, 0.0, 128, id="window-right-0"),
    pytest.param(False, (300, 300), 0.0, 0.0, 128, id="bounds-past-seqlen_k"),
    pytest.param(False, (-5, 0), 0.0, 0.0, 128, id="left-below-minus-1"),
    pytest.param(True, (3, -2), 0.0, 0.0, 128, id="right-below-minus-1"),
    pytest.param(False, (-1, -1), -1.0, 0.0, 128, id="negative-softcap"),
    pytest.param(False, (-1, -1), 0.0, 1.0, 128, id="dropout-1"),
    pytest.param(False, (-1, -1), 0.0, -0.1, 128, id="negative-dropout"),
    # bounds against the key length, not the queries': 100 >= 64 keys is none
    pytest.param(False, (100, 100), 0.0, 0.0, 64, id="bounds-past-a-shorter-seqlen_k"),
    pytest.param(True, (40, 0), 0.0, 0.0, 64, id="causal-window-shorter-seqlen_k"),
]


@pytest.mark.parametrize("causal, window, softcap, dropout, seqlen_k", CLI_API_REQUESTS)
def test_plan_and_the_api_take_a_request_alike(capsys, causal, window, softcap, dropout,
                                               seqlen_k):
    import json

    import torch

    from flash_cann.contract.checks import check_fwd
    from flash_cann.contract.spec import load

    batch, heads, seqlen, head_dim = 1, 2, 128, 64
    argv = ["plan", "--shape", f"{batch},{heads},{seqlen},{head_dim}", "--seqlen-k",
            str(seqlen_k), "--window",
            *map(str, window), "--softcap", str(softcap), "--dropout", str(dropout), "--json"]
    rc = cli.main(argv + (["--causal"] if causal else []))
    captured = capsys.readouterr()
    cli_window = None
    if rc == 0:
        variant = json.loads(captured.out)["tiling"]["variant"]
        cli_window = (variant["window_left"], variant["window_right"])
    q = torch.zeros(batch, heads, seqlen, head_dim, dtype=torch.float16)
    k = torch.zeros(batch, heads, seqlen_k, head_dim, dtype=torch.float16)
    try:
        problem = check_fwd(q, k, k, None, 0.125, causal=causal, layout="BNSD",
                            window_left=window[0], window_right=window[1], softcap=softcap,
                            dropout_p=dropout,
                            rng_state=torch.zeros(2, dtype=torch.int64) if dropout else None,
                            backend=load().backends["cpu"])
        api_window = (problem.variant.window_left, problem.variant.window_right)
    except ValueError:
        api_window = None
    assert (rc == 0) == (api_window is not None), (rc, captured.err, api_window)
    assert cli_window == api_window
