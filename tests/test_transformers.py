"""Hugging Face transformers on flash_cann (flash_cann.integrations.transformers): tiny,
randomly initialised Llama, Qwen2 and Mistral models built here (nothing downloaded) give
the logits, gradients and greedy generations of attn_implementation="sdpa", batched with
left and right padding, and GQA; what flash_cann cannot do is refused with the reason.
Runs on the CPU backend here (and on the lent GPU in the GPU tests)."""

from __future__ import annotations

import os
import sys

import pytest
import torch

try:
    import transformers
except ImportError as err:  # the test extra pins it (Python >= 3.11)
    if os.environ.get("CI") == "true" and sys.version_info >= (3, 11):
        pytest.fail(f"transformers (the test extra) is not installed: {err}",
                    pytrace=False)
    pytest.skip(f"transformers is not installed: {err}", allow_module_level=True)

from flash_cann.integrations import transformers as integration  # noqa: E402  (registers)

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
    torch.manual_seed(0)
    config = FAMILIES[request.param]()
    ours = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=integration.NAME)
    sdpa = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    sdpa.load_state_dict(ours.state_dict())
    return tuple(m.to(DEVICE, DTYPE).eval() for m in (ours, sdpa))


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


def test_attention_dropout_is_refused_with_the_reason():
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**TINY, attention_dropout=0.1),
        attn_implementation=integration.NAME).train()
    with pytest.raises(NotImplementedError, match=r"attention dropout 0\.1 is not supported .*"
                                                  r"model\.eval\(\)"):
        model(input_ids=torch.ones(1, 4, dtype=torch.long))


def _qkv(q_len=5, kv_len=7):
    generator = torch.Generator().manual_seed(2)
    return (torch.randn(2, 4, q_len, 8, generator=generator),
            torch.randn(2, 2, kv_len, 8, generator=generator),
            torch.randn(2, 2, kv_len, 8, generator=generator))


@pytest.mark.parametrize("kwargs, message", [
    (dict(sliding_window=4), "a sliding window of 4 over 7 keys"),
    (dict(softcap=30.0), "soft-capping"),
    (dict(attention_mask=torch.zeros(2, 1, 5, 7, dtype=torch.bool)), "got a 4-D mask"),
    (dict(cu_seq_lens_q=torch.tensor([0, 5])), "packed sequences"),
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
