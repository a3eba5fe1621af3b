"""The Ascend tiling planner (op_host/planner, C++), reached through its C ABI.

``plan(...)`` returns the forward's plan as a dict: blocks, per-core work, buffer use per
memory level against capacity, the tiling key, and a schedule-model PREDICTION of time and cube
utilisation (a model, not a measurement; nothing here has run on an NPU).
``grad_plan(...)`` returns the backward's: blocks, dQ variant, per-core units, buffers,
workspace regions.
"""

from __future__ import annotations

import ctypes
import functools
import json

from . import native
from ..contract.spec import load

# The C ABI's dtype and layout numbers: spec order (op_host/flash_cann_contract.h, which
# the planner's enums are checked against at compile time).
DTYPES = {name: i for i, name in enumerate(load().backends["npu"].dtypes)}
LAYOUTS = {name: i for i, name in enumerate(load().cann_layouts)}


class Variant(ctypes.Structure):
    """The C ABI's ``flash_cann_variant``: the features beyond plain attention."""
    _fields_ = [("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
                ("softcap", ctypes.c_double), ("dropout_p", ctypes.c_double),
                ("alibi", ctypes.c_int32), ("sinks", ctypes.c_int32),
                ("tokens_q", ctypes.c_int64), ("tokens_k", ctypes.c_int64),
                ("fp16_scores", ctypes.c_int32), ("cube_passes", ctypes.c_int32)]


# The ``alibi`` argument's values: how the kernel indexes the slopes.
ALIBI = {None: 0, "head": 1, "batch_head": 2}


def variant(window: tuple[int, int] = (-1, -1), softcap: float = 0.0, dropout_p: float = 0.0,
            alibi: str | None = None, sinks: bool = False,
            tokens: tuple[int, int] = (0, 0), fp16_scores: bool = False,
            cube_passes: int = 0) -> Variant:
    """The C ABI's encoding of a call's features. ``window``: (left, right) as
    flash_cann.contract.variant.window_bounds normalised them (-1: unbounded); ``alibi``:
    None, "head" ((heads_q,) slopes) or "batch_head" ((batch, heads_q)); ``tokens``: with
    layout TND, the packed query and key tokens (batch is then the number of sequences,
    seqlen_q/k are max_seqlen_q/k); ``fp16_scores``: the backward's fp16-score fast path
    (float16; a forward plan is the same without it); ``cube_passes``: 1 forces the
    256-row tile in two cube row passes where it fits (tests), -1 rules it out, 0 lets the
    planner's schedule model choose."""
    if alibi not in ALIBI:
        raise ValueError(f"flash_cann: alibi must be one of {list(ALIBI)} (got {alibi!r})")
    return Variant(int(window[0]), int(window[1]), float(softcap), float(dropout_p),
                   ALIBI[alibi], int(bool(sinks)), int(tokens[0]), int(tokens[1]),
                   int(bool(fp16_scores)), int(cube_passes))


class DecodeProblem(ctypes.Structure):
    """The C ABI's ``flash_cann_decode_problem``: a fwd_kvcache call's shapes."""
    _fields_ = ([(name, ctypes.c_int64) for name in (
        "batch", "heads_q", "heads_kv", "seqlen_q", "tokens_q", "head_dim", "cache_batch",
        "cache_seqlen", "max_blocks")]
        + [(name, ctypes.c_int32) for name in (
            "dtype", "tnd", "causal", "has_batch_idx", "has_leftpad", "splits")]
        + [("scale", ctypes.c_double)])


class PlanRefused(ValueError):
    """The planner refused the problem; the message says why."""


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(native.artefact("planner/libflash_cann_planner.so")))
    lib.flash_cann_plan_json.restype = ctypes.c_int64
    lib.flash_cann_plan_json.argtypes = (
        [ctypes.c_char_p] + [ctypes.c_int64] * 6 + [ctypes.c_int32] * 4 + [ctypes.c_double]
        + [ctypes.POINTER(Variant), ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64])
    lib.flash_cann_grad_plan_json.restype = ctypes.c_int64
    lib.flash_cann_grad_plan_json.argtypes = (
        [ctypes.c_char_p] + [ctypes.c_int64] * 6 + [ctypes.c_int32] * 5 + [ctypes.c_double]
        + [ctypes.POINTER(Variant), ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64])
    lib.flash_cann_decode_plan_json.restype = ctypes.c_int64
    lib.flash_cann_decode_plan_json.argtypes = [
        ctypes.c_char_p, ctypes.POINTER(DecodeProblem), ctypes.POINTER(Variant), ctypes.c_int64,
        ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64]
    lib.flash_cann_platforms_json.restype = ctypes.c_int64
    lib.flash_cann_platforms_json.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.flash_cann_model_fit_json.restype = ctypes.c_int64
    lib.flash_cann_model_fit_json.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_double),
                                              ctypes.c_char_p, ctypes.c_uint64]
    return lib


def _json_call(call) -> object:
    capacity = 1 << 16
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        length = call(buffer, capacity)
        if length >= 0:
            return json.loads(buffer.value.decode())
        capacity = -length


def platforms() -> list[dict]:
    """The built-in SoC table (defaults with sources; the op reads the real platform)."""
    return _json_call(_library().flash_cann_platforms_json)


# The order of the fitted figures (engine_rates.h FittedFigures).
FIT_FIGURES = ("fixpipe_scale", "mte2_scale", "l2_scale", "transfer_cycles", "issue_cycles",
               "launch_cycles")


def model_fit(refit: bool = False, figures: dict | None = None) -> dict:
    """The schedule model's fit to PTO's published tables (op_host/planner/model_fit.h):
    the points (measured, modelled, error, weight, role) at the committed figures, at
    ``figures`` (FIT_FIGURES), or, with ``refit``, rerun from the sourced figures."""
    values = None
    if figures is not None:
        values = (ctypes.c_double * len(FIT_FIGURES))(*(figures[k] for k in FIT_FIGURES))
    return _json_call(lambda buf, cap: _library().flash_cann_model_fit_json(
        int(refit), values, buf, cap))


def soc_name(text: str) -> str:
    """The built-in table's name of SoC ``text``, matched ignoring case (build.sh spells
    compute units in lower case, CANN's SoC versions are capitalised: both work)."""
    names = [p["name"] for p in platforms()]
    for name in names:
        if name.lower() == text.lower():
            return name
    raise ValueError(f"flash_cann: unknown SoC {text!r}; choose one of "
                     f"{', '.join(n.lower() for n in names)} (any case)")


def _problem(head_dim, heads_q, heads_kv, seqlen_q, seqlen_k, dtype, layout, scale):
    if dtype not in DTYPES:
        raise ValueError(f"flash_cann: dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    if layout not in LAYOUTS:
        raise ValueError(f"flash_cann: layout must be one of {', '.join(LAYOUTS)} "
                         f"(got {layout!r})")
    return (heads_q if heads_kv is None else heads_kv,
            seqlen_q if seqlen_k is None else seqlen_k,
            1.0 / head_dim ** 0.5 if scale is None else scale)


def _pointer(features: Variant | None):
    return None if features is None else ctypes.byref(features)


def _checked(result: dict) -> dict:
    if "error" in result:
        raise PlanRefused(f"flash_cann: the planner refused: {result['error']}")
    return result


def plan(soc: str, batch: int, heads_q: int, seqlen_q: int, head_dim: int, *,
         heads_kv: int | None = None, seqlen_k: int | None = None, dtype: str = "float16",
         layout: str = "BNSD", causal: bool = False, has_mask: bool = False,
         scale: float | None = None, aic_cores: int = 0, features: Variant | None = None) -> dict:
    """Plan a forward call on SoC ``soc`` (any case, see :func:`soc_name`); ``features``:
    :func:`variant` (None: plain attention). Raises PlanRefused with the planner's reason."""
    heads_kv, seqlen_k, scale = _problem(head_dim, heads_q, heads_kv, seqlen_q, seqlen_k, dtype,
                                         layout, scale)
    return _checked(_json_call(lambda buf, cap: _library().flash_cann_plan_json(
        soc_name(soc).encode(), batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, DTYPES[dtype],
        LAYOUTS[layout], int(causal), int(has_mask), float(scale), _pointer(features), aic_cores,
        buf, cap)))


def grad_plan(soc: str, batch: int, heads_q: int, seqlen_q: int, head_dim: int, *,
              heads_kv: int | None = None, seqlen_k: int | None = None,
              dtype: str = "float16", layout: str = "BNSD", causal: bool = False,
              has_mask: bool = False, deterministic: bool = False, scale: float | None = None,
              aic_cores: int = 0, features: Variant | None = None) -> dict:
    """Plan a backward call (``deterministic``: dQ reduced in a fixed order instead of
    fp32 atomic adds; ``features`` as for :func:`plan`); raises PlanRefused with the
    planner's reason."""
    heads_kv, seqlen_k, scale = _problem(head_dim, heads_q, heads_kv, seqlen_q, seqlen_k, dtype,
                                         layout, scale)
    return _checked(_json_call(lambda buf, cap: _library().flash_cann_grad_plan_json(
        soc_name(soc).encode(), batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, DTYPES[dtype],
        LAYOUTS[layout], int(causal), int(has_mask), int(deterministic), float(scale),
        _pointer(features), aic_cores, buf, cap)))


def decode_plan(soc: str, batch: int, heads_q: int, seqlen_q: int, head_dim: int, *,
                heads_kv: int | None = None, keys: int, page_size: int = 0,
                dtype: str = "float16", causal: bool = False, aic_cores: int = 0,
                features: Variant | None = None) -> dict:
    """Plan a fwd_kvcache call (the decode kernel) whose sequences hold ``keys`` keys:
    a contiguous cache of ``keys`` keys per sequence, or with ``page_size`` a paged one
    of ceil(keys / page_size) pages per sequence; the prediction assumes every sequence
    full. ``features`` as for :func:`plan` (no dropout). Raises PlanRefused."""
    if dtype not in DTYPES:
        raise ValueError(f"flash_cann: dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    pages = -(-keys // page_size) if page_size else 0
    problem = DecodeProblem(
        batch=batch, heads_q=heads_q, heads_kv=heads_q if heads_kv is None else heads_kv,
        seqlen_q=seqlen_q, tokens_q=0, head_dim=head_dim,
        cache_batch=batch * pages if page_size else batch,
        cache_seqlen=page_size if page_size else keys, max_blocks=pages, dtype=DTYPES[dtype],
        tnd=0, causal=int(causal), has_batch_idx=0, has_leftpad=0, splits=0,
        scale=1.0 / head_dim ** 0.5)
    return decode_plan_for(soc, problem, features, keys=keys, aic_cores=aic_cores)


def decode_plan_for(soc: str, problem: DecodeProblem, features: Variant | None = None, *,
                    keys: int = 0, aic_cores: int = 0) -> dict:
    """Plan the decode call ``problem`` describes exactly (the twin's view of a call:
    flash_cann.backends.twin.launcher.decode_problem); the prediction for ``keys`` keys per
    sequence (0: the capacity). Raises PlanRefused."""
    return _checked(_json_call(lambda buf, cap: _library().flash_cann_decode_plan_json(
        soc_name(soc).encode(), ctypes.byref(problem), _pointer(features), keys, aic_cores, buf,
        cap)))
