"""Recorded kernel launches: a repeated call's launches without Triton's Python path.

``kernel[grid](*args)`` binds the arguments, computes the specialisation key, looks up
the compiled kernel (and, autotuned, the tuned config) on every call: tens of
microseconds of host time per launch (benchmarks/NOTES.md, step H1). For a call whose
signature repeats (shapes, strides, dtypes, alignment: ops.plain_forward) all of it
is settled after the first call. :func:`launch_and_record` launches through Triton
once and keeps what Triton resolved -- the compiled kernel, the grid, the full
argument list -- as a :class:`Launch`, which calls the kernel's compiled C launcher
again with new tensors in the leading argument slots.

The C launcher's calling convention (``launch(gridX, gridY, gridZ, stream, function,
cooperative, pdl, global_scratch, profile_scratch, packed_metadata, launch_metadata,
enter_hook, exit_hook, *args)``, every kernel argument in order, constexprs included)
is Triton's own, read from triton/backends/nvidia/driver.py (CudaLauncher) of the
versions in REPLAYED_TRITON; under another version, with launch hooks set (a
profiler) or for a kernel that needs profiling scratch, nothing is recorded and every
call goes through Triton.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
from triton import knobs

# Triton versions whose launcher calling convention Launch follows.
REPLAYED_TRITON = ("3.6.",)


def _no_hooks(hook) -> bool:
    """No launch hook: None, or an empty HookChain (3.6's default)."""
    return hook is None or not getattr(hook, "calls", True)


def _replayable(kernel) -> bool:
    if not (triton.__version__.startswith(REPLAYED_TRITON) and hasattr(kernel, "function")
            and _no_hooks(knobs.runtime.launch_enter_hook)
            and _no_hooks(knobs.runtime.launch_exit_hook)):
        return False
    launcher = kernel.run
    return hasattr(launcher, "launch") and getattr(launcher, "profile_scratch_size", 1) == 0


class Launch:
    """A compiled kernel, its grid and its arguments, the first ``tensors`` of which each
    replay supplies (the template holds no tensor: nothing of the recorded call is kept
    alive). ``allocate(size, alignment, stream)``: the kernel's global scratch (device-side
    tensor descriptors), as Triton's allocator hook is called."""

    def __init__(self, kernel, grid: tuple[int, int, int], arguments: list, tensors: int,
                 allocate: Callable):
        launcher = kernel.run
        self.raw = launcher.launch
        self.grid = grid
        self.head = (kernel.function, launcher.launch_cooperative_grid, launcher.launch_pdl)
        self.metadata = kernel.packed_metadata
        self.scratch_bytes = launcher.global_scratch_size * grid[0] * grid[1] * grid[2] \
            * launcher.num_ctas
        self.scratch_alignment = launcher.global_scratch_align
        self.allocate = allocate
        self.tensors = tensors
        self.template = [None] * tensors + arguments[tensors:]

    def __call__(self, *tensors, stream: int) -> None:
        if len(tensors) != self.tensors:  # else the C launcher's count error, unnamed
            raise TypeError(f"this launch replays {self.tensors} tensors (its leading "
                            f"arguments), got {len(tensors)}")
        arguments = self.template.copy()
        arguments[:self.tensors] = tensors
        scratch = (self.allocate(self.scratch_bytes, self.scratch_alignment, stream)
                   if self.scratch_bytes else None)
        self.raw(*self.grid, stream, *self.head, scratch, None, self.metadata, None, None, None,
                 *arguments)


def launch_and_record(launcher, grid, tensors: int, allocate: Callable, *args,
                      **kwargs) -> Launch | None:
    """``launcher[grid](*args, **kwargs)`` (a JITFunction or an Autotuner); returns the
    launch it made, replayable with new tensors in its first ``tensors`` argument slots
    (the leading positional ones), or None where it cannot be repeated."""
    bound: dict = {}

    def recording_grid(meta):
        # The bound arguments of the launch (the autotuner's last call is the real one).
        bound.clear()
        bound.update(meta)
        return grid(meta)

    kernel = launcher[recording_grid](*args, **kwargs)
    arguments = list(bound.values())
    if not _replayable(kernel) or any(isinstance(a, torch.Tensor)
                                      for a in arguments[tensors:]):
        return None
    size = tuple(grid(bound))
    return Launch(kernel, size + (1,) * (3 - len(size)), arguments, tensors, allocate)


def current_stream(device_index: int) -> int:
    """The raw stream a launch on GPU ``device_index`` goes to (torch's current one; what
    Triton's driver asks torch for)."""
    return torch._C._cuda_getCurrentRawStream(device_index)
