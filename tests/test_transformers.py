"""Hugging Face transformers on flash_cann (flash_cann.integrations.transformers): tiny,
randomly initialised Llama, Qwen2 and Mistral models built here (nothing downloaded) give
the logits, gradients and greedy generations of attn_implementation="sdpa", batched with
left and right padding, and GQA; Mistral's sliding window and Gemma 2's soft-capping and
window give eager's logits; packed sequences (position_ids, cu_seq_lens) give each
sequence's own; a tiny gpt-oss (attention sinks, alternating sliding and full attention)
gives eager's logits and gradients, the sinks' included; train-mode dropout is unbiased;
"fa_cann" registers on `import flash_cann` without importing transformers. Runs on the CPU backend here (and on the lent GPU in the
GPU tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

try:
    import transformers
except ImportError as err:  # the test extra pins it (Python >= 3.11)
    if os.environ.get("CI") == "true" and sys.version_info >= (3, 11):
        pytest.fail(f"transformers (the test extra) is not installed: {err}",
                    pytrace=False)
    pytest.skip(f"transformers is not installed: {err}", allow_module_level=True)

import flash_cann  # noqa: E402,F401  (registers "fa_cann" with transformers)
from flash_cann.integrations import transformers as integration  # noqa: E402

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0)
FAMILIES = {  # GQA in all three (4 query heads, 2 kv heads)
    "llama": lambda: transformers.LlamaConfig(**TINY),
    "qwen2": lambda: transformers.Qwen2Config(**TINY),
    "mistral": lambda: transformers.MistralConfig(**TINY, sliding_window=32),
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float16 if DEVICE == "cuda" else torch.float32  # Triton: fp16/bf16 only
TOLERANCE = dict(atol=2e-3, rtol=2e-3) if DTYPE == torch.float16 else dict(atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module", params=FAMILIES)
def models(request):
    """The same random weights under attn_implementation "fa_cann" and "sdpa"."""
    return _pair(FAMILIES[request.param], "sdpa")


def _pair(make_config, reference: str):
    """The same random weights under "fa_cann" and ``reference``. One config each: a model
    records its implementation in its config object, so a shared config would leave both
    models on the last one (and the comparison would test nothing)."""
    torch.manual_seed(0)
    ours, theirs = (transformers.AutoModelForCausalLM.from_config(
        make_config(), attn_implementation=name) for name in (integration.NAME, reference))
    theirs.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == integration.NAME
    assert theirs.config._attn_implementation == reference
    return tuple(m.to(DEVICE, DTYPE).eval() for m in (ours, theirs))


def _batch(padding_side: str):
    """Two sequences of 9 and 6 tokens, the shorter padded on `padding_side`."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, TINY["vocab_size"], (2, 9), generator=generator)
    mask = torch.ones(2, 9, dtype=torch.long)
    pad = slice(0, 3) if padding_side == "left" else slice(6, 9)
    mask[1, pad] = 0
    ids[1, pad] = TINY["pad_token_id"]
    return ids.to(DEVICE), mask.to(DEVICE)


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_logits_and_gradients_match_sdpa(models, padding_side):
    ids, mask = _batch(padding_side)
    valid = mask.bool()
    logits, grads = [], []
    for model in models:
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask).logits
        # Padded positions are garbage in any implementation: the loss ignores them.
        out[valid].float().square().mean().backward()
        logits.append(out[valid].detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(logits[0], logits[1], **TOLERANCE)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **TOLERANCE, msg=name)
    assert any(g.abs().sum() > 0 for n, g in grads[0].items() if "q_proj" in n)


def test_generate_gives_the_same_tokens(models):
    ids, mask = _batch("left")  # generation pads on the left
    tokens = [model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4,
                             do_sample=False, pad_token_id=TINY["pad_token_id"])
              for model in models]
    assert tokens[0].shape == (2, 13)
    assert torch.equal(tokens[0], tokens[1])


def _qkv(q_len=5, kv_len=7):
    generator = torch.Generator().manual_seed(2)
    return (torch.randn(2, 4, q_len, 8, generator=generator),
            torch.randn(2, 2, kv_len, 8, generator=generator),
            torch.randn(2, 2, kv_len, 8, generator=generator))


@pytest.mark.parametrize("kwargs, message", [
    (dict(attention_mask=torch.zeros(2, 1, 5, 7, dtype=torch.bool)), "got a 4-D mask"),
])
def test_what_flash_cann_cannot_do_is_refused(kwargs, message):
    module = torch.nn.Module()
    kwargs = {"attention_mask": None, **kwargs}
    with pytest.raises(NotImplementedError, match=message):
        integration.flash_cann_attention_forward(module, *_qkv(), scaling=0.3, **kwargs)


def test_a_window_longer_than_the_keys_is_full_attention():
    q, k, v = _qkv()
    module = torch.nn.Module()
    with_window, _ = integration.flash_cann_attention_forward(module, q, k, v, None, 0.3,
                                                              sliding_window=7)
    without, _ = integration.flash_cann_attention_forward(module, q, k, v, None, 0.3)
    torch.testing.assert_close(with_window, without)


def test_compiles_as_one_graph_with_gqa_and_padding():
    q, k, v = _qkv()
    mask = torch.tensor([[True] * 7, [False] * 2 + [True] * 5])
    module = torch.nn.Module()
    module.is_causal = True

    def run(q_, k_, v_, mask_):
        return integration.flash_cann_attention_forward(module, q_, k_, v_, mask_, 0.3)[0]

    torch._dynamo.reset()
    compiled = torch.compile(run, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, mask), run(q, k, v, mask))
    assert run(q, k, v, mask).shape == (2, 5, 4, 8)  # (batch, q_len, heads, head_dim)


WINDOWED = {  # the 9-token batches are longer than the window: it really cuts
    "mistral": lambda: transformers.MistralConfig(**TINY, sliding_window=4),
    "gemma2": lambda: transformers.Gemma2Config(
        **{**TINY, "num_hidden_layers": 2}, head_dim=8, query_pre_attn_scalar=8,
        sliding_window=4, attn_logit_softcapping=5.0, final_logit_softcapping=None,
        layer_types=["sliding_attention", "full_attention"]),
}


@pytest.mark.parametrize("family", WINDOWED)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_windows_and_softcap_match_eager(family, padding_side):
    """Mistral's sliding window; Gemma 2's soft-capping on every layer and window on
    every other one (transformers' sdpa has no soft-capping: eager is the reference)."""
    ours, eager = _pair(WINDOWED[family], "eager")
    ids, mask = _batch(padding_side)
    valid = mask.bool()
    with torch.no_grad():
        logits = [m(input_ids=ids, attention_mask=mask).logits[valid] for m in (ours, eager)]
        unmasked = [m(input_ids=ids).logits for m in (ours, eager)]
    torch.testing.assert_close(logits[0], logits[1], **TOLERANCE)
    torch.testing.assert_close(unmasked[0], unmasked[1], **TOLERANCE)


def test_packed_sequences_via_position_ids_match_each_sequence_alone():
    """A padding-free batch (one row, positions restarting at 0), as a collator for
    flash-attn packs it: each sequence's logits and gradients as if it were alone."""
    ours, sdpa = _pair(FAMILIES["mistral"], "sdpa")
    generator = torch.Generator().manual_seed(3)
    first, second = (torch.randint(1, TINY["vocab_size"], (1, n), generator=generator).to(DEVICE)
                     for n in (5, 4))
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]], device=DEVICE)
    packed = ours(input_ids=torch.cat((first, second), dim=1), position_ids=position_ids).logits[0]
    alone = torch.cat([sdpa(input_ids=s).logits[0] for s in (first, second)])
    torch.testing.assert_close(packed, alone, **TOLERANCE)
    packed.float().square().mean().backward()
    alone.float().square().mean().backward()
    for (name, p), q in zip(ours.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOLERANCE, msg=name)


def test_cu_seq_lens_kwargs_are_packed_sequences():
    """transformers' FlashAttentionKwargs (cu_seq_lens_q/k, max_length_q/k), passed
    through the model's kwargs, split one row into independent causal sequences."""
    q, k, v = (t[:1] for t in _qkv(q_len=7, kv_len=7))
    module = torch.nn.Module()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    packed, _ = integration.flash_cann_attention_forward(
        module, q, k, v, None, 0.3, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
        max_length_q=torch.tensor(4), max_length_k=4)
    for start, end in ((0, 3), (3, 7)):
        alone, _ = integration.flash_cann_attention_forward(
            module, q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], None, 0.3)
        torch.testing.assert_close(packed[:, start:end], alone)


def test_train_mode_dropout_is_unbiased_like_eager():
    """Attention dropout in training: each draw differs, and the mean over draws is the
    dropout-free output (inverted dropout), as for transformers' eager dropout; checked
    against the spread of the draws themselves, not a guessed tolerance."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    q, k, v = _qkv(q_len=4, kv_len=4)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups, module.training = True, 2, True
    exact, _ = integration.flash_cann_attention_forward(module, q, k, v, None, 0.3)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    mask = torch.zeros(4, 4).masked_fill(~causal, float("-inf"))
    torch.manual_seed(5)
    for forward, kwargs in ((integration.flash_cann_attention_forward, {}),
                            (eager_attention_forward, {"attention_mask": mask})):
        draws = torch.stack([forward(module, q, k, v, **{"attention_mask": None, **kwargs},
                                     scaling=0.3, dropout=0.4)[0] for _ in range(400)])
        assert not torch.equal(draws[0], draws[1])
        standard_error = draws.std(dim=0) / len(draws) ** 0.5
        deviation = (draws.mean(dim=0) - exact).abs()
        assert (deviation <= 5 * standard_error + 1e-6).all(), (forward.__name__,
                                                               (deviation / standard_error).max())
        # About 1 - p of the probability mass survives: the draws' spread is not tiny.
        assert standard_error.mean() > 1e-3


def test_train_mode_model_drops_and_eval_mode_does_not():
    make = lambda: transformers.LlamaConfig(**TINY, attention_dropout=0.5)  # noqa: E731
    ours, sdpa = _pair(make, "sdpa")
    ids, mask = _batch("right")
    ours.train()
    torch.manual_seed(0)
    first, second = (ours(input_ids=ids, attention_mask=mask).logits for _ in range(2))
    assert not torch.allclose(first, second)
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids, attention_mask=mask).logits[mask.bool()],
                                   sdpa(input_ids=ids, attention_mask=mask).logits[mask.bool()],
                                   **TOLERANCE)


def _python(code: str):
    repo = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=3600, cwd=repo,
                         env={**os.environ, "PYTHONPATH": str(repo / "python")})
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_import_flash_cann_registers_without_importing_transformers():
    """Registration waits for transformers' modeling code; flash_cann first or second."""
    check = ("from transformers import AttentionInterface; "
             "from transformers.masking_utils import AttentionMaskInterface as M; "
             "print('fa_cann' in AttentionInterface._global_mapping, 'fa_cann' in M._global_mapping)")
    assert _python("import sys, flash_cann; print('transformers' in sys.modules); "
                   + check) == ["False", "True", "True"]
    assert _python("import transformers.modeling_utils, transformers.masking_utils, "
                   "flash_cann; " + check) == ["True", "True"]


def _gpt_oss():
    """gpt-oss in miniature: GQA, sliding window (4 keys) then full attention, attention
    sinks, a mixture of 4 experts."""
    return transformers.GptOssConfig(
        **{**TINY, "intermediate_size": 32}, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_gpt_oss_sinks_match_eager(padding_side):
    """Logits and every parameter's gradient (the sinks' included) of "fa_cann" vs eager,
    the sinks set far from their near-zero initialisation so that they matter."""
    ours, eager = _pair(_gpt_oss, "eager")
    generator = torch.Generator().manual_seed(4)
    sinks = {n: torch.randn(p.shape, generator=generator) * 2
             for n, p in ours.named_parameters() if n.endswith("sinks")}
    assert len(sinks) == 2
    for model in (ours, eager):
        model.load_state_dict(sinks, strict=False)
    ids, mask = _batch(padding_side)
    valid = mask.bool()
    logits, grads = [], []
    for model in (ours, eager):
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask).logits
        out[valid].float().square().mean().backward()
        logits.append(out[valid].detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
    torch.testing.assert_close(logits[0], logits[1], **TOLERANCE)
    assert grads[0].keys() == grads[1].keys() and set(sinks) <= grads[0].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **TOLERANCE, msg=name)
    assert all(grads[0][name].abs().sum() > 0 for name in sinks)
    # Without the sinks (-inf: no share of any row) the logits change: they were used.
    with torch.no_grad():
        ours.load_state_dict({n: torch.full_like(s, -1e4) for n, s in sinks.items()},
                             strict=False)
        assert not torch.allclose(ours(input_ids=ids, attention_mask=mask).logits[valid],
                                  logits[0], **TOLERANCE)
