// TEST-ONLY stand-in for torch_npu's header of the same path: the declarations
// framework/csrc uses, as torch_npu (v2.1.0-7.0.0 .. master) declares them.
#pragma once

#include <functional>
#include <string>

namespace at_npu {
namespace native {

using PROC_FUNC = std::function<int()>;

class OpCommand {
 public:
  // Runs `func` on the current NPU stream's task queue (or now, when the queue is off).
  static void RunOpApi(const std::string &op_name, PROC_FUNC func, bool sync = false);
};

}  // namespace native
}  // namespace at_npu
