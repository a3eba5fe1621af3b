"""TEST-ONLY model of torch_npu's graph API on the fake NPU (``torch.npu.NPUGraph``,
``torch.npu.graph``, ``torch.npu.is_current_stream_capturing``, ``torch.npu.synchronize``
and the few stream calls they use), with the names and the semantics that matter of
Ascend/pytorch's torch_npu/npu/graphs.py and csrc/core/npu/NPUGraph.cpp (read there;
modelled, not copied). The capture itself -- what it refuses, records and replays -- is
the fake device's (fake_npu_capture.h, through ``torch.ops.fake_npu``): this module only
starts and ends it.

Not modelled: memory pools shared between graphs (``pool`` is accepted; each graph keeps
its own), ``auto_dispatch_capture`` and ``NPUGraph.update`` (torch_npu's re-writing of
host arguments such as npu_fusion_attention's actual_seq_qlen into captured tasks: refused
by name), ``capture_error_mode`` other than the rules of "global" (on an NPU a host read
in the capturing stream fails in every mode), and real streams: the launches always see
the one fake stream; the current stream here only serves the non-default-stream rule.
"""

import contextlib
import itertools

import torch

_CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
_ids = itertools.count()


class Stream:
    """A stream handle (torch.npu.Stream): identity only."""

    def __init__(self, device=None, priority=0):
        del device, priority
        self.stream_id = next(_ids)

    def synchronize(self):
        torch.ops.fake_npu.synchronize()

    def __repr__(self):
        return f"<fake torch.npu.Stream {self.stream_id}>"


_default_stream = Stream()
_current = [_default_stream]


def default_stream(device=None):
    return _default_stream


def current_stream(device=None):
    return _current[-1]


@contextlib.contextmanager
def stream(s):
    _current.append(s if s is not None else _current[-1])
    try:
        yield
    finally:
        _current.pop()


def synchronize(device=None):
    torch.ops.fake_npu.synchronize()


def empty_cache():
    """Nothing is cached by the fake allocator."""


def is_current_stream_capturing():
    return torch.ops.fake_npu.is_capturing()


def graph_pool_handle():
    return (0, next(_ids))


class NPUGraph:
    """torch.npu.NPUGraph: capture_begin / capture_end / replay / reset / pool."""

    def __init__(self):
        self._graph = None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if capture_error_mode not in _CAPTURE_ERROR_MODES:
            raise ValueError(f"capture_error_mode must be one of {_CAPTURE_ERROR_MODES} "
                             f"(got {capture_error_mode!r})")
        if self._graph is not None:
            raise RuntimeError("This NPUGraph instance already owns a captured graph. To "
                               "capture a new graph, create a new instance.")
        if current_stream() is _default_stream:
            raise RuntimeError("NPU graphs must be captured on a non-default stream. "
                               "(However, after capture, it's ok to replay them on the "
                               "default stream.)")
        torch.ops.fake_npu.capture_begin()

    def capture_end(self):
        self._graph = torch.ops.fake_npu.capture_end()

    def replay(self):
        if self._graph is None:
            raise RuntimeError("fake torch_npu: replay of an NPUGraph that captured nothing")
        torch.ops.fake_npu.replay(self._graph)

    def reset(self):
        if self._graph is not None:
            torch.ops.fake_npu.reset(self._graph)
            self._graph = None

    def pool(self):
        return (self._graph or 0, 0)

    def tasks(self) -> int:
        """The stand-in's own: how many device tasks the graph replays."""
        return torch.ops.fake_npu.tasks(self._graph) if self._graph is not None else 0

    def __del__(self):
        try:
            self.reset()
        except Exception:  # noqa: BLE001 -- interpreter teardown
            pass


class graph:  # noqa: N801 -- torch_npu's name
    """torch.npu.graph(npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
    capture_error_mode="global"): synchronises, then captures on a side stream."""

    default_capture_stream = None

    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
                 capture_error_mode="global"):
        if auto_dispatch_capture:
            raise NotImplementedError("fake torch_npu: auto_dispatch_capture (NPUGraph.update "
                                      "of host arguments) is not modelled")
        if graph.default_capture_stream is None:
            graph.default_capture_stream = Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else graph.default_capture_stream
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        self._stream = None

    def __enter__(self):
        synchronize()
        empty_cache()
        self._stream = stream(self.capture_stream)
        self._stream.__enter__()
        self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            self.npu_graph.capture_end()
        finally:
            self._stream.__exit__(exc_type, exc_value, traceback)


def install(npu_module) -> None:
    """Add the graph API to the stand-in's ``torch_npu.npu`` (torch.npu)."""
    for name in ("Stream", "default_stream", "current_stream", "stream", "synchronize",
                 "empty_cache", "is_current_stream_capturing", "graph_pool_handle",
                 "NPUGraph", "graph"):
        setattr(npu_module, name, globals()[name])
