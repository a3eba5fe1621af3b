"""The first call with a feature costs no more imports than a plain one: the op's device
kernels run without importing torch._dynamo on the eager path (ops._without_dynamo), so
the first feature call does not stall seconds on ~900 modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys, time
import torch, flash_cann

def grads(**features):
    q, k, v = (torch.randn(1, 64, 2, 32, requires_grad=True) for _ in range(3))
    start = time.perf_counter()
    flash_cann.flash_attn_func(q, k, v, causal=True, **features).sum().backward()
    return time.perf_counter() - start

before = set(sys.modules)
feature_s = grads(softcap=5.0)
after_feature = set(sys.modules)
try:
    flash_cann.flash_attn_func(*(torch.randn(1, 8, 2, 32) for _ in range(3)),
                               window_size=(-5, 0))
    refused = False
except ValueError:
    refused = True
plain_s = grads()
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "refused": refused,
                  "feature_imports": sorted(after_feature - before),
                  "later_imports": sorted(set(sys.modules) - after_feature),
                  "feature_s": feature_s, "plain_s": plain_s}))
"""


def test_a_first_feature_call_imports_no_dynamo():
    """In a fresh interpreter: a feature call (softcap) forward and backward on cpu, a
    refused feature call and a plain call leave torch._dynamo unimported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "python"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr[-4000:]
    state = json.loads(run.stdout.splitlines()[-1])
    assert state["refused"], state
    dynamo = [m for m in state["feature_imports"] + state["later_imports"]
              if m.startswith(("torch._dynamo", "torch._inductor"))]
    assert not state["dynamo"] and dynamo == [], (
        f"the first feature call imported {len(state['feature_imports'])} modules "
        f"({state['feature_s']:.2f} s), Dynamo's among them: {dynamo[:5]}")
