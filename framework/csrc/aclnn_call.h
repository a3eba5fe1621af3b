// One call of a generated aclnn API from a launcher kernel (flash_cann_aclnn_ops.h):
// the arguments as aclTensors and C values, stage 1 (GetWorkspaceSize) on the calling
// thread, stage 2 on torch_npu's task queue, and for every non-zero status an exception
// naming the op, the status and its meaning, the arguments, and CANN's own message.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include "aclnn_types.h"
#include "opapi_library.h"

namespace flash_cann_npu {

class AclnnCall {
 public:
  explicit AclnnCall(const char *torch_op);
  ~AclnnCall();
  AclnnCall(const AclnnCall &) = delete;
  AclnnCall &operator=(const AclnnCall &) = delete;

  // An input as the kernel reads it: in a plain (non-private) NPU format and dense.
  const aclTensor *input(const char *name, const at::Tensor &tensor);
  // nullptr when absent, as the generated API expects for optional inputs.
  const aclTensor *input(const char *name, const c10::optional<at::Tensor> &tensor);
  // Outputs are allocated by the caller (torch_npu's allocator, current stream), dense.
  const aclTensor *output(const char *name, const at::Tensor &tensor);
  double attr(const char *name, double value);
  bool attr(const char *name, bool value);
  int64_t attr(const char *name, int64_t value);
  // A String attribute as the generated API takes it; valid until the call is destroyed.
  char *attr(const char *name, c10::string_view value);

  template <class Fn>
  Fn resolve(const char *symbol) const {
    return reinterpret_cast<Fn>(library_.Symbol(symbol));
  }

  using Stage1 = std::function<aclnnStatus(uint64_t *workspace_size, aclOpExecutor **executor)>;
  // Runs stage 1 here and enqueues stage 2 (`stage2_name`) on the current NPU stream.
  void run(const char *stage1_name, const char *stage2_name, const Stage1 &stage1);

 private:
  // Makes the first tensor's device current for the rest of the call.
  void on_device_of(const at::Tensor &tensor);
  const aclTensor *convert(const char *name, const at::Tensor &tensor);
  void describe(const char *name, const std::string &value);

  const OpApiLibrary &library_;
  const char *torch_op_;
  c10::OptionalDeviceGuard device_guard_;  // set by on_device_of
  std::vector<at::Tensor> converted_;      // copies made for the kernel, alive until enqueued
  std::vector<aclTensor *> acl_tensors_;   // destroyed after stage 2, or here on failure
  std::deque<std::string> strings_;        // storage of char * attributes (stable addresses)
  std::string arguments_;                  // "name=value, ..." for error messages
};

}  // namespace flash_cann_npu
