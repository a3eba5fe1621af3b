"""TEST-ONLY stand-in for torchair.ge.attr: each class is a builder, ``Float(0.5)`` an
attribute value, as in torchair (``_Attr.__call__``)."""

from __future__ import annotations


class _Attr:
    def __init__(self, cls: str, value=None):
        self.cls = cls
        self.value = value

    def __call__(self, value):
        if value is None:
            raise AssertionError("Value cannot be None.")
        return _Attr(self.cls, value)

    def __repr__(self):
        return f"ge.attr.{self.cls}({self.value!r})"


Int = _Attr("Int")
Float = _Attr("Float")
Bool = _Attr("Bool")
Str = _Attr("Str")
