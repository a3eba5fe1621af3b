"""The op spec as the tests read it: the raw YAML document of op_project/flash_cann_ops.yaml,
not flash_cann.contract.spec's derivation of it, so that a test comparing an artefact with the
contract cannot share a mistake with the code that produced the artefact. The one
place tests read the YAML."""

from __future__ import annotations

from pathlib import Path

import yaml

PATH = Path(__file__).resolve().parents[1] / "op_project" / "flash_cann_ops.yaml"
RAW = yaml.safe_load(PATH.read_text())
OPS = {op["name"]: op for op in RAW["ops"]}

# The CANN op (OpDef, aclnn API, GE proto) has the arguments, outputs, layouts and ops of the
# features the npu backend lists, and no autograd-only attribute.
NPU_FEATURES = set(RAW["backends"]["npu"].get("features", []))


def on_cann(item: dict) -> bool:
    return item.get("feature") is None or item["feature"] in NPU_FEATURES


def cann_inputs(op: dict) -> list[dict]:
    return [t for t in op["inputs"] if on_cann(t)]


def cann_outputs(op: dict) -> list[dict]:
    return [t for t in op["outputs"] if on_cann(t)]


def cann_attrs(op: dict) -> list[dict]:
    return [a for a in op["attrs"] if on_cann(a) and not a.get("autograd_only")]


CANN_OPS = [op for op in RAW["ops"] if on_cann(op)]
