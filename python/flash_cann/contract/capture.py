"""Graph capture (CUDA graphs; torch_npu's ACL graphs, ``torch.npu.NPUGraph``): whether
one is under way for a device, and the error for a host read of a device tensor inside
one.

Under a capture the host code runs once and the device work is recorded for replay. A
host read of a device tensor (``int(t)``, ``t.tolist()``, ``t.cpu()``) waits for a stream
that records rather than runs: the runtime fails the capture, and a value read then
would be frozen into every replay. The ops read no device tensor on the host (their
tiling depends on shapes and max_seqlen_*; the kernels read cu_seqlens, cache_seqlens,
block tables from device memory). The public API's conveniences that do read one (a 0-d
tensor for max_seqlen, window_size given as a device tensor) call :func:`refuse_host_read`
first, so a capture stops with a message that names the argument and says what to pass.
"""

from __future__ import annotations

import torch


def capturing(device: torch.device) -> bool:
    """Whether ``device``'s current stream is being captured into a graph: the device
    module's ``is_current_stream_capturing()`` (torch.cuda's, torch_npu's torch.npu's)."""
    if device.type == "cpu":
        return False
    probe = getattr(getattr(torch, device.type, None), "is_current_stream_capturing", None)
    return bool(probe()) if probe is not None else False


def refuse_host_read(device: torch.device, what: str, instead: str) -> None:
    """Raise if reading ``what`` (a tensor on ``device``) on the host now would break a
    graph capture; ``instead``: what the caller can do."""
    if capturing(device):
        raise RuntimeError(
            f"flash_cann: {what} would be read on the host, which waits for the device; a "
            f"graph capture forbids that (torch.{device.type}.is_current_stream_capturing() "
            f"is True): {instead}")
