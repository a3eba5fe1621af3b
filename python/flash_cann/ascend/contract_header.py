"""``op_host/flash_cann_contract.h``: the op contract's indices and limits for C++,
generated from the op spec so that the OpDef, InferShape, TilingFunc and the planner
cannot drift from it.

Per op (a C++ namespace named after it): namespaces ``input``, ``attr`` and ``output``,
each with an ``Index`` enum (``k`` + the CamelCase spec name, in spec order) and
``kCount``, e.g. ``contract::fwd::input::kKeyPaddingMask`` (the CANN op's: not the
autograd-only attributes, nor the arguments, layouts and ops of features the npu backend
does not list); for the whole spec the
head_dim limits and the layouts (``kLayout<NAME>``, in spec order: the value of
``flash_cann::Layout``) and the NPU backend's dtypes (``kDType<Name>``: the value of
``flash_cann::DType``). Any op, input, attribute or output added to the spec appears
here on the next ``python -m flash_cann.ascend.contract_header``; tests/test_spec.py fails
while the committed header is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..contract.spec import Spec, load

HEADER = Path(__file__).resolve().parents[3] / "op_host" / "flash_cann_contract.h"


def camel(name: str) -> str:
    """``key_padding_mask`` -> ``KeyPaddingMask``."""
    return "".join(part.capitalize() for part in name.split("_"))


def _indices(kind: str, names) -> list[str]:
    return [f"namespace {kind} {{",
            "enum Index : size_t {",
            *(f"    k{camel(name)} = {i}," for i, name in enumerate(names)),
            "};",
            f"constexpr size_t kCount = {len(names)};",
            f"}}  // namespace {kind}"]


def render(spec: Spec) -> str:
    lines = [
        "// Generated from op_project/flash_cann_ops.yaml by `python -m "
        "flash_cann.ascend.contract_header`;",
        "// do not edit (tests/test_spec.py fails while this file is out of date).",
        "#ifndef FLASH_CANN_CONTRACT_H",
        "#define FLASH_CANN_CONTRACT_H",
        "",
        "#include <cstddef>",
        "#include <cstdint>",
        "",
        "namespace flash_cann {",
        "namespace contract {",
        "",
        f"constexpr int64_t kHeadDimMin = {spec.head_dim_min};",
        f"constexpr int64_t kHeadDimMax = {spec.head_dim_max};",
        "",
        "// Values of the layout attribute, in spec order.",
        *(f"constexpr uint32_t kLayout{name} = {i};" for i, name in enumerate(spec.cann_layouts)),
        "constexpr const char* kLayoutNames[] = {"
        + ", ".join(f'"{name}"' for name in spec.cann_layouts) + "};",
        f"constexpr size_t kLayoutCount = {len(spec.cann_layouts)};",
        "",
        "// The dtypes the NPU backend computes, in spec order.",
        *(f"constexpr uint32_t kDType{camel(name)} = {i};"
          for i, name in enumerate(spec.backends["npu"].dtypes)),
    ]
    for op in spec.cann_ops:
        lines += ["", f"// {op.cann_op_type}", f"namespace {op.name} {{",
                  *_indices("input", [t.name for t in op.cann_inputs]),
                  *_indices("attr", [a.name for a in op.cann_attrs]),
                  *_indices("output", [t.name for t in op.cann_outputs]),
                  f"}}  // namespace {op.name}"]
    lines += ["", "}  // namespace contract", "}  // namespace flash_cann", "",
              "#endif  // FLASH_CANN_CONTRACT_H", ""]
    return "\n".join(lines)


def main() -> int:
    HEADER.write_text(render(load()))
    print(f"wrote {HEADER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
