"""The generated aclnn API as the NPU extension calls it, checked against the YAML op spec
(read here independently of flash_cann.contract.spec) and CANN's generation rules; and the aclnn
status table, in Python and in its generated C++ twin."""

from __future__ import annotations

import dataclasses

import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from flash_cann.backends.npu import aclnn, aclnn_status
from flash_cann.contract.spec import parse

import contract
from contract import RAW
from native_build import needs

ROOT = Path(__file__).resolve().parents[1]
SPEC = parse(RAW)
# CANN's C type of each spec attribute type (msOpGen: Float -> double, String -> char *).
ATTR_CTYPES = {"float": "double", "bool": "bool", "int": "int64_t", "str": "char *"}

# Written out by hand from the rules of CANN's aclnn generator (mirror-cann/asc-devkit,
# tools/build/opbuild/op_aclnn_generator.cpp): the ABI the extension must call, whatever
# our generator says.
EXPECTED_PROTOTYPES = {
    "fwd": "aclnnStatus aclnnFlashCannAttentionGetWorkspaceSize(const aclTensor *query, "
           "const aclTensor *key, const aclTensor *value, "
           "const aclTensor *keyPaddingMaskOptional, const aclTensor *cuSeqlensQOptional, "
           "const aclTensor *cuSeqlensKOptional, const aclTensor *alibiSlopesOptional, "
           "const aclTensor *rngStateOptional, const aclTensor *sinksOptional, double scale, "
           "bool causal, char *layoutOptional, int64_t maxSeqlenQ, int64_t maxSeqlenK, "
           "int64_t windowLeft, int64_t windowRight, "
           "double softcap, double dropoutP, bool fp16Scores, const aclTensor *outOut, "
           "const aclTensor *softmaxLseOut, uint64_t *workspaceSize, aclOpExecutor **executor)",
    "bwd": "aclnnStatus aclnnFlashCannAttentionGradGetWorkspaceSize(const aclTensor *gradOut, "
           "const aclTensor *query, const aclTensor *key, const aclTensor *value, "
           "const aclTensor *out, const aclTensor *softmaxLse, "
           "const aclTensor *keyPaddingMaskOptional, const aclTensor *gradSoftmaxLseOptional, "
           "const aclTensor *cuSeqlensQOptional, const aclTensor *cuSeqlensKOptional, "
           "const aclTensor *alibiSlopesOptional, const aclTensor *rngStateOptional, "
           "const aclTensor *sinksOptional, double scale, bool causal, char *layoutOptional, "
           "bool deterministic, int64_t maxSeqlenQ, int64_t maxSeqlenK, int64_t windowLeft, "
           "int64_t windowRight, double softcap, "
           "double dropoutP, bool fp16Scores, const aclTensor *gradQueryOut, const aclTensor *gradKeyOut, "
           "const aclTensor *gradValueOut, const aclTensor *gradSinksOut, "
           "uint64_t *workspaceSize, aclOpExecutor **executor)",
}


@pytest.mark.parametrize("op", EXPECTED_PROTOTYPES)
def test_prototype_is_cann_generation_of_the_spec(op):
    api = aclnn.aclnn_api(SPEC.ops[op])
    assert api.prototype() == EXPECTED_PROTOTYPES[op]
    entry = next(o for o in RAW["ops"] if o["name"] == op)
    assert api.execute == f"aclnn{entry['cann_op_type']}"
    assert api.get_workspace_size == f"aclnn{entry['cann_op_type']}GetWorkspaceSize"


@pytest.mark.parametrize("entry", contract.CANN_OPS, ids=lambda e: e["name"])
def test_arguments_are_the_yaml_inputs_attrs_outputs_in_order(entry):
    params = aclnn.aclnn_api(SPEC.ops[entry["name"]]).params
    assert [(p.role, p.spec_name) for p in params] == (
        [("input", t["name"]) for t in contract.cann_inputs(entry)]
        + [("attr", a["name"]) for a in contract.cann_attrs(entry)]
        + [("output", t["name"]) for t in contract.cann_outputs(entry)])
    attrs = {p.spec_name: p.ctype for p in params if p.role == "attr"}
    assert attrs == {a["name"]: ATTR_CTYPES[a["type"]] for a in contract.cann_attrs(entry)}
    for param, tensor in zip(params, contract.cann_inputs(entry)):
        assert param.name.endswith("Optional") == bool(tensor.get("optional", False))


@pytest.mark.parametrize("entry", contract.CANN_OPS, ids=lambda e: e["name"])
def test_launcher_schema_is_the_aclnn_order_with_outputs_written_in_place(entry):
    schema = torch._C.parse_schema(aclnn.launcher_schema(SPEC.ops[entry["name"]]))
    names = ([t["name"] for t in contract.cann_inputs(entry)]
             + [a["name"] for a in contract.cann_attrs(entry)])
    outputs = [t["name"] for t in contract.cann_outputs(entry)]
    assert [a.name for a in schema.arguments] == names + outputs
    assert [a.alias_info is not None and a.alias_info.is_write
            for a in schema.arguments] == [False] * len(names) + [True] * len(outputs)
    assert not schema.returns


@pytest.mark.parametrize("entry", contract.CANN_OPS, ids=lambda e: e["name"])
def test_launcher_schema_types_follow_the_yaml(entry):
    """Optional inputs (the features' alibi_slopes, rng_state) are Tensor?, attributes
    their spec type: window bounds int (aclnn int64_t), softcap and dropout_p float
    (double); the generated kernel takes them with torch's C++ types."""
    schema = torch._C.parse_schema(aclnn.launcher_schema(SPEC.ops[entry["name"]]))
    types = {a.name: str(a.type) for a in schema.arguments}
    for tensor in contract.cann_inputs(entry):
        assert types[tensor["name"]] == ("Optional[Tensor]" if tensor.get("optional")
                                         else "Tensor"), tensor["name"]
    for attr in contract.cann_attrs(entry):
        assert types[attr["name"]] == attr["type"], attr["name"]
    header = aclnn.render_headers(SPEC)["flash_cann_aclnn_ops.h"]
    launch = header[header.index(f"struct {entry['cann_op_type']} {{"):]
    launch = launch[launch.index("static void Launch("):launch.index(") {")]
    cann = {x["name"] for x in contract.cann_inputs(entry) + contract.cann_attrs(entry)}
    for name, declaration in (("cu_seqlens_q", "const c10::optional<at::Tensor> &cu_seqlens_q"),
                              ("cu_seqlens_k", "const c10::optional<at::Tensor> &cu_seqlens_k"),
                              ("max_seqlen_q", "int64_t max_seqlen_q"),
                              ("max_seqlen_k", "int64_t max_seqlen_k"),
                              ("alibi_slopes", "const c10::optional<at::Tensor> &alibi_slopes"),
                              ("rng_state", "const c10::optional<at::Tensor> &rng_state"),
                              ("sinks", "const c10::optional<at::Tensor> &sinks"),
                              ("window_left", "int64_t window_left"),
                              ("window_right", "int64_t window_right"),
                              ("softcap", "double softcap"), ("dropout_p", "double dropout_p")):
        assert (declaration in launch) == (name in cann), declaration


def _one_op_spec(**op):
    doc = yaml.safe_load(yaml.safe_dump(RAW))
    doc["ops"] = [dict(name="t", cann_op_type="T", summary="s", **op)]
    return parse(doc).ops["t"]


def test_generation_rules_beyond_our_ops():
    """Single output is `out`; a required String is not Optional; Int is int64_t."""
    op = _one_op_spec(inputs=[{"name": "x_in", "dtype": "input"}],
                      attrs=[{"name": "mode_name", "type": "str"},
                             {"name": "block_size", "type": "int", "default": 4}],
                      outputs=[{"name": "y_out", "dtype": "input"}])
    assert aclnn.aclnn_api(op).prototype() == (
        "aclnnStatus aclnnTGetWorkspaceSize(const aclTensor *xIn, char *modeName, "
        "int64_t blockSize, const aclTensor *out, uint64_t *workspaceSize, "
        "aclOpExecutor **executor)")


def test_in_place_arguments_are_refused():
    op = _one_op_spec(inputs=[{"name": "x", "dtype": "input"}], attrs=[],
                      outputs=[{"name": "x", "dtype": "input"}])
    with pytest.raises(ValueError, match=r"\['x'\] are both inputs and outputs"):
        aclnn.aclnn_api(op)


def test_generated_kernels_use_the_generated_signatures():
    """Each op's kernel in the generated header: its launcher schema and symbols."""
    ops_header = aclnn.render_headers(SPEC)["flash_cann_aclnn_ops.h"]
    for op in SPEC.cann_ops:
        api = aclnn.aclnn_api(op)
        assert f"struct {op.cann_op_type} {{" in ops_header
        assert f'kLauncherSchema = "{aclnn.launcher_schema(op)}";' in ops_header
        assert f'kGetWorkspaceSize = "{api.get_workspace_size}";' in ops_header


def _required_symbols(spec):
    header = aclnn.render_headers(spec)["flash_cann_aclnn_ops.h"]
    return header.split("kAclnnSymbols = {", 1)[1].split("}", 1)[0]


def test_the_package_must_export_the_backward_kernels_api_when_the_spec_says_it_has_one():
    """npu.backward is true: the Grad op's functions are required; with it false, a library
    with only the forward's aclnn functions is the flash-cann package."""
    assert _required_symbols(SPEC) == ('"aclnnFlashCannAttentionGetWorkspaceSize", '
                                       '"aclnnFlashCannAttention", '
                                       '"aclnnFlashCannAttentionGradGetWorkspaceSize", '
                                       '"aclnnFlashCannAttentionGrad", '
                                       '"aclnnFlashCannAttentionKVCacheGetWorkspaceSize", '
                                       '"aclnnFlashCannAttentionKVCache"')
    without_backward = dataclasses.replace(
        SPEC, backends={**SPEC.backends,
                        "npu": dataclasses.replace(SPEC.backends["npu"], backward=False)})
    assert "Grad" not in _required_symbols(without_backward)


@pytest.mark.parametrize("code, text", [
    (0, "ACLNN_SUCCESS: success"),
    (161002, "ACLNN_ERR_PARAM_INVALID: parameter check failed"),
    (561002, "ACLNN_ERR_INNER_TILING_ERROR: tiling failed"),
    (561105, "ACLNN_ERR_INNER_KEY_CONFLICT: kernel-match hash key conflict"),
    (161999, "ACLNN_ERR_PARAM_*: parameter check failed"),  # a code newer than the table
    (361002, "ACLNN_ERR_RUNTIME_*: an NPU runtime call"),
    (561500, "ACLNN_ERR_INNER_*: internal error in the op library"),
    (507015, "not in CANN's public aclnn status table"),   # an ACL runtime code
    (-1, "not in CANN's public aclnn status table"),
])
def test_describe(code, text):
    assert aclnn_status.describe(code).startswith(text)


def test_status_table_names_each_public_code_once():
    """The values of CANN's opdev/op_errno.h (hicann/opbase)."""
    public = {0, 161001, 161002, 361001, 561000, 561001, 561002, 561003, *range(561101, 561120)}
    exact = [row.first for row in aclnn_status.STATUS_TABLE if row.first == row.last]
    assert sorted(exact) == sorted(public)
    ranges = [row for row in aclnn_status.STATUS_TABLE if row.first != row.last]
    assert aclnn_status.STATUS_TABLE[-len(ranges):] == tuple(ranges)  # exact rows win


@needs("g++")
def test_cpp_lookup_says_exactly_what_describe_says(tmp_path):
    """framework/csrc/aclnn_status.h over the generated table, compiled and run."""
    aclnn.write_headers(tmp_path)
    probe = tmp_path / "probe.cpp"
    probe.write_text('#include <cstdio>\n#include <cstdlib>\n#include "aclnn_status.h"\n'
                     "int main(int argc, char **argv) {\n"
                     "  for (int i = 1; i < argc; ++i)\n"
                     '    std::printf("%s\\n", flash_cann_npu::DescribeStatus('
                     "std::atoi(argv[i])).c_str());\n}\n")
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror",
                    f"-I{ROOT / 'framework' / 'csrc'}", f"-I{tmp_path}", str(probe),
                    "-o", str(tmp_path / "probe")], check=True)
    codes = sorted({c for row in aclnn_status.STATUS_TABLE for c in (row.first, row.last)}
                   | {-1, 1, 160999, 161000, 562000, 507015})
    done = subprocess.run([str(tmp_path / "probe"), *map(str, codes)], check=True,
                          capture_output=True, text=True)
    assert done.stdout.splitlines() == [aclnn_status.describe(c) for c in codes]
