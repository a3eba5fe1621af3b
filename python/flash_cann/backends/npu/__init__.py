"""The ``npu`` backend: the installed CANN package's Ascend C kernels, called through its
aclnn API by the torch_npu extension (``framework/``). ``launcher.py`` is the backend's
entry; ``aclnn.py`` derives the aclnn API from the op spec, ``aclnn_status.py`` names
aclnn's status codes, ``opp_paths.py`` finds the installed package. torch_npu is
imported only when an NPU tensor needs it."""
