"""TEST-ONLY model of torch_npu's lazy torchair (torch_npu/dynamo/__init__.py, read in
Ascend/pytorch and the torch-npu 2.13.0 wheel; modelled, not copied).

torchair ships inside torch_npu as ``torch_npu.dynamo.torchair`` -- here the torchair
stand-in (``../../../torchair_ge/torchair``). torch_npu puts a proxy, not a module, into
``sys.modules["torchair"]``: every attribute but ``__spec__`` / ``__path__`` raises
``AttributeError`` until torchair is loaded; reading ``__spec__`` (the first thing
``import torchair`` does with a module found in sys.modules) loads it, and from then on
the proxy forwards. A failed load is replayed on every later access.

When the proxy appears depends on the version (``install(timing)``):
  "import"  at ``import torch_npu`` (2.1-2.8; torch autoloads torch_npu at ``import torch``)
  "dynamo"  at the first Dynamo set-up, i.e. when ``torch._dynamo`` is first imported
            (from 2.9: torch_npu's post-import hook on torch._dynamo)
``FAKE_TORCHAIR_IMPORT_ERROR``, if set, is the error loading torchair raises (as the
real one does without CANN).
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

# The torchair stand-in is this package's `torchair` subpackage, as the real one is.
__path__.append(os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                              "torchair_ge")))


class _LazyTorchair:
    _ALLOWED = ("__spec__", "__path__")

    def __init__(self):
        self._torchair = None
        self._error = None

    def __getattr__(self, name):
        if self._error is not None:
            raise self._error
        if self._torchair is None:
            if name not in self._ALLOWED:
                raise AttributeError(f"Try to get torchair's attr `{name}` before torchair "
                                     f"is initialized.")
            try:
                error = os.environ.get("FAKE_TORCHAIR_IMPORT_ERROR")
                if error:
                    raise ImportError(error)
                self._torchair = importlib.import_module(f"{__name__}.torchair")
            except Exception as err:
                self._error = err
                raise
        return getattr(self._torchair, name)


def _install_lazy_torchair():
    if "torchair" not in sys.modules:
        sys.modules["torchair"] = _LazyTorchair()


class _AfterDynamoImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs _install_lazy_torchair once torch._dynamo has been imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _install_lazy_torchair()


def install(timing: str) -> None:
    if timing == "import" or "torch._dynamo" in sys.modules:
        _install_lazy_torchair()
    elif timing == "dynamo":
        sys.meta_path.insert(0, _AfterDynamoImport())
    else:
        raise ValueError(f"FAKE_TORCH_NPU_TORCHAIR must be 'import' or 'dynamo', got {timing!r}")
