"""Run a function when a module is imported, without importing it: how flash_cann
plugs into libraries the user may or may not load (``import flash_cann`` must not pay
for ``import transformers``).

:func:`when_imported` calls ``hook(module)`` at once if the module is already loaded,
else right after its code has run, from a finder at the front of ``sys.meta_path`` that
wraps the module's loader for that one import and then steps aside.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from typing import Callable

_hooks: dict[str, list[Callable]] = {}


def _run(name: str, module) -> None:
    for hook in _hooks.pop(name, []):
        try:
            hook(module)
        except Exception as err:  # a plug-in must not break the library's own import
            warnings.warn(f"flash_cann: registering with {name} failed "
                          f"({type(err).__name__}: {err})", RuntimeWarning, stacklevel=2)
    if not _hooks and _finder in sys.meta_path:  # nothing left to watch for
        sys.meta_path.remove(_finder)


class _LoaderThenHook(importlib.abc.Loader):
    """The module's own loader, then the hooks; the module keeps its own loader."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.loader
        self.loader.exec_module(module)
        _run(module.__name__, module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderThenHook(spec.loader)
                return spec
        return None


_finder = _PostImportFinder()


def when_imported(name: str, hook: Callable) -> None:
    """``hook(module)`` once ``name`` is imported: now if it already is, else after its
    import. A hook that raises is reported as a RuntimeWarning, not raised into the
    importer."""
    module = sys.modules.get(name)
    if module is not None:
        _hooks.setdefault(name, []).append(hook)
        _run(name, module)
        return
    _hooks.setdefault(name, []).append(hook)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
