"""``import flash_attn`` served by flash_cann (flash_cann.install_as_flash_attn and
FLASH_CANN_AS_FLASH_ATTN=1): the modules and names flash-attn 2.8 users import, the
metadata availability checks read, and transformers' own attn_implementation=
"flash_attention_2" path running on it, packed sequences included."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flash_cann
from flash_cann.api import bert_padding, flash_attn_private, interface, rotary
from flash_cann.integrations import flash_attn_alias

REPO = Path(__file__).resolve().parents[1]


def _forget_alias():
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not isinstance(f, flash_attn_alias.FlashAttnAlias)]
    for name in [n for n in sys.modules if n in flash_attn_alias.MODULES]:
        del sys.modules[name]


@pytest.fixture
def alias():
    if "flash_attn" in sys.modules and not flash_attn_alias.installed():
        pytest.skip("a real flash_attn is imported in this process")
    flash_cann.install_as_flash_attn()
    yield
    _forget_alias()


def test_flash_attn_modules_resolve_to_flash_cann(alias):
    import flash_attn
    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input
    from flash_attn.flash_attn_interface import (_flash_attn_backward, _flash_attn_forward,
                                                 _flash_attn_varlen_backward,
                                                 _flash_attn_varlen_forward,
                                                 flash_attn_varlen_qkvpacked_func)
    from flash_attn.layers.rotary import apply_rotary_emb

    # flash_cann's functions; those with S_dmask return flash-attn's layout of it
    assert flash_attn_func.__wrapped__ is interface.flash_attn_func
    assert flash_attn_varlen_func.__wrapped__ is interface.flash_attn_varlen_func
    assert flash_attn_with_kvcache is interface.flash_attn_with_kvcache
    assert (flash_attn_varlen_qkvpacked_func.__wrapped__
            is interface.flash_attn_varlen_qkvpacked_func)
    assert (unpad_input, pad_input, index_first_axis) == (
        bert_padding.unpad_input, bert_padding.pad_input, bert_padding.index_first_axis)
    assert apply_rotary_emb is rotary.apply_rotary_emb
    # flash-attn's private block-level entry points (ring-flash-attn, yunchang)
    assert (_flash_attn_forward, _flash_attn_backward, _flash_attn_varlen_forward,
            _flash_attn_varlen_backward) == (
        flash_attn_private._flash_attn_forward, flash_attn_private._flash_attn_backward,
        flash_attn_private._flash_attn_varlen_forward,
        flash_attn_private._flash_attn_varlen_backward)
    assert flash_attn.__version__ == flash_attn_alias.FLASH_ATTN_VERSION
    assert flash_attn.bert_padding.pad_input is pad_input  # submodules are attributes too
    q = torch.randn(1, 5, 2, 8)
    torch.testing.assert_close(flash_attn_func(q, q, q, causal=True),
                               flash_cann.flash_attn_func(q, q, q, causal=True))


def test_metadata_reports_a_flash_attn_distribution(alias):
    """What availability checks read: find_spec, the version by import name, and the
    import-name -> distribution mapping (transformers' is_flash_attn_2_available)."""
    assert importlib.util.find_spec("flash_attn") is not None
    assert importlib.util.find_spec("flash_attn.layers.rotary") is not None
    assert importlib.metadata.version("flash_attn") == flash_attn_alias.FLASH_ATTN_VERSION
    assert importlib.metadata.version("flash-attn") == flash_attn_alias.FLASH_ATTN_VERSION
    # any case and separator, as for an installed distribution (PEP 503 names)
    assert importlib.metadata.version("Flash_Attn") == flash_attn_alias.FLASH_ATTN_VERSION
    assert "flash-attn" in importlib.metadata.packages_distributions()["flash_attn"]


def test_without_the_alias_there_is_no_flash_attn():
    if flash_attn_alias.installed() or "flash_attn" in sys.modules:
        pytest.skip("flash_attn is importable in this process")
    assert importlib.util.find_spec("flash_attn") is None


def test_a_real_flash_attn_already_imported_is_not_replaced(monkeypatch):
    real = type(sys)("flash_attn")
    real.__file__ = "/site-packages/flash_attn/__init__.py"
    monkeypatch.setitem(sys.modules, "flash_attn", real)
    with pytest.raises(RuntimeError, match="a real flash_attn is already imported"):
        flash_cann.install_as_flash_attn()
    assert not flash_attn_alias.installed()


def _python(code: str, **env):
    environment = {**os.environ, "PYTHONPATH": str(REPO / "python"), **env}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True,
                          text=True, timeout=3600, cwd=REPO)


def test_the_environment_variable_installs_it_at_import():
    code = ("import flash_cann, flash_attn.bert_padding, importlib.metadata as m; "
            "print(flash_attn.flash_attn_func.__wrapped__ is flash_cann.flash_attn_func, "
            "m.version('flash_attn'))")
    run = _python(code, FLASH_CANN_AS_FLASH_ATTN="1")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", flash_attn_alias.FLASH_ATTN_VERSION]
    unset = _python("import flash_cann, importlib.util; "
                    "print(importlib.util.find_spec('flash_attn'))", FLASH_CANN_AS_FLASH_ATTN="0")
    assert unset.returncode == 0 and unset.stdout.split() == ["None"], unset.stderr
    typo = _python("import flash_cann", FLASH_CANN_AS_FLASH_ATTN="yes")
    assert typo.returncode != 0
    assert "FLASH_CANN_AS_FLASH_ATTN must be 1" in typo.stderr


# --- transformers' own flash_attention_2 path, through the alias -----------------------

try:
    import transformers
except ImportError:  # the test extra pins it; the tests above need none of it
    transformers = None

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float16 if DEVICE == "cuda" else torch.float32
TOLERANCE = dict(atol=2e-3, rtol=2e-3) if DTYPE == torch.float16 else dict(atol=2e-5, rtol=1e-4)


@pytest.fixture
def transformers_flash(alias, monkeypatch):
    """transformers with the alias installed before it checks for flash-attn.

    transformers enables flash-attn only on a CUDA / MLU / MUSA device (flash-attn's own
    wheels; on an NPU it takes its torch_npu path instead). flash_cann runs on the CPU too,
    so off CUDA that one device gate is opened here; the package detection (find_spec,
    importlib.metadata), the version check, the imports from flash_attn and every call
    are transformers' own code."""
    if transformers is None:
        pytest.skip("transformers is not installed")
    import transformers.modeling_flash_attention_utils as fa_utils
    from transformers.utils import import_utils

    if DEVICE == "cpu":
        monkeypatch.setattr(import_utils, "is_torch_cuda_available", lambda: True)
        monkeypatch.setitem(fa_utils.FLASH_ATTENTION_COMPATIBILITY_MATRIX[2],
                            "supported_devices", ((lambda: True, "cpu"),))
    import_utils.is_flash_attn_2_available.cache_clear()  # cached before the alias existed
    monkeypatch.setattr(fa_utils, "_loaded_implementation", None)
    yield
    import_utils.is_flash_attn_2_available.cache_clear()


def _models():
    torch.manual_seed(0)
    # One config each: a model keeps its config object and records its implementation in
    # it, so a shared config would leave both models on the last one.
    flash, sdpa = (transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**TINY), attn_implementation=name, dtype=DTYPE)
        for name in ("flash_attention_2", "sdpa"))
    sdpa.load_state_dict(flash.state_dict())
    assert flash.config._attn_implementation == "flash_attention_2"
    return tuple(m.to(DEVICE).eval() for m in (flash, sdpa))


def test_transformers_flash_attention_2_runs_on_the_alias(transformers_flash):
    import transformers.modeling_flash_attention_utils as fa_utils

    flash, sdpa = _models()
    ids = torch.randint(1, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: transformers' unpad_input -> varlen -> pad_input
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    with torch.no_grad():
        logits = [m(input_ids=ids, attention_mask=mask).logits[mask.bool()] for m in (flash, sdpa)]
    torch.testing.assert_close(logits[0], logits[1], **TOLERANCE)
    assert fa_utils._flash_varlen_fn.__wrapped__ is interface.flash_attn_varlen_func  # ours


def test_transformers_packed_sequences_via_position_ids(transformers_flash):
    """A padding-free batch: two sequences in one row, positions restarting at 0, give
    each sequence's logits as if it were alone."""
    flash, sdpa = _models()
    generator = torch.Generator().manual_seed(3)
    first, second = (torch.randint(1, TINY["vocab_size"], (1, n), generator=generator)
                     for n in (5, 4))
    ids = torch.cat((first, second), dim=1).to(DEVICE)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]], device=DEVICE)
    with torch.no_grad():
        packed = flash(input_ids=ids, position_ids=position_ids).logits[0]
        alone = torch.cat([sdpa(input_ids=s.to(DEVICE)).logits[0] for s in (first, second)])
    torch.testing.assert_close(packed, alone, **TOLERANCE)


def test_varlen_takes_max_seqlen_as_a_0d_integer_tensor():
    """transformers passes max_length = cu_seqlens.diff().max(), a 0-d tensor."""
    q = torch.randn(7, 2, 8)
    cu_seqlens = torch.tensor([0, 3, 7], dtype=torch.int32)
    as_int = interface.flash_attn_varlen_func(q, q, q, cu_seqlens, cu_seqlens, 4, 4, causal=True)
    as_tensor = interface.flash_attn_varlen_func(q, q, q, cu_seqlens, cu_seqlens,
                                                 cu_seqlens.diff().max(), torch.tensor(4),
                                                 causal=True)
    torch.testing.assert_close(as_tensor, as_int)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int"):
        interface.flash_attn_varlen_func(q, q, q, cu_seqlens, cu_seqlens, torch.tensor(4.0), 4)


def test_the_alias_passes_sinks_through(alias):
    from flash_attn import flash_attn_func, flash_attn_varlen_func

    q, sinks = torch.randn(1, 5, 2, 8), torch.tensor([0.5, -1.0])
    torch.testing.assert_close(flash_attn_func(q, q, q, causal=True, sinks=sinks),
                               flash_cann.flash_attn_func(q, q, q, causal=True, sinks=sinks))
    cu = torch.tensor([0, 5], dtype=torch.int32)
    torch.testing.assert_close(flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 5, 5,
                                                      sinks=sinks),
                               flash_cann.flash_attn_func(q, q, q, sinks=sinks)[0])


def test_what_flash_attns_own_tests_import_from_the_interface(alias):
    """tests/test_flash_attn.py of flash-attn 2.8.4 imports _get_block_size_n and
    USE_TRITON_ROCM from flash_attn.flash_attn_interface. The block sizes off sm86/sm89
    (flash-attn 2.8.4's table, written out here per head_dim range)."""
    from flash_attn.flash_attn_interface import USE_TRITON_ROCM, _get_block_size_n

    assert USE_TRITON_ROCM is False
    # head_dim -> (no dropout, dropout), causal or not
    expected = {16: (128, 128), 32: (128, 128), 40: (128, 64), 64: (128, 64), 80: (64, 64),
                96: (64, 64), 112: (64, 32), 128: (64, 32), 160: (64, 64), 192: (64, 64),
                224: (64, 64), 256: (64, 64)}
    for head_dim, (plain, dropout) in expected.items():
        for causal in (False, True):
            assert _get_block_size_n(torch.device("cpu"), head_dim, False, causal) == plain
            assert _get_block_size_n("cpu", head_dim, True, causal) == dropout
    with pytest.raises(ValueError, match="head_dim must be an int in"):
        _get_block_size_n("cpu", 257, False, False)
