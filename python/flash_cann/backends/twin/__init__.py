"""The ``twin`` backend: the unchanged Ascend C kernels of ``op_kernel/`` built against
the CPU twin of the Ascend C API (``twin/``) and run through ctypes (``launcher.py``),
with the race detector on; for verification without an NPU."""
