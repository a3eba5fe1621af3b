"""``import flash_attn`` served by flash_cann, for libraries written against flash-attn
(transformers' flash_attention_2 path, LlamaFactory, verl, ring-flash-attn).

:func:`install_as_flash_attn` (or ``FLASH_CANN_AS_FLASH_ATTN=1`` in the environment when
``import flash_cann`` runs) puts one finder at the front of ``sys.meta_path``. It serves
the modules below (flash-attn 2.8's names, flash_cann's functions) through the ordinary
import machinery, so ``importlib.util.find_spec("flash_attn")`` and
``import flash_attn.bert_padding`` both work, and it answers importlib.metadata for a
distribution "flash-attn" of version :data:`FLASH_ATTN_VERSION` whose top-level package
is ``flash_attn``. That last part is what availability checks read
(``importlib.metadata.version("flash_attn")``, ``packages_distributions()``, as
transformers' ``is_flash_attn_2_available`` does); it lives in this process only:
nothing is written to site-packages, and ``pip list`` does not show it.

The alias wins over a real flash-attn installed beside it (the finder comes first) but
cannot replace one already imported: that is refused. ``flash_attn.flash_attn_interface``
also serves flash-attn's private block-level entry points (``_flash_attn_forward``,
``_flash_attn_backward`` and their varlen twins, flash_cann.api.flash_attn_private),
which ring-flash-attn and yunchang import. flash-attn's functions return S_dmask in
flash-attn's own layout here (``s_dmask="flash_attn"``, flash_cann.api.flash_attn_s_dmask);
flash_cann's keep the probabilities.

The same finder serves the other interfaces written against flash-attn's, each a module
of flash_cann.api: FA3's ``flash_attn_interface`` (also as ``hopper.flash_attn_interface``;
api.flash_attn_3), flash-attention-npu's ``flash_attn_npu``, ``flash_attn_npu_3`` /
``flash_attn_npu_v3`` and ``flash_attn_npu_4`` (api.flash_attn_npu, what vllm-ascend's FA3
backend imports) and vLLM's adapter as ``vllm_flash_attn`` (api.vllm_flash_attn). Only
the mapping lives here: the semantics are those modules'.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import importlib.metadata
import os
import re
import sys
from pathlib import Path

from ..api import (bert_padding, flash_attn_3, flash_attn_npu, flash_attn_private,
                   flash_attn_s_dmask, interface, rotary, vllm_flash_attn)

ENV_VAR = "FLASH_CANN_AS_FLASH_ATTN"
# The flash-attn release whose API flash_cann follows; reported to version checks.
FLASH_ATTN_VERSION = "2.8.3"

_FUNCTIONS = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
              "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
              "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache")
# flash-attn's private block-level entry points (ring-flash-attn, yunchang call them)
_PRIVATE = ("_flash_attn_forward", "_flash_attn_backward", "_flash_attn_varlen_forward",
            "_flash_attn_varlen_backward")
# FA3's interface (hopper/flash_attn_interface.py) and flash_attn_npu_3's
_FA3 = ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
        "flash_attn_with_kvcache", "flash_attn_combine", "get_scheduler_metadata")
_NPU_V3 = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache")
_VLLM = ("flash_attn_varlen_func", "get_scheduler_metadata", "is_fa_version_supported",
         "fa_version_unsupported_reason")


def _with_flash_attn_s_dmask(function):
    """``function``, returning S_dmask in flash-attn's layout by default where it returns
    one: its keyword ``s_dmask`` defaults to "flash_attn" (and its signature says so)."""
    signature = inspect.signature(function)
    if "s_dmask" not in signature.parameters:
        return function

    @functools.wraps(function)
    def aliased(*args, **kwargs):
        kwargs.setdefault("s_dmask", "flash_attn")
        return function(*args, **kwargs)

    aliased.__signature__ = signature.replace(parameters=[
        p.replace(default="flash_attn") if p.name == "s_dmask" else p
        for p in signature.parameters.values()])
    return aliased


def _named(module, names) -> dict:
    return {name: getattr(module, name) for name in names}


FLASH_ATTN_FUNCTIONS = {name: _with_flash_attn_s_dmask(getattr(interface, name))
                        for name in _FUNCTIONS}
_FA3_MODULE = _named(flash_attn_3, _FA3)
_NPU_V3_MODULE = {**_named(flash_attn_npu, _NPU_V3),
                  "get_scheduler_metadata": flash_attn_3.get_scheduler_metadata}
_VLLM_MODULE = _named(vllm_flash_attn, _VLLM)
# module name -> (is a package, {attribute: object}); submodules are attached on import.
MODULES = {
    "flash_attn": (True, FLASH_ATTN_FUNCTIONS),
    "flash_attn.flash_attn_interface": (False, {
        **FLASH_ATTN_FUNCTIONS, **_named(flash_attn_private, _PRIVATE),
        # what flash-attn's tests/test_flash_attn.py imports from here besides the functions
        "_get_block_size_n": flash_attn_s_dmask._get_block_size_n,
        "USE_TRITON_ROCM": flash_attn_private.USE_TRITON_ROCM}),
    "flash_attn.bert_padding": (False, _named(bert_padding, (
        "index_first_axis", "index_put_first_axis", "unpad_input", "pad_input"))),
    "flash_attn.layers": (True, {}),
    "flash_attn.layers.rotary": (False, {"apply_rotary_emb": rotary.apply_rotary_emb}),
    # FA3's interface, as its build installs it and as its repository's hopper/ holds it
    "flash_attn_interface": (False, _FA3_MODULE),
    "hopper": (True, {}),
    "hopper.flash_attn_interface": (False, _FA3_MODULE),
    # flash-attention-npu: v2, v3 (and its earlier name, vllm-ascend's import), v4
    "flash_attn_npu": (True, FLASH_ATTN_FUNCTIONS),
    "flash_attn_npu_3": (True, _NPU_V3_MODULE),
    "flash_attn_npu_v3": (True, _NPU_V3_MODULE),
    "flash_attn_npu_4": (True, {"flash_attn_varlen_func":
                                flash_attn_npu.flash_attn_varlen_func_v4}),
    # vLLM's adapter, under the standalone package's name
    "vllm_flash_attn": (True, _VLLM_MODULE),
    "vllm_flash_attn.flash_attn_interface": (False, _VLLM_MODULE),
}
_ORIGIN = "flash_cann alias"


class _AliasDistribution(importlib.metadata.Distribution):
    """flash-attn's metadata as importlib.metadata reads it: the two files that name the
    distribution, its version and its top-level package."""

    _FILES = {
        "METADATA": (f"Metadata-Version: 2.1\nName: flash-attn\nVersion: {FLASH_ATTN_VERSION}\n"
                     f"Summary: flash-attn's API served by flash_cann "
                     f"(flash_cann.install_as_flash_attn)\n"),
        "top_level.txt": "flash_attn\n",
    }

    def read_text(self, filename):
        return self._FILES.get(filename)

    def locate_file(self, path):
        return Path(__file__).parent / path


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503, as importlib.metadata compares


class FlashAttnAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finder and loader of the alias modules; distribution finder of "flash-attn"."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MODULES:
            return None
        is_package, _ = MODULES[fullname]
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=_ORIGIN,
                                              is_package=is_package)
        if is_package:
            spec.submodule_search_locations = []
        return spec

    def exec_module(self, module):
        _, attributes = MODULES[module.__name__]
        module.__dict__.update(attributes)
        module.__all__ = sorted(attributes)
        if module.__name__ == "flash_attn":
            module.__version__ = FLASH_ATTN_VERSION

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if context.name is None or _normalized(context.name) == "flash-attn":
            yield _AliasDistribution()


def installed() -> bool:
    return any(isinstance(finder, FlashAttnAlias) for finder in sys.meta_path)


def install_as_flash_attn() -> None:
    """Make ``import flash_attn`` (and ``flash_attn.flash_attn_interface``,
    ``flash_attn.bert_padding``, ``flash_attn.layers.rotary``) resolve to flash_cann, and
    importlib.metadata report a flash-attn of :data:`FLASH_ATTN_VERSION`. Idempotent.

    Call it before the library that imports flash_attn checks for it: transformers caches
    its ``is_flash_attn_2_available()`` on the first call."""
    loaded = sys.modules.get("flash_attn")
    if loaded is not None and getattr(getattr(loaded, "__spec__", None), "origin",
                                      None) != _ORIGIN:
        raise RuntimeError(f"flash_cann.install_as_flash_attn(): a real flash_attn is already "
                           f"imported ({getattr(loaded, '__file__', loaded)!r}); call it before "
                           f"anything imports flash_attn, or use that package")
    if not installed():
        sys.meta_path.insert(0, FlashAttnAlias())


def install_if_requested() -> bool:
    """Install the alias if ``FLASH_CANN_AS_FLASH_ATTN`` is "1" (the value is checked: a
    typo must not be silently ignored). True if installed."""
    value = os.environ.get(ENV_VAR, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"flash_cann: {ENV_VAR} must be 1 (serve `import flash_attn` from "
                         f"flash_cann) or 0 / unset (got {value!r})")
    if value == "1":
        install_as_flash_attn()
    return value == "1"
