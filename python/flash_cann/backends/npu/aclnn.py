"""The generated aclnn API of the CANN package, derived from the op spec -- in one place.

For each OpDef ``<OpType>`` the CANN build generates a two-stage C API:

    aclnnStatus aclnn<OpType>GetWorkspaceSize(<inputs>, <attrs>, <outputs>,
                                              uint64_t *workspaceSize, aclOpExecutor **executor);
    aclnnStatus aclnn<OpType>(void *workspace, uint64_t workspaceSize,
                              aclOpExecutor *executor, aclrtStream stream);

The rules (CANN's aclnn generator, as its generated headers show): inputs in IR order, then
attributes in declaration order, then outputs. Inputs are ``const aclTensor *``, an
optional one named ``<camel>Optional``; attributes are passed by value, ``double`` for
Float, ``int64_t`` for Int, ``bool`` for Bool and ``char *`` for String (``<camel>Optional``
when the attribute has a default; scalar attributes never get the suffix); outputs are
``const aclTensor *`` named ``<camel>Out``, or ``out`` when there is only one. The library
is dlopen'ed, so no CANN header checks our calls at build time: a ``float`` where ``double``
is expected would corrupt the arguments silently. That is why the types are derived here,
and tests pin them against prototypes written by hand.

:func:`render_headers` turns this into the C++ the NPU extension (``framework/``) is
compiled with: one kernel per op whose parameters are the aclnn arguments in order, and
the status table of :mod:`flash_cann.backends.npu.aclnn_status`. ``framework/setup.py`` writes them at
build time, so the extension cannot disagree with the spec it was built from.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

from .aclnn_status import STATUS_TABLE, UNKNOWN
from ...contract.spec import OpSpec, Spec, load

NAMESPACE = "flash_cann_npu"  # torch.ops namespace of the extension's launcher ops

_ATTR_CTYPES = {"float": "double", "int": "int64_t", "bool": "bool", "str": "char *"}
# C++ parameter types of the launcher kernels, by schema type (torch's calling convention).
_KERNEL_TYPES = {"Tensor": "const at::Tensor &", "Tensor?": "const c10::optional<at::Tensor> &",
                 "float": "double", "int": "int64_t", "bool": "bool", "str": "c10::string_view"}


@dataclass(frozen=True)
class Param:
    """One parameter of ``aclnn<OpType>GetWorkspaceSize``."""

    role: str        # "input", "attr" or "output"
    spec_name: str   # its name in the op spec
    ctype: str       # its C type
    name: str        # its C name, as the CANN generator spells it


@dataclass(frozen=True)
class AclnnApi:
    """The two generated functions of one op."""

    op: OpSpec
    params: tuple[Param, ...]  # before ``workspaceSize, executor``

    @property
    def execute(self) -> str:
        return f"aclnn{self.op.cann_op_type}"

    @property
    def get_workspace_size(self) -> str:
        return f"{self.execute}GetWorkspaceSize"

    def prototype(self) -> str:
        """The C declaration of the first stage, as CANN generates it."""
        params = [_declare(p.ctype, p.name) for p in self.params]
        params += ["uint64_t *workspaceSize", "aclOpExecutor **executor"]
        return f"aclnnStatus {self.get_workspace_size}({', '.join(params)})"


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _declare(ctype: str, name: str) -> str:
    return f"{ctype}{name}" if ctype.endswith(("*", "&")) else f"{ctype} {name}"


def aclnn_api(op: OpSpec) -> AclnnApi:
    """The aclnn functions CANN generates for ``op``'s OpDef (which mirrors the spec)."""
    clash = {t.name for t in op.cann_inputs} & {t.name for t in op.cann_outputs}
    if clash:
        # CANN turns such a pair into one in-place ``<camel>Ref`` argument; no op of ours
        # needs that, so it is refused rather than guessed.
        raise ValueError(f"op {op.name!r}: {sorted(clash)} are both inputs and outputs; "
                         f"in-place (Ref) arguments are not supported")
    params = [Param("input", t.name, "const aclTensor *",
                    _camel(t.name) + ("Optional" if t.optional else "")) for t in op.cann_inputs]
    params += [Param("attr", a.name, _ATTR_CTYPES[a.type],
                     _camel(a.name) + ("Optional" if a.type == "str" and a.has_default else ""))
               for a in op.cann_attrs]
    if len(op.cann_outputs) == 1:
        params.append(Param("output", op.cann_outputs[0].name, "const aclTensor *", "out"))
    else:
        params += [Param("output", t.name, "const aclTensor *", _camel(t.name) + "Out")
                   for t in op.cann_outputs]
    return AclnnApi(op, tuple(params))


def launcher_schema(op: OpSpec) -> str:
    """Schema of the extension's launcher op for ``op``: the aclnn arguments in aclnn
    order, the outputs preallocated by the caller and written in place."""
    params = [f"{'Tensor?' if t.optional else 'Tensor'} {t.name}" for t in op.cann_inputs]
    params += [f"{a.type} {a.name}" for a in op.cann_attrs]
    params += [f"Tensor({alias}!) {t.name}"
               for alias, t in zip(string.ascii_lowercase, op.cann_outputs)]
    return f"{op.name}({', '.join(params)}) -> ()"


def _c_string(text: str) -> str:
    if not text.isascii():
        raise ValueError(f"C string literals here must be ASCII: {text!r}")
    return json.dumps(text)  # JSON escapes are valid C escapes for ASCII text


def _kernel_params(op: OpSpec) -> list[str]:
    params = [_declare(_KERNEL_TYPES["Tensor?" if t.optional else "Tensor"], t.name)
              for t in op.cann_inputs]
    params += [_declare(_KERNEL_TYPES[a.type], a.name) for a in op.cann_attrs]
    params += [_declare(_KERNEL_TYPES["Tensor"], t.name) for t in op.cann_outputs]
    return params


def _render_op(spec: Spec, op: OpSpec) -> str:
    api = aclnn_api(op)
    stage1_params = [_declare(p.ctype, p.name) for p in api.params]
    stage1_params += ["uint64_t *workspaceSize", "aclOpExecutor **executor"]
    lines = [
        f"// torch.ops.{spec.namespace}.{op.name} -> CANN op {op.cann_op_type}:",
        f"// {api.prototype()};",
        f"struct {op.cann_op_type} {{",
        f"  static constexpr const char *kTorchOp = {_c_string(spec.qualname(op.name))};",
        f"  static constexpr const char *kLauncherName = {_c_string(op.name)};",
        f"  static constexpr const char *kLauncherSchema = {_c_string(launcher_schema(op))};",
        f"  static constexpr const char *kGetWorkspaceSize = {_c_string(api.get_workspace_size)};",
        f"  static constexpr const char *kExecute = {_c_string(api.execute)};",
        f"  using GetWorkspaceSizeFn = aclnnStatus (*)({', '.join(stage1_params)});",
        "",
        f"  // The PrivateUse1 kernel of {NAMESPACE}::{op.name}: converts each argument, then",
        "  // runs both stages.",
        f"  static void Launch({', '.join(_kernel_params(op))}) {{",
        "    AclnnCall call(kTorchOp);",
    ]
    # AclnnCall has one converter per role: input(), attr(), output().
    lines += [f"    {_declare(p.ctype, 'acl_' + p.spec_name)} = "
              f"call.{p.role}({_c_string(p.spec_name)}, {p.spec_name});" for p in api.params]
    args = ", ".join(["acl_" + p.spec_name for p in api.params] + ["workspaceSize", "executor"])
    lines += [
        "    const auto stage1 = call.resolve<GetWorkspaceSizeFn>(kGetWorkspaceSize);",
        "    call.run(kGetWorkspaceSize, kExecute,",
        "             [&](uint64_t *workspaceSize, aclOpExecutor **executor) {",
        f"               return stage1({args});",
        "             });",
        "  }",
        "};",
    ]
    return "\n".join(lines)


_HEADER = """\
// Generated by flash_cann.backends.npu.aclnn from the op spec (op_project/flash_cann_ops.yaml).
// Do not edit: framework/setup.py writes it at build time.
#pragma once
"""


def _render_status() -> str:
    rows = ",\n".join(f"    {{{r.first}, {r.last}, {_c_string(r.name)}, {_c_string(r.meaning)}}}"
                      for r in STATUS_TABLE)
    return (_HEADER + "#include <cstdint>\n\nnamespace flash_cann_npu {\n\n"
            "struct AclnnStatusRow {\n  int32_t first;\n  int32_t last;\n"
            "  const char *name;\n  const char *meaning;\n};\n\n"
            "// flash_cann.backends.npu.aclnn_status.STATUS_TABLE: the first row containing a code wins.\n"
            f"inline constexpr AclnnStatusRow kAclnnStatusTable[] = {{\n{rows},\n}};\n"
            f"inline constexpr const char *kAclnnStatusUnknown = {_c_string(UNKNOWN)};\n\n"
            "}  // namespace flash_cann_npu\n")


def required_ops(spec: Spec) -> list[OpSpec]:
    """The ops whose aclnn functions the op package must export: all of them, except the
    backward op while the spec says the NPU backend has no backward kernel."""
    backward_ops = {op.backward for op in spec.cann_ops if op.backward}
    return [op for op in spec.cann_ops
            if spec.backends["npu"].backward or op.name not in backward_ops]


def _render_ops(spec: Spec) -> str:
    ops = list(spec.cann_ops)
    symbols = ", ".join(_c_string(name) for op in required_ops(spec)
                        for name in (aclnn_api(op).get_workspace_size, aclnn_api(op).execute))
    defs = "\n".join(f"  m.def({op.cann_op_type}::kLauncherSchema);" for op in ops)
    impls = "\n".join(f"  m.impl({op.cann_op_type}::kLauncherName, &{op.cann_op_type}::Launch);"
                      for op in ops)
    body = "\n\n".join(_render_op(spec, op) for op in ops)
    return (_HEADER + '#include <string>\n#include <vector>\n\n#include <torch/library.h>\n\n'
            '#include "aclnn_call.h"\n\nnamespace flash_cann_npu {\n\n'
            "// Every symbol the op package's library must export.\n"
            f"inline const std::vector<std::string> kAclnnSymbols = {{{symbols}}};\n\n"
            f"{body}\n\n"
            f"// Into TORCH_LIBRARY({NAMESPACE}, m).\n"
            f"inline void DefineLaunchers(torch::Library &m) {{\n{defs}\n}}\n\n"
            f"// Into TORCH_LIBRARY_IMPL({NAMESPACE}, PrivateUse1, m).\n"
            f"inline void ImplementLaunchers(torch::Library &m) {{\n{impls}\n}}\n\n"
            "}  // namespace flash_cann_npu\n")


def render_headers(spec: Spec | None = None) -> dict[str, str]:
    """The generated headers of the NPU extension, by file name."""
    spec = spec or load()
    return {"flash_cann_aclnn_status.h": _render_status(),
            "flash_cann_aclnn_ops.h": _render_ops(spec)}


def write_headers(directory: str | Path, spec: Spec | None = None) -> list[Path]:
    """Write :func:`render_headers` into ``directory``; returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render_headers(spec).items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
