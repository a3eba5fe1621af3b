"""Wall-clock timing that is honest on asynchronous devices (demo and benchmarks)."""

from __future__ import annotations

import statistics
import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        getattr(torch, device.type).synchronize()


def median_seconds(fn, *args, device: torch.device, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall time of fn(*args) after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn(*args)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
