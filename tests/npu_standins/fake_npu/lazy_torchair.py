"""TEST-ONLY: a user session under torch_npu's lazy torchair (torch_npu/dynamo/__init__.py
here), in a fresh process: prints, as one JSON object, what happened at each step.
Run by tests/test_npu_shim.py with PYTHONPATH holding this directory and
FAKE_TORCH_NPU_TORCHAIR = "import" (torch_npu 2.1-2.8) or "dynamo" (2.9 on), and
IMPORT_TORCHAIR_FIRST set to import torchair (through the proxy) before flash_cann."""

import json
import os
import sys

import torch

TORCHAIR = "torch_npu.dynamo.torchair"
state = {}


def step(name, fn):
    try:
        fn()
        state[name] = "ok"
    except Exception as err:  # noqa: BLE001 -- what went wrong is what is tested
        state[name] = f"{type(err).__name__}: {err}"


def has_converter():
    return hasattr(torch.ops.flash_cann.fwd.default, "_ge_converter")


import torch_npu  # noqa: E402,F401  (the fake; its proxy per FAKE_TORCH_NPU_TORCHAIR)

state["proxy_after_torch_npu"] = type(sys.modules.get("torchair")).__name__
if os.environ["FAKE_TORCH_NPU_TORCHAIR"] == "dynamo":
    # A first torch.compile before flash_cann is imported: the Dynamo set-up of 2.9 on.
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
state["proxy_after_compile"] = type(sys.modules.get("torchair")).__name__
if os.environ.get("IMPORT_TORCHAIR_FIRST"):  # a real import through the proxy, then flash_cann
    step("import_torchair", lambda: __import__("torchair"))
step("import_flash_cann", lambda: __import__("flash_cann"))
state["torchair_loaded_by_import"] = TORCHAIR in sys.modules
state["registered_at_import"] = has_converter()
step("enable_torchair", lambda: __import__("flash_cann").enable_torchair())
state["torchair_loaded"] = TORCHAIR in sys.modules
state["registered"] = has_converter()
if state["registered"]:  # with the package torch_npu's proxy forwards to
    from flash_cann.integrations import torchair as torchair_converters  # noqa: E402
    state["registered_with"] = torchair_converters._registered_with.__name__
print(json.dumps(state))
