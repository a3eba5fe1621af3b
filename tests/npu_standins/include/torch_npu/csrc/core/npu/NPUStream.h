// TEST-ONLY stand-in for torch_npu's header of the same path: the declarations
// framework/csrc uses, as torch_npu (v2.1.0-7.0.0 .. master) declares them.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <acl/acl_base.h>

namespace c10_npu {

class NPUStream {
 public:
  explicit NPUStream(c10::Stream stream) : stream_(stream) {}
  // need_empty = false: do not drain torch_npu's task queue first.
  aclrtStream stream(const bool need_empty) const;

 private:
  c10::Stream stream_;
};

NPUStream getCurrentNPUStream(c10::DeviceIndex device_index = -1);

}  // namespace c10_npu
