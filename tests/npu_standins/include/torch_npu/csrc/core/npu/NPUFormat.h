// TEST-ONLY stand-in for torch_npu's header of the same path: the declarations
// framework/csrc uses, as torch_npu (v2.1.0-7.0.0 .. master) declares them.
#pragma once

#include <ATen/core/Tensor.h>

namespace at_npu {
namespace native {

int64_t get_npu_format(const at::Tensor &self);
at::Tensor npu_format_cast(const at::Tensor &self, int64_t acl_format);

}  // namespace native
}  // namespace at_npu
