"""``torch_npu.npu_fusion_attention``'s signature on flash_cann, so that MindSpeed-style
code can switch with one import. docs/migration.md has the table of every argument.

Huawei's conventions kept here (they differ from flash-attn's): ``scale`` defaults to
1.0, not 1/sqrt(head_dim); ``atten_mask`` True / 1 = masked OUT; ``keep_prob`` is the
probability of keeping a score (dropout_p = 1 - keep_prob); ``actual_seq_qlen`` /
``actual_seq_kvlen`` are cumulative host lists WITHOUT the leading 0; without an
``atten_mask`` the sparse mode and the band are not applied (full attention), as Huawei
documents. Everything else is translated into flash_cann's bottom-right aligned window,
causal flag and key padding (flash_cann.api.fusion_masks) or refused by name.

One translation (``_translate``: the query rows cut into segments, each one
torch.ops.flash_cann call or rows that see no key) serves the forward
(``npu_fusion_attention``, ``npu_fusion_attention_v3``) and
``npu_fusion_attention_grad``, which runs torch.ops.flash_cann.bwd over the same
segments from the statistics and output it is given.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

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


def _refuse_unsupported(pse, padding_mask, prefix, sparse_mode: int) -> None:
    if pse is not None:
        raise NotImplementedError(
            "flash_cann: pse (a materialised positional bias) is not supported; for ALiBi "
            "pass slopes to flash_cann.attention(..., alibi_slopes=...) / "
            "flash_cann.flash_attn_func(..., alibi_slopes=...) instead; pass pse=None")
    if padding_mask is not None:
        raise NotImplementedError("flash_cann: padding_mask is reserved (unused) in "
                                  "torch_npu.npu_fusion_attention too; pass None (key "
                                  "padding goes in atten_mask, True = masked out)")
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


@dataclass(frozen=True)
class _Segment:
    """Query rows ``[first, first + rows)`` (the sequence axis of a batched call, the
    token axis of TND) and how they are computed: ``window`` None = they see no key
    (output 0, lse -inf, or the head's sink logit), else one torch.ops.flash_cann call
    with that causal / window over keys ``[key_first, key_first + keys)``; TND calls
    carry their cu_seqlens (relative to ``first`` / ``key_first``) and add
    ``rng_offset`` to the dropout offset (the Philox counter's sequence index)."""

    first: int
    rows: int
    window: dict | None = None
    key_first: int = 0
    keys: int = 0
    seq_q: tuple[int, ...] | None = None
    seq_k: tuple[int, ...] | None = None
    rng_offset: int = 0


def _band_segments(band: Band, seqlen_q: int, seqlen_k: int, row0: int = 0, key0: int = 0,
                   sequence: int | None = None) -> list[_Segment]:
    """One problem's (a batched call, or one TND sequence when ``sequence`` is given)
    segments under ``band``: its row blocks (one, or two when split), then the rows that
    see no key."""
    keys = seqlen_k if band.keys is None else band.keys
    segments = []
    for first, rows, window in band.row_blocks(seqlen_q):
        varlen = {} if sequence is None else dict(seq_q=(0, rows), seq_k=(0, keys),
                                                  rng_offset=sequence)
        segments.append(_Segment(row0 + first, rows, window, key0, keys, **varlen))
    if band.queries is not None and band.queries < seqlen_q:
        segments.append(_Segment(row0 + band.queries, seqlen_q - band.queries))
    return segments


@dataclass
class _Problem:
    """A checked npu_fusion_attention call as flash_cann calls: the op-layout views of
    query, key and value, the segments of query rows (in row order, covering every row),
    and what the outputs need."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    layout: str                      # the op's: BNSD, BSND or TND
    input_layout: str                # the caller's
    segments: list[_Segment]
    key_padding_mask: torch.Tensor | None
    numels: int
    sinks: torch.Tensor | None
    head_dim: int | None             # BSH / SBH: the head size the hidden axis splits into
    query_shape: tuple               # query's shape in the caller's layout

    @property
    def row_axis(self) -> int:
        return self.layout.index("S") if self.layout != "TND" else 0

    @property
    def lse_axis(self) -> int:
        return 1 if self.layout == "TND" else 2

    def view(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """Another tensor of query's input layout (dy, attention_in) in the op's layout."""
        if tuple(t.shape) != tuple(self.query_shape):
            raise ValueError(f"flash_cann: {name} must have query's shape "
                             f"{tuple(self.query_shape)} (got {tuple(t.shape)})")
        return _as_op_layout(t, name, self.input_layout, self.head_dim)

    def to_input_layout(self, out: torch.Tensor) -> torch.Tensor:
        if self.input_layout == "BSH":
            return out.flatten(-2)
        if self.input_layout == "SBH":
            return out.transpose(0, 1).flatten(-2)
        return out

    def stat_from_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """lse (op layout) as torch_npu's softmax statistic's rows: (B, N1, S1) / (T, N1)."""
        return lse.transpose(0, 1) if self.layout == "TND" else lse

    def lse_from_stat(self, stat: torch.Tensor) -> torch.Tensor:
        return stat.transpose(0, 1) if self.layout == "TND" else stat


def _translate(query, key, value, head_num: int, layout: str, atten_mask, sparse_mode: int,
               pre: int, nxt: int, actual_seq_qlen, actual_seq_kvlen, sink) -> _Problem:
    """Check the tensors and translate the masks: everything both the forward and
    npu_fusion_attention_grad compute from the same arguments."""
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
                      f"to apply", stacklevel=3)
    sinks = _sinks(sink, head_num, query)
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
    key_padding_mask = None
    if layout == "TND":
        segments, numels = _packed_segments(q, k, atten_mask, actual_seq_qlen, actual_seq_kvlen,
                                            sparse_mode, pre, nxt)
        op_layout = "TND"
    else:
        for name, lengths in (("actual_seq_qlen", actual_seq_qlen),
                              ("actual_seq_kvlen", actual_seq_kvlen)):
            if lengths is not None:
                raise ValueError(f"flash_cann: {name} is only taken with input_layout 'TND' "
                                 f"(got input_layout '{layout}')")
        op_layout = "BNSD" if layout == "BNSD" else "BSND"
        batch, heads_q, seqlen_q, _ = layouts.sizes(q, op_layout)
        seqlen_k = layouts.sizes(k, op_layout)[2]
        if atten_mask is None:
            band = FULL
        elif sparse_mode in (0, 1):
            band, key_padding_mask = fusion_masks.dense_mask_as_flash_cann(
                atten_mask, batch, heads_q, seqlen_q, seqlen_k,
                top_left_band=(pre, nxt) if sparse_mode == 0 else None)
        else:
            fusion_masks.check_compressed_mask(atten_mask, sparse_mode)
            band = _sequence_band(sparse_mode, 0, 1, seqlen_q, seqlen_k, pre, nxt)
        segments = _band_segments(band, seqlen_q, seqlen_k)
        numels = batch * heads_q * seqlen_q * seqlen_k
    return _Problem(q, k, v, op_layout, layout, segments, key_padding_mask, numels, sinks,
                    head_dim, tuple(query.shape))


def _sinks(sink, head_num: int, query: torch.Tensor) -> torch.Tensor | None:
    """torch_npu's sink: one float32 logit per query head, shape (head_num,), that joins
    every row's softmax denominator -- flash_cann's sinks (in the accumulator dtype)."""
    if sink is None:
        return None
    sink = require_tensor(sink, "sink")
    if tuple(sink.shape) != (head_num,) or not sink.is_floating_point():
        raise ValueError(f"flash_cann: sink must be a float32 tensor of shape (head_num,) = "
                         f"({head_num},): one logit per query head (got {sink.dtype} "
                         f"{tuple(sink.shape)})")
    if sink.device != query.device:
        raise ValueError(f"flash_cann: sink must be on query's device ({query.device}; got "
                         f"{sink.device})")
    want = torch.float64 if query.dtype == torch.float64 else torch.float32
    return sink if sink.dtype == want else sink.to(want)


def _packed_segments(q, k, atten_mask, actual_seq_qlen, actual_seq_kvlen, sparse_mode: int,
                     pre: int, nxt: int) -> tuple[list[_Segment], int]:
    """TND: one flash_cann call per run of sequences that share a mapped band; a sequence
    whose keys or rows are cut, or whose rows are split, is a run of its own."""
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
    segments = []
    for first, last, band in _tnd_groups(bands):
        if cu_q[last] == cu_q[first]:
            continue
        if band.keys is None and band.queries is None and band.split is None:
            # The Philox counter takes the sequence index + rng_state[1]: offsetting by the
            # run's first sequence gives every sequence the mask one call would have drawn.
            segments.append(_Segment(
                cu_q[first], cu_q[last] - cu_q[first], band.op_arguments(), cu_k[first],
                cu_k[last] - cu_k[first], tuple(x - cu_q[first] for x in cu_q[first:last + 1]),
                tuple(x - cu_k[first] for x in cu_k[first:last + 1]), first))
        else:
            segments += _band_segments(band, *lengths[first], cu_q[first], cu_k[first], first)
    return segments, numels


def _tnd_groups(bands: list[Band | None]) -> list[tuple[int, int, Band]]:
    """Runs of consecutive sequences with the same band: one flash_cann call each. A
    sequence whose keys or queries are cut short, or whose rows are split, goes alone. A
    sequence without query rows (band None) computes nothing: it rides along in the run
    before it, or forms a run of its own that makes no call."""
    groups: list[tuple[int, int, Band]] = []
    for b, band in enumerate(bands):
        run = groups[-1][2] if groups else None
        whole = run is not None and run.keys is None and run.queries is None and run.split is None
        if whole and (band is None or band == run):
            groups[-1] = (groups[-1][0], b + 1, run)
        else:
            groups.append((b, b + 1, FULL if band is None else band))
    return groups


def _segment_arguments(problem: _Problem, seg: _Segment, rng_state):
    """The tensors' slices and keyword arguments of one segment's flash_cann call."""
    axis = problem.row_axis
    q = problem.q.narrow(axis, seg.first, seg.rows)
    k, v = (t.narrow(axis, seg.key_first, seg.keys) for t in (problem.k, problem.v))
    kwargs = dict(seg.window)
    if seg.seq_q is not None:
        device = q.device
        kwargs.update(cu_seqlens_q=torch.tensor(seg.seq_q, dtype=torch.int32, device=device),
                      cu_seqlens_k=torch.tensor(seg.seq_k, dtype=torch.int32, device=device),
                      max_seqlen_q=max(1, max(b - a for a, b in zip(seg.seq_q, seg.seq_q[1:]))),
                      max_seqlen_k=max(1, max(b - a for a, b in zip(seg.seq_k, seg.seq_k[1:]))))
    if rng_state is not None and seg.rng_offset:
        rng_state = rng_state + torch.tensor([0, seg.rng_offset], dtype=rng_state.dtype,
                                             device=rng_state.device)
    kpm = problem.key_padding_mask
    if kpm is not None:
        kpm = kpm.narrow(1, seg.key_first, seg.keys)
    return q, k, v, kpm, rng_state, kwargs


def _unseen_lse(problem: _Problem, seg: _Segment, like: torch.Tensor) -> torch.Tensor:
    """lse of rows that see no key: -inf, or the head's sink logit."""
    if problem.layout == "TND":
        shape, heads_at = (like.shape[1], seg.rows), 0
    else:
        batch, heads, _, _ = layouts.sizes(problem.q, problem.layout)
        shape, heads_at = (batch, heads, seg.rows), 1
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    if problem.sinks is None:
        return torch.full(shape, -math.inf, dtype=dtype, device=like.device)
    view = [1] * len(shape)
    view[heads_at] = -1
    return problem.sinks.view(view).expand(shape)


def _forward(problem: _Problem, scale: float, dropout_p: float, rng_state):
    """(out, lse) in the op's layout: each segment's call, concatenated in row order
    (differentiable through autograd: each call's own backward)."""
    outs, lses = [], []
    for seg in problem.segments:
        if seg.window is None:
            rows = problem.q.narrow(problem.row_axis, seg.first, seg.rows)
            outs.append(torch.zeros_like(rows))
            lses.append(_unseen_lse(problem, seg, rows))
            continue
        q, k, v, kpm, rng, kwargs = _segment_arguments(problem, seg, rng_state)
        out, lse = torch.ops.flash_cann.fwd(q, k, v, kpm, rng_state=rng, scale=scale,
                                            layout=problem.layout, dropout_p=dropout_p,
                                            sinks=problem.sinks, **kwargs)
        outs.append(out)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0], lses[0]
    return torch.cat(outs, dim=problem.row_axis), torch.cat(lses, dim=problem.lse_axis)


def _backward(problem: _Problem, dy, out, lse, scale: float, dropout_p: float, rng_state):
    """(dq, dk, dv, dsink) in the op's layout from the given out and lse: each segment's
    torch.ops.flash_cann.bwd (P recomputed from lse, D = rowsum(dy * out))."""
    axis, lse_axis = problem.row_axis, problem.lse_axis
    dq = torch.zeros_like(problem.q)
    dk, dv = torch.zeros_like(problem.k), torch.zeros_like(problem.v)
    dsink = None if problem.sinks is None else torch.zeros_like(problem.sinks)
    for seg in problem.segments:
        rows = [t.narrow(axis, seg.first, seg.rows) for t in (dy, out)]
        seg_lse = lse.narrow(lse_axis, seg.first, seg.rows)
        if seg.window is None:
            if dsink is not None:  # the sink's share of rows that see no key: -P_sink * D
                d = (rows[0].to(seg_lse.dtype) * rows[1].to(seg_lse.dtype)).sum(-1)
                d = d if problem.layout == "BNSD" else d.transpose(-1, -2)
                sinks = problem.sinks.view(-1, 1) if problem.layout == "TND" else \
                    problem.sinks.view(1, -1, 1)
                share = torch.exp(sinks - seg_lse) * d
                dsink -= share.sum(-1) if problem.layout == "TND" else share.sum((0, 2))
            continue
        q, k, v, kpm, rng, kwargs = _segment_arguments(problem, seg, rng_state)
        gq, gk, gv, gs = torch.ops.flash_cann.bwd(
            rows[0], q, k, v, rows[1], seg_lse, kpm, None, scale=scale, layout=problem.layout,
            rng_state=rng, sinks=problem.sinks, dropout_p=dropout_p, **kwargs)
        dq.narrow(axis, seg.first, seg.rows).copy_(gq)
        dk.narrow(axis, seg.key_first, seg.keys).add_(gk)
        dv.narrow(axis, seg.key_first, seg.keys).add_(gv)
        if dsink is not None:
            dsink += gs
    return dq, dk, dv, dsink


def _softmax_stats(problem: _Problem, lse: torch.Tensor):
    """torch_npu's (softmax_max, softmax_sum): lse and 1, each row's value 8 times."""
    stat = problem.stat_from_lse(lse)
    softmax_max = stat.unsqueeze(-1).expand(*stat.shape, SOFTMAX_STAT_WIDTH).contiguous()
    return softmax_max, torch.ones_like(softmax_max)


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=_NO_BAND,
                         next_tockens=_NO_BAND, inner_precise=0, prefix=None,
                         actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """torch_npu.npu_fusion_attention's arguments and outputs, computed by flash_cann.

    Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset,
    numels)``:

    - attention_out: query's shape and input_layout, differentiable w.r.t. query, key,
      value (and sink) through autograd; npu_fusion_attention_grad computes the same
      gradients from the saved statistics.
    - softmax_max, softmax_sum: float32 (B, N1, S1, 8), or (T, N1, 8) for TND, each row's
      value repeated 8 times. flash_cann keeps one statistic, the logsumexp; it is
      returned as softmax_max = lse and softmax_sum = 1, so softmax_max + log(softmax_sum)
      = lse, as for Huawei's pair (not their individual values: Huawei's max is the
      row's largest score). Rows that see no key: -inf (with ``sink``: the head's sink
      logit) and 1.
    - softmax_out: an empty tensor (reserved, as in torch_npu).
    - seed, offset: ints; with keep_prob < 1 the seed of flash_cann's Philox dropout
      mask and 0; else 0, 0. They seed flash_cann's generator, not Huawei's
      DropoutGenMask: the dropped positions differ from torch_npu's.
    - numels: B * N1 * S1 * S2 (TND: N1 * sum of S1_b * S2_b), as torch_npu computes it.

    ``sink``: float32 (head_num,), one logit per query head that joins every row's
    softmax denominator (flash_cann's ``sinks``). See docs/migration.md for every
    argument (mapped, refused or without effect) and the sparse modes.
    """
    head_num, layout, sparse_mode, scale, keep_prob, pre, nxt = _scalar_arguments(
        head_num, input_layout, sparse_mode, scale, keep_prob, pre_tockens, next_tockens,
        inner_precise, gen_mask_parallel, sync, softmax_layout)
    _refuse_unsupported(pse, padding_mask, prefix, sparse_mode)
    query = require_tensor(query, "query")
    _refuse_host_reads_in_capture(query.device, atten_mask, layout, keep_prob)
    problem = _translate(query, key, value, head_num, layout, atten_mask, sparse_mode, pre, nxt,
                         actual_seq_qlen, actual_seq_kvlen, sink)
    dropout_p = 1.0 - keep_prob
    rng_state = _rng_state(dropout_p, query.device, None) if dropout_p > 0 else None
    out, lse = _forward(problem, scale, dropout_p, rng_state)
    softmax_max, softmax_sum = _softmax_stats(problem, lse)
    softmax_out = torch.empty(0, dtype=query.dtype, device=query.device)
    seed = int(rng_state[0]) if rng_state is not None else 0
    return (problem.to_input_layout(out), softmax_max, softmax_sum, softmax_out, seed, 0,
            problem.numels)


def _host_lengths(lengths, name: str):
    """npu_fusion_attention_v3's actual_seq_qlen / kvlen: an int tensor (torch_npu: a cpu
    int64 one) or, as v1 takes them, a list."""
    if isinstance(lengths, torch.Tensor):
        if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
            raise TypeError(f"flash_cann: {name} must be a 1-D integer tensor of cumulative "
                            f"lengths (got {lengths.dtype} {tuple(lengths.shape)})")
        return [int(x) for x in lengths.tolist()]
    return lengths


def npu_fusion_attention_v3(query, key, value, head_num, input_layout, pse=None,
                            padding_mask=None, atten_mask=None, scale=1.0, keep_prob=1.0,
                            pre_tockens=_NO_BAND, next_tockens=_NO_BAND, inner_precise=0,
                            prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                            sparse_mode=0, gen_mask_parallel=True, sync=False,
                            softmax_layout="", sink=None):
    """torch_npu.npu_fusion_attention_v3: npu_fusion_attention with actual_seq_qlen /
    actual_seq_kvlen as 1-D integer tensors (read on the host, as torch_npu documents
    them: cpu tensors) and six tensor outputs ``(attention_out, softmax_max,
    softmax_sum, softmax_out, seed, offset)``, seed and offset int64 0-d tensors on the
    cpu (torch_npu returns them on the cpu outside aclgraph). Same computation, same
    refusals."""
    out, softmax_max, softmax_sum, softmax_out, seed, offset, _ = npu_fusion_attention(
        query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask,
        atten_mask=atten_mask, scale=scale, keep_prob=keep_prob, pre_tockens=pre_tockens,
        next_tockens=next_tockens, inner_precise=inner_precise, prefix=prefix,
        actual_seq_qlen=_host_lengths(actual_seq_qlen, "actual_seq_qlen"),
        actual_seq_kvlen=_host_lengths(actual_seq_kvlen, "actual_seq_kvlen"),
        sparse_mode=sparse_mode, gen_mask_parallel=gen_mask_parallel, sync=sync,
        softmax_layout=softmax_layout, sink=sink)
    return (out, softmax_max, softmax_sum, softmax_out, torch.tensor(seed, dtype=torch.int64),
            torch.tensor(offset, dtype=torch.int64))


def _statistic(t, name: str, problem: _Problem) -> torch.Tensor:
    """softmax_max / softmax_sum as given: (B, N1, S1, 8) or (T, N1, 8), or without the
    trailing 8; their rows' first value."""
    t = require_tensor(t, name)
    rows = (tuple(problem.q.shape[:2]) if problem.layout == "TND"
            else tuple(layouts.sizes(problem.q, problem.layout)[:3]))
    if tuple(t.shape) not in (rows, (*rows, SOFTMAX_STAT_WIDTH)):
        raise ValueError(f"flash_cann: {name} must have shape {(*rows, SOFTMAX_STAT_WIDTH)} "
                         f"(as npu_fusion_attention returns it) or {rows} (got "
                         f"{tuple(t.shape)})")
    return t[..., 0] if t.dim() == len(rows) + 1 else t


def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse=None,
                              padding_mask=None, atten_mask=None, softmax_max=None,
                              softmax_sum=None, softmax_in=None, attention_in=None,
                              scale_value=1.0, keep_prob=1.0, pre_tockens=_NO_BAND,
                              next_tockens=_NO_BAND, inner_precise=0, seed=0, offset=0,
                              numels=0, prefix=None, actual_seq_qlen=None,
                              actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                              sync=False, softmax_layout="", sink=None):
    """torch_npu.npu_fusion_attention_grad: the gradients of npu_fusion_attention from its
    saved outputs, as MindSpeed's ring attention calls it.

    Returns ``(dq, dk, dv, dpse)`` (dpse an empty tensor: pse is refused), and with
    ``sink`` ``(dq, dk, dv, dpse, dsink)`` (torch_npu's newest signature returns the
    five, dsink empty without sink).

    The statistics are taken as given, not recomputed: each row's lse is softmax_max +
    log(softmax_sum) -- flash_cann's pair (lse, 1) and Huawei's genuine (row max, row
    sum) give the same lse -- P = exp(scale * q k^T - lse) and D = rowsum(dy *
    attention_in), so a ring attention's merged statistics and output work. ``seed`` /
    ``offset``: what the forward returned (keep_prob < 1: the Philox mask is drawn again
    from them); ``numels`` is unused (Huawei's DropoutGenMask length). Every mask
    argument is translated as the forward translates it.
    """
    head_num, layout, sparse_mode, scale, keep_prob, pre, nxt = _scalar_arguments(
        head_num, input_layout, sparse_mode, scale_value, keep_prob, pre_tockens,
        next_tockens, inner_precise, gen_mask_parallel, sync, softmax_layout)
    _refuse_unsupported(pse, padding_mask, prefix, sparse_mode)
    seed, offset = _int(seed, "seed"), _int(offset, "offset")
    _int(numels, "numels")
    if softmax_in is not None and require_tensor(softmax_in, "softmax_in").numel():
        raise NotImplementedError("flash_cann: softmax_in is reserved (npu_fusion_attention "
                                  "returns it empty); pass None or the empty tensor")
    for name, t in (("softmax_max", softmax_max), ("softmax_sum", softmax_sum),
                    ("attention_in", attention_in)):
        if t is None:
            raise ValueError(f"flash_cann: {name} is required: npu_fusion_attention_grad "
                             f"uses the forward's saved statistics and output")
    query = require_tensor(query, "query")
    _refuse_host_reads_in_capture(query.device, atten_mask, layout, keep_prob)
    problem = _translate(query, key, value, head_num, layout, atten_mask, sparse_mode, pre, nxt,
                         actual_seq_qlen, actual_seq_kvlen, sink)
    dy = problem.view(require_tensor(dy, "dy"), "dy")
    out = problem.view(require_tensor(attention_in, "attention_in"), "attention_in")
    stat_max = _statistic(softmax_max, "softmax_max", problem)
    stat_sum = _statistic(softmax_sum, "softmax_sum", problem)
    want = torch.float64 if query.dtype == torch.float64 else torch.float32
    lse = problem.lse_from_stat(stat_max.to(want) + torch.log(stat_sum.to(want))).contiguous()
    dropout_p = 1.0 - keep_prob
    rng_state = None
    if dropout_p > 0:
        rng_state = torch.tensor([seed, offset], dtype=torch.int64, device=query.device)
    with torch.no_grad():
        dq, dk, dv, dsink = _backward(problem, dy, out, lse, scale, dropout_p, rng_state)
    dpse = torch.empty(0, dtype=query.dtype, device=query.device)
    dq, dk, dv = (problem.to_input_layout(g) for g in (dq, dk, dv))
    if sink is None:
        return dq, dk, dv, dpse
    return dq, dk, dv, dpse, dsink.to(sink.dtype)
