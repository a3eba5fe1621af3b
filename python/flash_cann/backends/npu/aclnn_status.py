"""aclnn status codes and what they mean: the one table, and the lookup.

The NPU extension (``framework/``) turns every non-zero status of our generated aclnn API
into an exception that says what the code means. Its C++ lookup is generated from
:data:`STATUS_TABLE` (see :func:`flash_cann.backends.npu.aclnn.render_headers`) and walks the rows the
same way :func:`describe` does, so the two cannot drift; a test compiles the C++ twin and
compares both on every row.

Values and names: CANN's public aclnn return-code table (``opdev/op_errno.h`` in
hicann/opbase, and the "aclnn返回码" page of the CANN docs). The meanings are ours, with a
hint where a code usually points at the flash-cann installation.
"""

from __future__ import annotations

from typing import NamedTuple


class StatusRow(NamedTuple):
    first: int
    last: int   # first == last for one code; a range covers a documented family
    name: str
    meaning: str


# Exact codes first: the first row that contains a code describes it.
STATUS_TABLE: tuple[StatusRow, ...] = tuple(StatusRow(*row) for row in (
    (0, 0, "ACLNN_SUCCESS", "success"),
    (161001, 161001, "ACLNN_ERR_PARAM_NULLPTR",
     "parameter check: a required argument is a null pointer"),
    (161002, 161002, "ACLNN_ERR_PARAM_INVALID",
     "parameter check failed (dtype, shape or attribute rejected by the op)"),
    (361001, 361001, "ACLNN_ERR_RUNTIME_ERROR", "an NPU runtime call inside the aclnn API failed"),
    (561000, 561000, "ACLNN_ERR_INNER", "internal error in the op library"),
    (561001, 561001, "ACLNN_ERR_INNER_INFERSHAPE_ERROR", "output shape inference failed"),
    (561002, 561002, "ACLNN_ERR_INNER_TILING_ERROR",
     "tiling failed (the op's host code rejected these sizes)"),
    (561003, 561003, "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
     "no kernel binary matches these inputs (is the flash-cann package installed for this "
     "SoC, with kernels for this dtype?)"),
    (561101, 561101, "ACLNN_ERR_INNER_CREATE_EXECUTOR", "creating the aclOpExecutor failed"),
    (561102, 561102, "ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR",
     "internal: the executor was not handed over"),
    (561103, 561103, "ACLNN_ERR_INNER_NULLPTR", "internal null pointer"),
    (561104, 561104, "ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE", "wrong number of op attributes"),
    (561105, 561105, "ACLNN_ERR_INNER_KEY_CONFLICT", "kernel-match hash key conflict"),
    (561106, 561106, "ACLNN_ERR_INNER_INVALID_IMPL_MODE", "invalid implementation mode"),
    (561107, 561107, "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
     "ASCEND_OPP_PATH is not set (source CANN's set_env.sh)"),
    (561108, 561108, "ACLNN_ERR_INNER_LOAD_JSON_FAILED",
     "loading the op's kernel info json failed (reinstall the flash-cann package)"),
    (561109, 561109, "ACLNN_ERR_INNER_JSON_VALUE_NOT_FOUND",
     "a field is missing from the op info json"),
    (561110, 561110, "ACLNN_ERR_INNER_JSON_FORMAT_INVALID",
     "invalid format value in the op info json"),
    (561111, 561111, "ACLNN_ERR_INNER_JSON_DTYPE_INVALID",
     "invalid dtype value in the op info json"),
    (561112, 561112, "ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND",
     "the op's kernel binary package is not loaded (is the flash-cann package installed?)"),
    (561113, 561113, "ACLNN_ERR_INNER_OP_FILE_INVALID", "reading the op json file failed"),
    (561114, 561114, "ACLNN_ERR_INNER_ATTR_NUM_OUT_OF_BOUND",
     "more attributes than the op json declares (extension and package built from "
     "different specs?)"),
    (561115, 561115, "ACLNN_ERR_INNER_ATTR_LEN_NOT_ENOUGH",
     "fewer attributes than the op json declares (extension and package built from "
     "different specs?)"),
    (561116, 561116, "ACLNN_ERR_INNER_INPUT_NUM_IN_JSON_TOO_LARGE",
     "more than 32 inputs in the op json"),
    (561117, 561117, "ACLNN_ERR_INNER_INPUT_JSON_IS_NULL", "the op info json has no description"),
    (561118, 561118, "ACLNN_ERR_INNER_STATIC_WORKSPACE_INVALID",
     "bad workspace info in the static kernel json"),
    (561119, 561119, "ACLNN_ERR_INNER_STATIC_BLOCK_DIM_INVALID",
     "bad block-dim info in the static kernel json"),
    # Families the docs define by prefix; newer CANN releases add codes inside them.
    (161000, 161999, "ACLNN_ERR_PARAM_*", "parameter check failed"),
    (361000, 361999, "ACLNN_ERR_RUNTIME_*", "an NPU runtime call inside the aclnn API failed"),
    (561000, 561999, "ACLNN_ERR_INNER_*", "internal error in the op library"),
))

UNKNOWN = "not in CANN's public aclnn status table"


def describe(code: int) -> str:
    """``"NAME: meaning"`` for an aclnn status, e.g. ``describe(561002)``; never raises."""
    for row in STATUS_TABLE:
        if row.first <= code <= row.last:
            return f"{row.name}: {row.meaning}"
    return UNKNOWN
