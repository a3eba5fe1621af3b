"""TEST-ONLY: NPU tensors (the fake "npu" device, host memory) through torch.ops.flash_cann
to the Triton backend, with the compile real and the launch faked: each launch the NPU
backend makes is lowered by bishengir-compile for Ascend910B2 (flash_cann.backends.triton.ascend_lowering)
instead of run. Prints one JSON object. Run by tests/test_triton_npu.py in a fresh
process, with PYTHONPATH holding this directory (fake torch_npu) and, when
TRITON_ASCEND=1, triton-ascend's site-packages; FAKE_TORCH_NPU_LIB, LOWERING_DIR.
"""

import json
import os
from pathlib import Path

import torch

import flash_cann
from flash_cann.backends.triton import ascend_lowering
from flash_cann.contract import ops
from flash_cann.backends.triton import npu as triton_npu

import torch_npu  # noqa: E402,F401  (the fake; renames PrivateUse1 to "npu")

results = {}
launched = []


lowered = {}  # a launch's specialisation -> its lowering (as triton's kernel cache)
# The kernels' feature flags (constexprs) a launch reports when on.
FLAGS = ("CAUSAL", "LEFT_BOUNDED", "SOFTCAP", "ALIBI", "DROPOUT", "VARLEN", "SEQUSED_K", "PAGED",
         "BATCH_IDX", "SINKS")


def lowered_instead_of_launched(step):
    # Feature tensors (ALiBi slopes) are not part of the key: kept here, NPU tensors would
    # outlive the fake device's allocator at interpreter exit.
    key = (step.name, step.args[0].dtype, tuple(sorted(
        (k, v) for k, v in step.constexprs.items() if not isinstance(v, torch.Tensor))))
    if key not in lowered:
        lowered[key] = ascend_lowering.lower(step, "Ascend910B2",
                                             Path(os.environ["LOWERING_DIR"]) / step.name)
    lowering = lowered[key]
    launched.append({"kernel": step.name, "grid": list(step.grid),
                     "persistent": step.constexprs.get("PERSISTENT"),
                     "tma": step.constexprs.get("USE_TMA"), "outcome": lowering.outcome,
                     "features": {k: v for k, v in step.constexprs.items()
                                  if k in FLAGS and v},
                     "tiles": [step.constexprs.get("BLOCK_M"), step.constexprs.get("BLOCK_N")],
                     "overflow": lowering.overflow})


def run(**kwargs):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 40, 4, 64, generator=gen).half().to("npu").requires_grad_()
    k, v = (torch.randn(2, 40, 2, 64, generator=gen).half().to("npu").requires_grad_()
            for _ in range(2))
    mask = torch.ones(2, 40, dtype=torch.bool).to("npu")
    out = flash_cann.attention(q, k, v, layout="BSND", causal=True, key_padding_mask=mask,
                               **kwargs)
    out.backward(torch.ones(out.shape, dtype=out.dtype).to("npu"))  # no fill kernel here
    return {"out": [out.device.type, list(out.shape)],
            "grads": [[t.grad.device.type, list(t.grad.shape)] for t in (q, k, v)]}


try:
    results["default_backend"] = ops.backend_for("npu").name
    triton_npu.ai_cores = lambda device: 24  # the 910B2's AI cores (no NPU driver here)
    triton_npu.launch = lowered_instead_of_launched
    results["default"] = run()
    results["default"]["launched"], launched[:] = list(launched), []
    with flash_cann.use_backend("triton"):
        results["use_backend"] = run()
        results["use_backend"]["launched"], launched[:] = list(launched), []
    # Features on (the "scores" tile table): a left window bound, softcap, ALiBi slopes,
    # attention sinks (their gradient comes back).
    sinks = torch.zeros(4).to("npu").requires_grad_()
    results["features"] = run(window_size=(16, -1), softcap=30.0,
                              alibi_slopes=torch.full((4,), 0.25).to("npu"), sinks=sinks)
    results["features"]["grad_sinks"] = [sinks.grad.device.type, list(sinks.grad.shape)]
    results["features"]["launched"] = launched
except Exception as err:  # noqa: BLE001 -- the message is what is tested
    results["error"] = f"{type(err).__name__}: {err}"
print(json.dumps(results), flush=True)
# Leave without the interpreter's teardown: under load, a std::thread still joinable at
# static destruction (in triton-ascend's compiler or the stand-in device; not root-caused)
# aborts the process after the results above are complete ("terminate called without an
# active exception"). What is tested is the results, not this scaffold's teardown.
os._exit(0)
