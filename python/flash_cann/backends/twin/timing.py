"""The twin's timing mode (twin/timing.h, docs/twin.md "Timing mode"): a launch timed
instruction by instruction from a per-SoC cost table (twin/timing/costs.json).

Pass a ``Timing`` to a launcher call (``launcher.forward(..., timing=Timing())``); after
the call its ``report`` holds the launch's timeline summary, and ``trace`` the
Chrome-trace JSON ("traceEvents") of the traced core. ``Timing.rates`` picks the table's
figures: "fitted" (the default) takes an entry's "fitted" value where the calibration
(calibration.py) set one and its sourced or assumed value elsewhere; "unfitted" takes
the sourced or assumed values only. Every time is labelled ``LABELS[rates]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json

from ...ascend import native

LABELS = {"fitted": "fitted (the schedule model's fit to PTO's published tables)",
          "unfitted": "unfitted (sourced rates)"}
PIPES = ("S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX")


class TimingError(RuntimeError):
    """The cost table does not fit the twin's figures."""


@dataclasses.dataclass
class Timing:
    """What to time and, after the launch, what it gave.

    ``soc``: the cost table's entry; ``trace_core``: the AI core whose instructions the
    trace records (-1: none); ``timing_only``: skip the arithmetic (results stay NaN;
    the race detector is off; the instruction stream is the same, since the kernels'
    control flow depends on shapes, not values); ``share_cores``: the cores the L2
    bandwidth is shared by (0: the launch's; more lets a launch on fewer cores stand in
    for one core's share of a full one); ``rates``: "fitted" or "unfitted" (LABELS)."""

    soc: str = "Ascend910B2"
    trace_core: int = 0
    timing_only: bool = False
    share_cores: int = 0
    rates: str = "fitted"
    report: dict | None = None
    trace: dict | None = None


def cost_table_path():
    return native.ROOT / "twin" / "timing" / "costs.json"


@functools.lru_cache(maxsize=None)
def cost_table(soc: str, rates: str = "fitted") -> dict[str, float]:
    """The figures of ``soc``'s cost table by name, at ``rates`` (LABELS)."""
    if rates not in LABELS:
        raise TimingError(f"rates: must be one of {sorted(LABELS)} (got {rates!r})")
    table = json.loads(cost_table_path().read_text())
    if soc not in table:
        socs = sorted(k for k in table if not k.startswith("_"))
        raise TimingError(f"soc: no cost table for {soc!r} in {cost_table_path()} (has {socs})")
    pick = (lambda e: e.get("fitted", e)) if rates == "fitted" else (lambda e: e)
    return {name: float(pick(entry)["value"]) for name, entry in table[soc].items()}


def _read(function) -> str:
    capacity = 1 << 16
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        length = function(buffer, capacity)
        if length >= 0:
            return buffer.value.decode()
        capacity = -length


def figure_names(lib) -> list[str]:
    """The figures the twin takes, in its order (twin::CostNames)."""
    return _read(lib.flash_cann_twin_timing_figures).splitlines()


def declare(lib) -> None:
    """The timing ABI's signatures on the twin library."""
    for name in ("flash_cann_twin_timing_figures", "flash_cann_twin_timing_report",
                 "flash_cann_twin_timing_trace"):
        getattr(lib, name).restype = ctypes.c_int64
        getattr(lib, name).argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.flash_cann_twin_timing.restype = ctypes.c_int
    lib.flash_cann_twin_timing.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.c_uint64,
                                           ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]


@contextlib.contextmanager
def timed(lib, timing: Timing | None):
    """Launches inside the block are timed as ``timing`` asks (nothing when None); its
    ``report`` and ``trace`` are filled when the block ends without an error."""
    if timing is None:
        yield
        return
    names = figure_names(lib)
    table = cost_table(timing.soc, timing.rates)
    if sorted(names) != sorted(table):
        raise TimingError(f"the cost table of {timing.soc} names {sorted(set(table) ^ set(names))} "
                          f"that the twin does not take or lacks")
    values = (ctypes.c_double * len(names))(*(table[n] for n in names))
    if lib.flash_cann_twin_timing(values, len(names), timing.trace_core, int(timing.timing_only),
                                  timing.share_cores):
        raise TimingError("the twin refused the cost table")
    try:
        yield
    finally:
        lib.flash_cann_twin_timing(None, 0, -1, 0, 0)
    timing.report = summarise(json.loads(_read(lib.flash_cann_twin_timing_report)), timing.rates)
    timing.trace = json.loads(_read(lib.flash_cann_twin_timing_trace))


def summarise(raw: dict, rates: str = "fitted") -> dict:
    """The twin's raw report with what it shows: total time, the slowest core, its
    binding pipe (the unit and pipe busiest there) and the critical path in shares."""
    clock_hz = raw["clock_ghz"] * 1e9
    total = raw["launch_cycles"] + raw["makespan_cycles"]
    units = raw["units"]
    slowest = max(units, key=lambda u: u["end_cycles"])
    core = [u for u in units if u["core"] == slowest["core"]]
    unit, pipe = max(((u, p) for u in core for p in PIPES), key=lambda up: up[0]["busy_cycles"][up[1]])
    path = raw["critical_path"]
    path_total = sum(path["cycles"].values()) + path["sync_cycles"]
    return {
        **raw,
        "label": LABELS[rates],
        "total_cycles": total,
        "time_ms": total / clock_hz * 1e3,
        "slowest_core": slowest["core"],
        "binding_pipe": f"{unit['unit'][:3]} {pipe}",
        "binding_busy": unit["busy_cycles"][pipe] / raw["makespan_cycles"] if raw["makespan_cycles"] else 0.0,
        "critical_path_shares": {k: v / path_total for k, v in
                                 {**path["cycles"], "sync": path["sync_cycles"]}.items()
                                 if path_total and v > 0},
    }
