"""The package's layering (docs/architecture.md), pinned: imports point down the layers,
never between backends, and nothing imports the tools or the integrations but the
package's face. A new upward import fails here with a message naming the rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flash_cann.contract.spec import load

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "flash_cann"

# The layers, top down, and what each may import (besides itself and third-party code).
# The package's face (__init__, __main__) sits above them all and may import anything.
MAY_IMPORT = {
    # tools: backends too, for `flash-cann doctor`'s look at the NPU backend's parts
    "tools": {"api", "contract", "ascend", "backends"},
    "integrations": {"distributed", "api", "contract"},
    "distributed": {"api", "contract"},
    "api": {"contract"},
    "backends": {"contract", "ascend"},
    "ascend": {"contract"},
    "contract": set(),
}
FACE = {"flash_cann", "flash_cann.__main__"}
# Only the dispatcher loads modules by a computed name: the backend the spec names.
DISPATCHER = "flash_cann.contract.ops"

RULES = {
    "layer": "imports point down the layers: {layer} may import {allowed}, not {target}",
    "backend": "a backend never imports another backend ({source} imports {target}); "
               "what two backends share lives in the contract or the Ascend host side",
    "top": "nothing imports {kind} but the package's face (flash_cann/__init__.py): "
           "{source} imports {target}",
    "dynamic": "only the dispatcher ({dispatcher}) imports a module by a computed name: "
               "{source} calls import_module with a non-literal argument",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool) -> tuple[set[str], bool]:
    """The flash_cann modules ``module`` imports (at any depth: function-level imports
    count), and whether it calls import_module with a computed name."""
    package = module if is_package else module.rpartition(".")[0]
    found, dynamic = set(), False
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args
              and not isinstance(node.args[0], ast.Constant)):
            dynamic = True
    return {name for name in found if name.split(".")[0] == "flash_cann"}, dynamic


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in MAY_IMPORT else None


def backend_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "backends" else None


def violations(module: str, imported: set[str], dynamic: bool) -> list[str]:
    """Every rule that ``module`` importing ``imported`` breaks, as messages."""
    found = []
    if dynamic and module != DISPATCHER:
        found.append(RULES["dynamic"].format(dispatcher=DISPATCHER, source=module))
    if module in FACE:
        return found
    layer = layer_of(module)
    for target in sorted(imported):
        target_layer = layer_of(target)
        if target_layer is None or target_layer == layer:
            if layer == "backends" and backend_of(target) not in (None, backend_of(module)):
                found.append(RULES["backend"].format(source=module, target=target))
            continue
        if target_layer in ("tools", "integrations"):
            found.append(RULES["top"].format(kind=target_layer, source=module, target=target))
        elif target_layer not in MAY_IMPORT[layer]:
            allowed = ", ".join(sorted(MAY_IMPORT[layer])) or "nothing of flash_cann"
            found.append(RULES["layer"].format(layer=module, allowed=allowed, target=target))
    return found


def package_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield module_name(path), path


def test_every_module_belongs_to_a_layer():
    for module, _ in package_modules():
        assert module in FACE or layer_of(module) is not None or module == "flash_cann", (
            f"{module} is in no layer: put it in one of {sorted(MAY_IMPORT)} "
            f"(docs/architecture.md)")


def test_imports_point_down_the_layers():
    broken = []
    for module, path in package_modules():
        imported, dynamic = imports_of(path.read_text(encoding="utf-8"), module,
                                       path.name == "__init__.py")
        broken += violations(module, imported, dynamic)
    assert not broken, "\n".join(broken)


def test_each_backend_lives_in_its_own_package():
    """The spec names each backend's modules (``module``, ``also_on``): they are in that
    backend's package, so a backend is one folder."""
    for name, backend in load().backends.items():
        for device_type in backend.device_types:
            module = backend.module(device_type)
            assert module.split(".")[0] == name, (
                f"backends.{name} runs on {device_type} through backends.{module}: a "
                f"backend's modules live in flash_cann/backends/{name}/")
            assert (PACKAGE / "backends" / (module.replace(".", "/") + ".py")).is_file(), module


@pytest.mark.parametrize("module, imported, dynamic, rule", [
    ("flash_cann.contract.ops", {"flash_cann.backends.cpu.attention"}, False, "layer"),
    ("flash_cann.contract.checks", {"flash_cann.api.interface"}, False, "layer"),
    ("flash_cann.ascend.planner", {"flash_cann.backends.twin.launcher"}, False, "layer"),
    ("flash_cann.backends.twin.launcher", {"flash_cann.backends.cpu.attention"}, False,
     "backend"),
    ("flash_cann.backends.triton.cuda", {"flash_cann.backends.npu"}, False, "backend"),
    ("flash_cann.api.interface", {"flash_cann.tools.accuracy"}, False, "top"),
    ("flash_cann.contract.reference", {"flash_cann.integrations.torchair"}, False, "top"),
    ("flash_cann.backends.cpu.attention", set(), True, "dynamic"),
])
def test_each_rule_fires(module, imported, dynamic, rule):
    """The checker itself: an import breaking each rule is reported, naming the rule."""
    messages = violations(module, imported, dynamic)
    marker = {"layer": "imports point down", "backend": "never imports another backend",
              "top": "but the package's face", "dynamic": "only the dispatcher"}[rule]
    assert len(messages) == 1 and marker in messages[0], messages


def test_relative_imports_resolve():
    """imports_of reads relative imports the way Python does."""
    source = "from ...contract import ops\nfrom .. import twin\nfrom . import kernels\n"
    imported, _ = imports_of(source, "flash_cann.backends.triton.cuda", False)
    assert {"flash_cann.contract.ops", "flash_cann.backends.twin",
            "flash_cann.backends.triton.kernels"} <= imported
    imported, _ = imports_of("from .forward import attn_fwd\n",
                             "flash_cann.backends.triton.kernels", True)
    assert "flash_cann.backends.triton.kernels.forward" in imported
