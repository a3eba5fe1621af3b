"""flash-cann: FlashAttention as a CANN custom operator package, with portable backends.

    import flash_cann
    out = flash_cann.flash_attn_func(q, k, v, causal=True)          # flash-attn's API
    out = flash_cann.attention(q, k, v, layout="BNSD", key_padding_mask=mask)
    out = flash_cann.npu_fusion_attention(q, k, v, 8, "BSND", scale=s)[0]  # torch_npu's

Both call ``torch.ops.flash_cann.fwd`` (and, through autograd, ``.bwd``), which runs on
the backend for the tensors' device: see ``flash_cann.contract.ops``.

The package, top down (docs/architecture.md): ``api`` (the functions above), ``contract``
(the op spec, checks, feature semantics, the torch.ops registration and the eager path),
``backends`` (one package per backend), ``ascend`` (the CANN package's host side: planner
bindings, plan reports, the generated contract header, the native build),
``integrations`` (transformers, the ``flash_attn`` alias, torchair) and ``tools`` (the
``flash-cann`` CLI, demo, accuracy and memory probes). Arrows point down;
tests/test_layering.py keeps them so.
"""

# CPU threads: the CPU backend runs its ops on its own worker threads, one torch thread
# each, so OpenMP's wait policy (and whether torch was imported first) does not matter
# to it; flash_cann leaves OMP_WAIT_POLICY to the user (backends/cpu/attention.py).

from .api.interface import (attention, flash_attn_func, flash_attn_kvpacked_func,
                            flash_attn_qkvpacked_func, flash_attn_varlen_func,
                            flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                            flash_attn_with_kvcache)
from .api.npu_fusion_attention import (npu_fusion_attention, npu_fusion_attention_grad,
                                       npu_fusion_attention_v3)
from .contract.kvcache import check_kvcache_capacity
from .contract.ops import backend_for, use_backend
from .integrations import torch_context_parallel as _torch_context_parallel
from .integrations import transformers as _transformers
from .integrations.flash_attn_alias import install_as_flash_attn, install_if_requested
from .integrations.post_import import when_imported
from .integrations.torchair import enable_torchair, register_if_loaded

register_if_loaded()  # torchair imported before flash_cann: register the converters now
# attn_implementation="fa_cann", without importing transformers: registered when its
# modeling code is imported (or now, if it is).
when_imported("transformers.modeling_utils", _transformers.register_attention)
when_imported("transformers.masking_utils", _transformers.register_mask)
# torch's context_parallel runs flash_cann's ops too, once torch's module is imported
for _module in _torch_context_parallel.MODULES:
    when_imported(_module, _torch_context_parallel.register)
del _module
install_if_requested()  # FLASH_CANN_AS_FLASH_ATTN=1: `import flash_attn` gives flash_cann

__version__ = "0.1.0"

__all__ = ["attention", "flash_attn_func", "flash_attn_kvpacked_func",
           "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_with_kvcache", "npu_fusion_attention", "npu_fusion_attention_grad",
           "npu_fusion_attention_v3", "check_kvcache_capacity",
           "backend_for", "use_backend", "enable_torchair", "install_as_flash_attn",
           "__version__"]
