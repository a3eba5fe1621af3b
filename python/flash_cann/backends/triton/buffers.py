"""Output and scratch buffers of the Triton backend's hosts (CUDA: ``triton.py``, NPU:
``triton_npu.py``), with a switch that poisons them for tests."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_poison: float | None = None


@contextlib.contextmanager
def poisoned_outputs(value: float = float("nan")) -> Iterator[None]:
    """Fill every buffer the kernels must write (outputs and scratch) with ``value``
    before launching, so that a test sees any element a kernel left unwritten."""
    global _poison
    previous, _poison = _poison, value
    try:
        yield
    finally:
        _poison = previous


def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    return t if _poison is None else t.fill_(_poison)
