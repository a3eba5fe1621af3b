"""The backends of torch.ops.flash_cann, one package each: ``cpu`` (PyTorch tensor
ops), ``triton`` (Triton kernels for CUDA and, through triton-ascend, Ascend NPUs),
``npu`` (the CANN package's Ascend C kernels through aclnn) and ``twin`` (the same
Ascend C kernels on the CPU twin). The op spec names each backend's module
(``backends.<name>.module``); a backend imports the contract and the Ascend host side,
never another backend."""
