"""CPU tensors served by the triton backend through Triton's interpreter
(TRITON_INTERPRET=1 set before triton is imported): for test_triton_interpreter.py and
the context-parallel interpreter group of test_distributed.py."""

from __future__ import annotations


def patch_interpreter(setattr_):
    """Triton 3.6's interpreter turns a tensor loop bound into a Python int with
    int(array), which NumPy >= 2.4 refuses for 1-element arrays; upstream fixed it the
    same way (triton-lang/triton#9171, #9172). ``setattr_``: monkeypatch.setattr, or
    plain setattr for a whole process."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_with_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    setattr_(interpreter, "_patch_lang_tensor", patch_tensor_with_index)
