"""Peak-memory measurement, for the demo and the benchmarks.

On an accelerator the caching allocator's statistics give the peak (torch.cuda /
torch.npu). The CPU allocator keeps no statistics, so on the CPU each measurement
runs in a fresh process: the work runs once on small inputs (so that one-time library
initialisation is not counted), the real inputs are built, the kernel's high-water mark
of resident memory is reset (Linux ``/proc/self/clear_refs``), the work runs, and the
peak resident set minus what was resident before is the answer.
"""

from __future__ import annotations

import gc
import multiprocessing
from typing import Any, Callable

import torch


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _measure_in_this_process(setup: Callable, run: Callable, setup_args: tuple,
                             warmup_args: tuple | None, threads: int) -> int:
    torch.set_num_threads(threads)
    if warmup_args is not None:
        run(*setup(*warmup_args))
    inputs = setup(*setup_args)
    gc.collect()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset VmHWM (the peak RSS) to the current RSS
    run(*inputs)
    return (_status_kib("VmHWM") - before) * 1024


def peak_extra_bytes(device: torch.device, setup: Callable[..., tuple],
                     run: Callable[..., Any], setup_args: tuple = (),
                     warmup_args: tuple | None = None) -> int:
    """Peak memory that ``run(*setup(*setup_args))`` needs beyond its inputs.

    ``setup`` and ``run`` must be module-level functions (they may run in a spawned
    process on the CPU); ``warmup_args``, if given, are setup arguments for a small
    untimed, unmeasured first run."""
    if device.type == "cpu":
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            return pool.apply(_measure_in_this_process,
                              (setup, run, setup_args, warmup_args, torch.get_num_threads()))
    stats = getattr(torch, device.type)
    if warmup_args is not None:
        run(*setup(*warmup_args))
    inputs = setup(*setup_args)
    stats.synchronize()
    before = stats.memory_allocated()
    stats.reset_peak_memory_stats()
    run(*inputs)
    stats.synchronize()
    return stats.max_memory_allocated() - before
