"""TEST-ONLY fake torch_npu: makes "npu" a device whose tensors live in host memory
(libfake_torch_npu.so, path in $FAKE_TORCH_NPU_LIB), so CI can run flash-cann's NPU
extension. It has only what flash_cann.backends.npu touches. Not torch_npu."""

import ctypes
import os
import types

import torch

ctypes.CDLL(os.environ["FAKE_TORCH_NPU_LIB"], mode=ctypes.RTLD_GLOBAL)

npu = types.ModuleType("torch_npu.npu")
npu.is_available = lambda: True
npu.device_count = lambda: 1
npu.current_device = lambda: 0

torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", npu)
torch.utils.generate_methods_for_privateuse1_backend()
