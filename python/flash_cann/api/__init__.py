"""The public API: flash-attn 2.8's functions (``flash_attn_func`` and its packed,
variable-length and KV-cache siblings) and ``attention`` for CANN-style callers. Each
normalises its arguments and calls ``torch.ops.flash_cann`` (or, for plain eager calls,
the same kernels through ``flash_cann.contract.eager``)."""
