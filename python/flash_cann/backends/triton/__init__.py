"""The ``triton`` backend: FlashAttention-2 Triton kernels (``kernels/``: forward, decode,
backward and the tile helpers they share), launched on CUDA by ``cuda.py`` (autotuned,
plans replayed through ``launch.py``) and on Ascend NPUs through triton-ascend by
``npu.py`` (fixed tiles, persistent grids; ``ascend_lowering.py`` lowers every launch
with bishengir-compile to check it offline). Importing this package imports no Triton:
each entry module does."""
