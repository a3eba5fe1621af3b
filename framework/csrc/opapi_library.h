// The op package's aclnn library (libcust_opapi.so), loaded once per process.
//
// The Python backend lists the candidate files in torch_npu's search order
// (flash_cann.backends.npu.opp_paths). The first candidate that exports every symbol we call is used;
// one that does not is skipped, as torch_npu skips it, because several vendors' op
// packages can be installed side by side.
#pragma once

#include <string>
#include <vector>

#include "aclnn_types.h"

namespace flash_cann_npu {

class OpApiLibrary {
 public:
  // Loads the first usable candidate, or throws std::runtime_error naming each candidate
  // and why it was rejected. Once one is loaded, later calls return it.
  static const OpApiLibrary &Load(const std::vector<std::string> &candidates,
                                  const std::vector<std::string> &aclnn_symbols);
  // The loaded library; throws std::runtime_error if Load has not succeeded.
  static const OpApiLibrary &Get();

  const std::string &path() const { return path_; }
  // A symbol Load checked for; throws std::runtime_error for any other missing one.
  void *Symbol(const char *name) const;
  CreateTensorFn create_tensor() const { return create_tensor_; }
  DestroyTensorFn destroy_tensor() const { return destroy_tensor_; }
  // CANN's last error message on the calling thread ("" if none), cleared by reading.
  std::string RecentError() const;
  // aclrtUseStreamResInCurrentThread: the calling thread takes `stream`'s resources (what
  // torch_npu's c10_npu::UseStreamResInCurrentThread does; libtorch_npu.so does not export
  // that one). Throws std::runtime_error if CANN lacks it or it fails.
  void UseStreamResources(aclrtStream stream) const;

 private:
  OpApiLibrary(void *handle, std::string path);

  void *handle_;
  std::string path_;
  CreateTensorFn create_tensor_;
  DestroyTensorFn destroy_tensor_;
  RecentErrMsgFn recent_error_;  // null if the library's dependencies lack it
  UseStreamResFn use_stream_resources_;  // null in CANN versions without core control
};

}  // namespace flash_cann_npu
