"""The op spec as the tests read it: the raw YAML document of op_project/flash_cann_ops.yaml,
not flash_cann.spec's derivation of it, so that a test comparing an artefact with the
contract cannot share a mistake with the code that produced the artefact. The one
place tests read the YAML."""

from __future__ import annotations

from pathlib import Path

import yaml

PATH = Path(__file__).resolve().parents[1] / "op_project" / "flash_cann_ops.yaml"
RAW = yaml.safe_load(PATH.read_text())
OPS = {op["name"]: op for op in RAW["ops"]}
