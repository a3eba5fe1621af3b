// The flash-cann NPU extension: launcher ops torch.ops.flash_cann_npu.{fwd,bwd} that run
// the op package's generated aclnn API on NPU (PrivateUse1) tensors, and load_opapi,
// which picks that library.
//
// The public ops torch.ops.flash_cann.* stay in Python (flash_cann.contract.ops): the shared
// argument checks run first, then flash_cann.backends.npu allocates the outputs and calls
// these launchers. Their schemas and kernels are generated from the op spec
// (flash_cann_aclnn_ops.h, written by framework/setup.py).
#include <string>
#include <vector>

#include <torch/library.h>

#include "flash_cann_aclnn_ops.h"
#include "opapi_library.h"

namespace flash_cann_npu {
namespace {

std::string LoadOpApi(std::vector<std::string> candidates) {
  return OpApiLibrary::Load(candidates, kAclnnSymbols).path();
}

}  // namespace
}  // namespace flash_cann_npu

TORCH_LIBRARY(flash_cann_npu, m) {
  flash_cann_npu::DefineLaunchers(m);
  m.def("load_opapi(str[] candidates) -> str", &flash_cann_npu::LoadOpApi);
}

TORCH_LIBRARY_IMPL(flash_cann_npu, PrivateUse1, m) {
  flash_cann_npu::ImplementLaunchers(m);
}
