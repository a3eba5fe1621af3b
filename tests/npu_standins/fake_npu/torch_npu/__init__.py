"""TEST-ONLY fake torch_npu. Not torch_npu. Two parts:

* its lazy torchair (``dynamo``), always: the proxy in ``sys.modules["torchair"]``, at the
  version's timing, ``$FAKE_TORCH_NPU_TORCHAIR`` = "import" (default) or "dynamo";
* an "npu" device whose tensors live in host memory, when ``$FAKE_TORCH_NPU_LIB`` names
  the fake libtorch_npu.so: what flash_cann.backends.npu touches, so CI can run
  flash-cann's NPU extension; with torch.npu's graph capture (graphs.py).
"""

import ctypes
import os
import types

import torch

from . import dynamo

__version__ = os.environ.get("FAKE_TORCH_NPU_VERSION", torch.__version__.split("+")[0])

dynamo.install(os.environ.get("FAKE_TORCH_NPU_TORCHAIR", "import"))

if os.environ.get("FAKE_TORCH_NPU_LIB"):
    ctypes.CDLL(os.environ["FAKE_TORCH_NPU_LIB"], mode=ctypes.RTLD_GLOBAL)

    npu = types.ModuleType("torch_npu.npu")
    npu.is_available = lambda: True
    npu.device_count = lambda: 1
    npu.current_device = lambda: 0
    npu.get_device_name = lambda device=0: os.environ.get("FAKE_NPU_SOC", "Ascend910B2")
    from . import graphs  # torch.npu.NPUGraph & co. on the fake device

    graphs.install(npu)

    torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", npu)
    torch.utils.generate_methods_for_privateuse1_backend()
