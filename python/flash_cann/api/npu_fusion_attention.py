"""``torch_npu.npu_fusion_attention``'s signature on flash_cann, so that MindSpeed-style
code can switch with one import. docs/migration.md has the table of every argument.

Huawei's conventions kept here (they differ from flash-attn's): ``scale`` defaults to
1.0, not 1/sqrt(head_dim); ``atten_mask`` True / 1 = masked OUT; ``keep_prob`` is the
probability of keeping a score (dropout_p = 1 - keep_prob); ``actual_seq_qlen`` /
``actual_seq_kvlen`` are cumulative host lists WITHOUT the leading 0; without an
``atten_mask`` the sparse mode and the band are not applied (full attention), as Huawei
documents. Everything else is translated into flash_cann's bottom-right aligned window,
causal flag and key padding (flash_cann.api.fusion_masks) or refused by name.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch

from ..contract import capture
from ..contract import layout as layouts
from ..contract.checks import require_tensor
from . import fusion_masks
from .fusion_masks import FULL, Band, bottom_right_band
from .interface import _rng_state

LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
# Huawei's softmax_max / softmax_sum carry each row's value 8 times (32 bytes of fp32,
# the vector unit's block), a layout their backward reads.
SOFTMAX_STAT_WIDTH = 8
_NO_BAND = 2147483647  # pre_tockens / next_tockens' default: no bound


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"flash_cann: {name} must be an int (got {type(value).__name__} "
                        f"{value!r})")
    return int(value)


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"flash_cann: {name} must be a real number (got "
                        f"{type(value).__name__} {value!r})")
    return float(value)


def _refuse_unsupported(pse, padding_mask, prefix, sink, sparse_mode: int) -> None:
    if pse is not None:
        raise NotImplementedError(
            "flash_cann: pse (a materialised positional bias) is not supported; for ALiBi "
            "pass slopes to flash_cann.attention(..., alibi_slopes=...) / "
            "flash_cann.flash_attn_func(..., alibi_slopes=...) instead; pass pse=None")
    if padding_mask is not None:
        raise NotImplementedError("flash_cann: padding_mask is reserved (unused) in "
                                  "torch_npu.npu_fusion_attention too; pass None (key "
                                  "padding goes in atten_mask, True = masked out)")
    if sink is not None:
        raise NotImplementedError("flash_cann: sink (attention sinks) is not supported; "
                                  "pass sink=None")
    if prefix is not None or sparse_mode in (5, 6):
        raise NotImplementedError(
            f"flash_cann: prefix attention (prefix, sparse_mode 5 and 6) is not supported "
            f"(got prefix={prefix!r}, sparse_mode={sparse_mode}); supported sparse_mode: "
            f"0, 1, 2, 3, 4, 7, 8")


def _refuse_host_reads_in_capture(device, atten_mask, layout: str, keep_prob: float) -> None:
    """torch_npu's conventions that this translation reads on the host, refused by name
    during a graph capture (contract.capture) instead of failing inside the runtime."""
    reads = [what for what, used in (
        ("atten_mask's values (translated into flash_cann's causal band and key padding)",
         atten_mask is not None),
        ("actual_seq_qlen / actual_seq_kvlen (host lists in torch_npu's signature, copied to "
         "the device)", layout == "TND"),
        ("the dropout seed (returned as a Python int in torch_npu's signature)",
         keep_prob < 1)) if used]
    if reads:
        capture.refuse_host_read(device, "; ".join(reads),
                                 "capture flash_cann.flash_attn_func or "
                                 "flash_attn_varlen_func (device cu_seqlens) instead")


def _cumulative(lengths, name: str, total: int, tensor_name: str) -> list[int]:
    """Huawei's cumulative list (no leading 0) as flash_cann's cu_seqlens values."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    if not isinstance(lengths, (list, tuple)) or not lengths:
        raise TypeError(f"flash_cann: {name} must be a non-empty list of ints (cumulative "
                        f"sequence lengths without the leading 0) with input_layout 'TND' "
                        f"(got {lengths!r})")
    offsets = [0] + [_int(x, name) for x in lengths]
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"flash_cann: {name} must be cumulative (non-decreasing, >= 0), e.g. "
                         f"lengths 2, 2, 3 -> [2, 4, 7] (got {list(lengths)}); trailing 0s "
                         f"for skipped batches are not supported")
    if offsets[-1] != total:
        raise ValueError(f"flash_cann: {name}[-1] = {offsets[-1]} must equal {tensor_name}'s "
                         f"token count T = {total}")
    return offsets


def _as_op_layout(t: torch.Tensor, name: str, layout: str, head_dim: int | None):
    """A zero-copy view of ``t`` in a layout the op takes (BSND, BNSD or TND)."""
    dims = 3 if layout in ("BSH", "SBH", "TND") else 4
    if t.dim() != dims:
        raise ValueError(f"flash_cann: {name} must be {dims}-D for input_layout "
                         f"'{layout}' (got shape {tuple(t.shape)})")
    if layout == "BSH":
        return layouts.bsh_to_bsnd(t, head_dim, name)
    if layout == "SBH":  # (S, B, H) -> (S, B, N, D) -> (B, S, N, D): views only
        return layouts.bsh_to_bsnd(t, head_dim, name).transpose(0, 1)
    return t


def _scalar_arguments(head_num, input_layout, sparse_mode, scale, keep_prob, pre_tockens,
                      next_tockens, inner_precise, gen_mask_parallel, sync, softmax_layout):
    """The host arguments, checked: (head_num, layout, sparse_mode, scale, keep_prob,
    pre_tockens, next_tockens)."""
    head_num = _int(head_num, "head_num")
    if head_num < 1:
        raise ValueError(f"flash_cann: head_num must be >= 1 (got {head_num})")
    if not isinstance(input_layout, str) or input_layout.upper() not in LAYOUTS:
        raise ValueError(f"flash_cann: input_layout must be one of {', '.join(LAYOUTS)} "
                         f"(case-insensitive, as torch_npu) (got {input_layout!r})")
    layout = input_layout.upper()
    sparse_mode = _int(sparse_mode, "sparse_mode")
    if not 0 <= sparse_mode <= 8:
        raise ValueError(f"flash_cann: sparse_mode must be in 0..8 (got {sparse_mode})")
    if sparse_mode in (7, 8) and layout != "TND":
        raise ValueError(f"flash_cann: sparse_mode={sparse_mode} is for input_layout 'TND' "
                         f"only (got '{layout}')")
    scale = _real(scale, "scale")
    keep_prob = _real(keep_prob, "keep_prob")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"flash_cann: keep_prob must be in (0, 1] (got {keep_prob})")
    pre, nxt = _int(pre_tockens, "pre_tockens"), _int(next_tockens, "next_tockens")
    if _int(inner_precise, "inner_precise") not in (0, 1, 2):
        raise ValueError(f"flash_cann: inner_precise must be 0, 1 or 2 (got {inner_precise}); "
                         f"flash_cann computes one precision (fp32 softmax and accumulation) "
                         f"and always handles fully masked rows (2's purpose)")
    for name, flag in (("gen_mask_parallel", gen_mask_parallel), ("sync", sync)):
        if not isinstance(flag, bool):
            raise TypeError(f"flash_cann: {name} must be a bool (got {flag!r})")
    if softmax_layout not in ("", "TND") or softmax_layout == "TND" and layout != "TND":
        raise ValueError(f"flash_cann: softmax_layout must be '' or, with input_layout 'TND', "
                         f"'TND' (got {softmax_layout!r} with '{layout}')")
    return head_num, layout, sparse_mode, scale, keep_prob, pre, nxt


def _sequence_band(sparse_mode: int, index: int, count: int, seqlen_q: int, seqlen_k: int,
                   pre: int, nxt: int) -> Band:
    """The mapped band of one problem (a sequence of a TND batch, or a whole batched call)
    under sparse_mode 2, 3, 4, 7 or 8, all of which Huawei aligns as documented:
    2 left-up causal (j <= i), 3 right-down causal, 4 band (pre, next) from the bottom
    right; 7 = 3 except the LAST sequence, 8 = 2 except the FIRST, which take the band
    (the pieces left when a long sequence is cut across devices)."""
    if sparse_mode == 7 and index == count - 1 or sparse_mode == 8 and index == 0:
        sparse_mode = 4
    elif sparse_mode == 7:
        sparse_mode = 3
    elif sparse_mode == 8:
        sparse_mode = 2
    if sparse_mode == 2:  # j <= i  <=>  d <= seqlen_q - seqlen_k
        return bottom_right_band(None, seqlen_q - seqlen_k, seqlen_q, seqlen_k,
                                 "pre_tockens", "next_tockens")
    if sparse_mode == 3:
        return bottom_right_band(None, 0, seqlen_q, seqlen_k, "pre_tockens", "next_tockens")
    return bottom_right_band(pre, nxt, seqlen_q, seqlen_k, "pre_tockens", "next_tockens")


def _tnd_groups(bands: list[Band | None]) -> list[tuple[int, int, Band]]:
    """Runs of consecutive sequences with the same band: one flash_cann call each. A
    sequence whose keys or queries are cut short goes alone (its kept rows are then one
    slice). A sequence without query rows (band None) computes nothing: it rides along
    in the run before it, or forms a run of its own that makes no call."""
    groups: list[tuple[int, int, Band]] = []
    for b, band in enumerate(bands):
        run = groups[-1][2] if groups else None
        whole = run is not None and run.keys is None and run.queries is None
        if whole and (band is None or band == run):
            groups[-1] = (groups[-1][0], b + 1, run)
        else:
            groups.append((b, b + 1, FULL if band is None else band))
    return groups


def _fwd(q, k, v, key_padding_mask, band: Band, layout: str, scale: float, dropout_p: float,
         rng_state, **varlen):
    return torch.ops.flash_cann.fwd(
        q, k, v, key_padding_mask, rng_state=rng_state, scale=scale, layout=layout,
        dropout_p=dropout_p, **band.op_arguments(), **varlen)


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=_NO_BAND,
                         next_tockens=_NO_BAND, inner_precise=0, prefix=None,
                         actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """torch_npu.npu_fusion_attention's arguments and outputs, computed by flash_cann.

    Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset,
    numels)``:

    - attention_out: query's shape and input_layout, differentiable w.r.t. query, key,
      value through autograd (there is no separate npu_fusion_attention_grad).
    - softmax_max, softmax_sum: float32 (B, N1, S1, 8), or (T, N1, 8) for TND, each row's
      value repeated 8 times. flash_cann keeps one statistic, the logsumexp; it is
      returned as softmax_max = lse and softmax_sum = 1, so softmax_max + log(softmax_sum)
      = lse, as for Huawei's pair (not their individual values: Huawei's max is the
      row's largest score). Rows that see no key: -inf and 1.
    - softmax_out: an empty tensor (reserved, as in torch_npu).
    - seed, offset: ints; with keep_prob < 1 the seed of flash_cann's Philox dropout
      mask and 0; else 0, 0. They seed flash_cann's generator, not Huawei's
      DropoutGenMask: the dropped positions differ from torch_npu's.
    - numels: B * N1 * S1 * S2 (TND: N1 * sum of S1_b * S2_b), as torch_npu computes it.

    See docs/migration.md for every argument (mapped, refused or without effect) and
    the sparse modes.
    """
    head_num, layout, sparse_mode, scale, keep_prob, pre, nxt = _scalar_arguments(
        head_num, input_layout, sparse_mode, scale, keep_prob, pre_tockens, next_tockens,
        inner_precise, gen_mask_parallel, sync, softmax_layout)
    _refuse_unsupported(pse, padding_mask, prefix, sink, sparse_mode)
    query, key, value = (require_tensor(t, n) for t, n in
                         ((query, "query"), (key, "key"), (value, "value")))
    if atten_mask is not None:
        atten_mask = require_tensor(atten_mask, "atten_mask")
        if atten_mask.dtype not in (torch.bool, torch.uint8):
            raise TypeError(f"flash_cann: atten_mask must be torch.bool or torch.uint8 "
                            f"(True / 1 = masked out) (got {atten_mask.dtype})")
        if atten_mask.device != query.device:
            raise ValueError(f"flash_cann: atten_mask must be on query's device "
                             f"({query.device}; got {atten_mask.device})")
    elif sparse_mode not in (0, 1):
        warnings.warn(f"flash_cann.npu_fusion_attention: sparse_mode={sparse_mode} without "
                      f"atten_mask computes FULL attention (no causal mask, no band), as "
                      f"torch_npu documents; pass the compressed 2048x2048 mask for the mode "
                      f"to apply", stacklevel=2)
    _refuse_host_reads_in_capture(query.device, atten_mask, layout, keep_prob)
    dropout_p = 1.0 - keep_prob
    rng_state = _rng_state(dropout_p, query.device, None) if dropout_p > 0 else None

    head_dim = None
    if layout in ("BSH", "SBH"):
        if query.dim() == 3 and query.shape[-1] % head_num:
            raise ValueError(f"flash_cann: query's hidden size {query.shape[-1]} must be a "
                             f"multiple of head_num={head_num} for input_layout '{layout}'")
        head_dim = query.shape[-1] // head_num if query.dim() == 3 else None
    q, k, v = (_as_op_layout(t, n, layout, head_dim) for t, n in
               ((query, "query"), (key, "key"), (value, "value")))
    if layout in ("BSND", "BNSD", "TND"):
        heads_q = q.shape[1] if layout in ("BNSD", "TND") else q.shape[2]
        if heads_q != head_num:
            raise ValueError(f"flash_cann: head_num={head_num} does not match query's "
                             f"{heads_q} heads in input_layout '{layout}'")
    if layout == "TND":
        out, lse, numels = _packed(q, k, v, atten_mask, actual_seq_qlen, actual_seq_kvlen,
                                   sparse_mode, pre, nxt, scale, dropout_p, rng_state)
        softmax_stat = lse.transpose(0, 1)                            # (T, N1)
    else:
        for name, lengths in (("actual_seq_qlen", actual_seq_qlen),
                              ("actual_seq_kvlen", actual_seq_kvlen)):
            if lengths is not None:
                raise ValueError(f"flash_cann: {name} is only taken with input_layout 'TND' "
                                 f"(got input_layout '{layout}')")
        op_layout = "BNSD" if layout == "BNSD" else "BSND"
        out, lse = _batched(q, k, v, atten_mask, op_layout, sparse_mode, pre, nxt, scale,
                            dropout_p, rng_state)
        batch, heads_q, seqlen_q = lse.shape
        numels = batch * heads_q * seqlen_q * layouts.sizes(k, op_layout)[2]
        softmax_stat = lse
        if layout == "BSH":
            out = out.flatten(-2)
        elif layout == "SBH":
            out = out.transpose(0, 1).reshape(query.shape[0], query.shape[1], -1)
    softmax_max = softmax_stat.unsqueeze(-1).expand(*softmax_stat.shape,
                                                     SOFTMAX_STAT_WIDTH).contiguous()
    softmax_sum = torch.ones_like(softmax_max)
    softmax_out = torch.empty(0, dtype=query.dtype, device=query.device)
    seed = int(rng_state[0]) if rng_state is not None else 0
    return out, softmax_max, softmax_sum, softmax_out, seed, 0, numels


def _batched(q, k, v, atten_mask, layout, sparse_mode, pre, nxt, scale, dropout_p, rng_state):
    """One flash_cann call for BSND / BNSD views (BSH and SBH arrive as BSND views)."""
    batch, heads_q, seqlen_q, _ = layouts.sizes(q, layout)
    seqlen_k = layouts.sizes(k, layout)[2]
    key_padding_mask = None
    if atten_mask is None:
        band = FULL
    elif sparse_mode in (0, 1):
        band, key_padding_mask = fusion_masks.dense_mask_as_flash_cann(
            atten_mask, batch, heads_q, seqlen_q, seqlen_k,
            top_left_band=(pre, nxt) if sparse_mode == 0 else None)
    else:
        fusion_masks.check_compressed_mask(atten_mask, sparse_mode)
        band = _sequence_band(sparse_mode, 0, 1, seqlen_q, seqlen_k, pre, nxt)
    seq_axis = layout.index("S")
    if band.keys is not None:  # keys no row sees are dropped: a view
        k, v = (t.narrow(seq_axis, 0, band.keys) for t in (k, v))
    if band.queries is None:
        return _fwd(q, k, v, key_padding_mask, band, layout, scale, dropout_p, rng_state)
    out, lse = _fwd(q.narrow(seq_axis, 0, band.queries), k, v, key_padding_mask, band, layout,
                    scale, dropout_p, rng_state)
    return _unseen_rows(out, lse, seqlen_q - band.queries, seq_axis, 2)


def _unseen_rows(out, lse, rows: int, out_axis: int, lse_axis: int):
    """Append ``rows`` query rows that see no key: output 0, lse -inf."""
    out_shape, lse_shape = list(out.shape), list(lse.shape)
    out_shape[out_axis], lse_shape[lse_axis] = rows, rows
    return (torch.cat((out, out.new_zeros(out_shape)), dim=out_axis),
            torch.cat((lse, lse.new_full(lse_shape, -math.inf)), dim=lse_axis))


def _packed(q, k, v, atten_mask, actual_seq_qlen, actual_seq_kvlen, sparse_mode, pre, nxt,
            scale, dropout_p, rng_state):
    """TND: one flash_cann call per run of sequences that share a mapped band."""
    cu_q = _cumulative(actual_seq_qlen, "actual_seq_qlen", q.shape[0], "query")
    cu_k = _cumulative(actual_seq_kvlen, "actual_seq_kvlen", k.shape[0], "key")
    if len(cu_q) != len(cu_k):
        raise ValueError(f"flash_cann: actual_seq_qlen and actual_seq_kvlen must have the same "
                         f"length (got {len(cu_q) - 1} and {len(cu_k) - 1})")
    count = len(cu_q) - 1
    lengths = [(cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]) for b in range(count)]
    numels = q.shape[1] * sum(sq * sk for sq, sk in lengths)
    if atten_mask is None:
        bands = [FULL] * count
    elif sparse_mode in (0, 1):
        raise NotImplementedError(
            f"flash_cann: a full atten_mask (sparse_mode={sparse_mode}) with input_layout "
            f"'TND' is not supported; use sparse_mode 2, 3, 4, 7 or 8 with the compressed "
            f"2048x2048 mask, or flash_cann.flash_attn_varlen_func")
    else:
        fusion_masks.check_compressed_mask(atten_mask, sparse_mode)
        bands = [_sequence_band(sparse_mode, b, count, sq, sk, pre, nxt) if sq else None
                 for b, (sq, sk) in enumerate(lengths)]
    outs, lses = [], []
    for first, last, band in _tnd_groups(bands):
        if cu_q[last] == cu_q[first]:
            continue
        q_end = cu_q[last] if band.queries is None else cu_q[first] + band.queries
        k_end = cu_k[last] if band.keys is None else cu_k[first] + band.keys
        seq_q = ([x - cu_q[first] for x in cu_q[first:last + 1]] if band.queries is None
                 else [0, band.queries])
        seq_k = ([x - cu_k[first] for x in cu_k[first:last + 1]] if band.keys is None
                 else [0, band.keys])
        # The Philox counter takes the sequence index + rng_state[1]: offsetting by the
        # run's first sequence gives every sequence the mask one call would have drawn.
        group_rng = None if rng_state is None else rng_state + torch.tensor(
            [0, first], dtype=rng_state.dtype, device=rng_state.device)
        keys = slice(cu_k[first], k_end)
        out, lse = _fwd(
            q[cu_q[first]:q_end], k[keys], v[keys], None, band, "TND", scale, dropout_p,
            group_rng,
            cu_seqlens_q=torch.tensor(seq_q, dtype=torch.int32, device=q.device),
            cu_seqlens_k=torch.tensor(seq_k, dtype=torch.int32, device=q.device),
            max_seqlen_q=max(1, max(b - a for a, b in zip(seq_q, seq_q[1:]))),
            max_seqlen_k=max(1, max(b - a for a, b in zip(seq_k, seq_k[1:]))))
        if band.queries is not None:
            out, lse = _unseen_rows(out, lse, cu_q[last] - q_end, 0, 1)
        outs.append(out)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0], lses[0], numels
    return torch.cat(outs), torch.cat(lses, dim=1), numels
