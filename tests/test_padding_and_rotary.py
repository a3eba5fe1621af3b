"""flash-attn's bert_padding and layers.rotary helpers (flash_cann.api.bert_padding,
flash_cann.api.rotary) against straightforward loops over the tokens."""

from __future__ import annotations

import math

import pytest
import torch

from flash_cann.api import bert_padding, rotary

MASK = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)


def test_unpad_input_packs_the_real_tokens_in_order():
    hidden = torch.randn(3, 5, 4, requires_grad=True)
    packed, indices, cu_seqlens, max_seqlen, used = bert_padding.unpad_input(hidden, MASK)
    expected = [hidden[b, s] for b in range(3) for s in range(5) if MASK[b, s]]
    torch.testing.assert_close(packed, torch.stack(expected))
    assert indices.tolist() == [0, 1, 2, 6, 7, 8, 9, 10]
    assert cu_seqlens.tolist() == [0, 3, 7, 8] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 4 and isinstance(max_seqlen, int)
    assert used.tolist() == [3, 4, 1] and used.dtype == torch.int32
    packed.sum().backward()  # the gradient lands on the real tokens only
    torch.testing.assert_close(hidden.grad, MASK[..., None].float().expand(3, 5, 4))


def test_unused_slots_are_packed_but_not_counted_as_used():
    unused = torch.zeros_like(MASK)
    unused[0, 3:] = True   # sequence 0 becomes the longest packed one (5 slots, 3 used)
    packed, indices, cu_seqlens, max_seqlen, used = bert_padding.unpad_input(
        torch.randn(3, 5, 2), MASK, unused)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    assert cu_seqlens.tolist() == [0, 5, 9, 10] and used.tolist() == [3, 4, 1]
    assert max_seqlen == 5   # the longest packed sequence, unused slots included (flash-attn)


def test_pad_input_inverts_unpad_input_with_zeros_in_the_padding():
    hidden = torch.randn(3, 5, 2, 3)
    packed, indices, *_ = bert_padding.unpad_input(hidden, MASK.int())
    padded = bert_padding.pad_input(packed, indices, 3, 5)
    torch.testing.assert_close(padded, hidden * MASK[..., None, None])
    torch.testing.assert_close(bert_padding.index_first_axis(hidden.flatten(0, 1), indices),
                               packed)


@pytest.mark.parametrize("call, message", [
    (lambda: bert_padding.unpad_input(torch.randn(3, 4, 2), MASK), r"attention_mask must be "
                                                                   r"\(batch, seqlen\)"),
    (lambda: bert_padding.index_first_axis(torch.randn(4, 2), [0, 1]), "indices must be a "
                                                                      "torch.Tensor"),
    (lambda: bert_padding.pad_input(torch.randn(3, 2), torch.tensor([0, 1]), 1, 4),
     "one entry per row of values"),
])
def test_bad_padding_arguments_are_named(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def _tables(seqlen_rotary=12, rotary_dim=6):
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angles = torch.arange(seqlen_rotary).float()[:, None] * inv_freq
    return angles.cos(), angles.sin()


def _rotate_reference(x, cos, sin, interleaved, offsets):
    """Token by token, channel pair by channel pair."""
    out = x.clone()
    half = cos.shape[1]
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            position = s + offsets[b]
            for i in range(half):
                a, c = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                x1, x2 = x[b, s, :, a], x[b, s, :, c]
                cos_, sin_ = cos[position, i], sin[position, i]
                out[b, s, :, a], out[b, s, :, c] = x1 * cos_ - x2 * sin_, x1 * sin_ + x2 * cos_
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", [0, 3, torch.tensor([1, 4])])
def test_apply_rotary_emb_matches_the_pairwise_rotation(interleaved, offsets):
    cos, sin = _tables()
    x = torch.randn(2, 5, 3, 8)  # headdim 8 > rotary_dim 6: the last two pass through
    per_sequence = offsets.tolist() if isinstance(offsets, torch.Tensor) else [offsets] * 2
    expected = _rotate_reference(x, cos, sin, interleaved, per_sequence)
    out = rotary.apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    torch.testing.assert_close(out, expected)
    assert torch.equal(out[..., 6:], x[..., 6:])
    inplace = x.clone()
    assert rotary.apply_rotary_emb(inplace, cos, sin, interleaved, True, offsets) is inplace
    torch.testing.assert_close(inplace, expected)


def test_apply_rotary_emb_restarts_positions_in_each_packed_sequence():
    cos, sin = _tables()
    x = torch.randn(7, 2, 6)
    cu_seqlens = torch.tensor([0, 4, 7], dtype=torch.int32)
    out = rotary.apply_rotary_emb(x, cos, sin, cu_seqlens=cu_seqlens, max_seqlen=4)
    for start, end in ((0, 4), (4, 7)):
        alone = rotary.apply_rotary_emb(x[None, start:end], cos, sin)[0]
        torch.testing.assert_close(out[start:end], alone)


def test_rotation_keeps_the_norm_and_turns_by_the_position():
    cos, sin = _tables(rotary_dim=2)
    x = torch.zeros(1, 3, 1, 2)
    x[..., 0] = 1.0
    out = rotary.apply_rotary_emb(x, cos, sin)
    torch.testing.assert_close(out[0, :, 0, 1], torch.tensor([math.sin(p) for p in range(3)]))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("kwargs, message", [
    (dict(x=torch.randn(1, 20, 1, 8)), "too few for position 19"),
    (dict(x=torch.randn(1, 13, 1, 8)), "too few for position 12"),   # one past the table
    (dict(x=torch.randn(1, 4, 1, 4)), "rotary_dim = 2 \\* cos.shape\\[1\\] = 6 must be <= "
                                      "headdim 4"),
    (dict(x=torch.randn(4, 1, 8)), "x must be \\(batch_size, seqlen, nheads, headdim\\)"),
    (dict(x=torch.randn(1, 4, 1, 8), seqlen_offsets=1.5), "seqlen_offsets must be an int"),
])
def test_bad_rotary_arguments_are_named(kwargs, message):
    cos, sin = _tables()
    with pytest.raises((TypeError, ValueError), match=message):
        rotary.apply_rotary_emb(cos=cos, sin=sin, **kwargs)
