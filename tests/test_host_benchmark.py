"""benchmarks/host_overhead.py runs (its CPU mode, in CI), and the recorded-launch
replay it times binds its arguments as the C launcher takes them: a broken host-path
benchmark fails a test, not only a GPU run."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def _benchmark():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("host_overhead",
                                                      BENCHMARKS / "host_overhead.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_host_benchmark_runs_on_the_cpu(tmp_path, capsys):
    assert _benchmark().main(["--device", "cpu", "--calls", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "host_overhead.json").read_text())
    stages = [row["stage"] for row in result["rows"]]
    assert len(stages) == 9 and stages[0].startswith("fwd: flash_attn_func") \
        and "fwd+bwd: flash_attn_func + backward" in stages, stages
    assert all(math.isfinite(row["us_per_call"]) and row["us_per_call"] > 0
               for row in result["rows"]), result["rows"]
    assert result["meta"]["device"].startswith("cpu") and "on cpu" in result["meta"]["method"]
    assert "wrote" in capsys.readouterr().out


def _recorded(tensors: int, arguments: list):
    """A Launch of a stand-in compiled kernel whose C launcher records its arguments."""
    from flash_cann.backends.triton.launch import Launch

    calls = []
    runner = SimpleNamespace(launch=lambda *a: calls.append(a), launch_cooperative_grid=False,
                             launch_pdl=True, global_scratch_size=0, global_scratch_align=1,
                             num_ctas=1)
    kernel = SimpleNamespace(run=runner, function="FUNCTION", packed_metadata="METADATA")
    return Launch(kernel, (3, 2, 1), [None] * tensors + arguments, tensors, None), calls


@needs_triton
def test_a_launch_replays_new_tensors_in_its_leading_slots():
    launch, calls = _recorded(2, [7, 0.5])
    a, b = torch.zeros(1), torch.ones(1)
    launch(a, b, stream=11)
    # gridX, gridY, gridZ, stream, function, cooperative, pdl, global scratch, profile
    # scratch, packed metadata, launch metadata, enter hook, exit hook, the arguments.
    assert calls == [(3, 2, 1, 11, "FUNCTION", False, True, None, None, "METADATA", None,
                      None, None, a, b, 7, 0.5)]


@needs_triton
@pytest.mark.parametrize("given", [1, 3])
def test_a_launch_refuses_another_tensor_count(given):
    launch, calls = _recorded(2, [7])
    with pytest.raises(TypeError, match=f"replays 2 tensors .*got {given}"):
        launch(*[torch.zeros(1)] * given, stream=0)
    assert calls == []


@needs_triton
@pytest.mark.parametrize("tensors", [5, 6])  # the Hopper forward (no mask); the FA2 one
def test_a_forward_plan_replays_as_many_tensors_as_its_launch_took(tensors, monkeypatch):
    """What the benchmark's "recorded launch alone" row times (the bug it had: six tensors
    given to the Hopper forward's five-tensor launch)."""
    from flash_cann.backends.triton import cuda

    monkeypatch.setattr(cuda, "current_stream", lambda index: 5)
    launch, calls = _recorded(tensors, [64])
    plan = cuda._ForwardPlan(launch, (1, 2, 8), torch.device("cpu"), {})
    q, k, v, out, lse = (torch.zeros(1) for _ in range(5))
    plan.replay(q, k, v, None, out, lse)
    assert calls[0][13:] == ((q, k, v, out, lse, None)[:tensors] + (64,))
