#include "opapi_library.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>

namespace flash_cann_npu {
namespace {

std::mutex load_mutex;  // serialises Load; Get reads `loaded` without it
std::atomic<const OpApiLibrary *> loaded{nullptr};  // set once, kept for the process lifetime

// aclTensor management lives in libnnopbase, a dependency of every generated op library:
// dlsym on the library's handle searches its dependencies too.
const char *const kCreateTensor = "aclCreateTensor";
const char *const kDestroyTensor = "aclDestroyTensor";
const char *const kRecentErrMsg = "aclGetRecentErrMsg";
const char *const kUseStreamRes = "aclrtUseStreamResInCurrentThread";

std::string LastDlError() {
  const char *error = dlerror();
  return error != nullptr ? error : "unknown dlopen error";
}

}  // namespace

OpApiLibrary::OpApiLibrary(void *handle, std::string path)
    : handle_(handle),
      path_(std::move(path)),
      create_tensor_(reinterpret_cast<CreateTensorFn>(dlsym(handle, kCreateTensor))),
      destroy_tensor_(reinterpret_cast<DestroyTensorFn>(dlsym(handle, kDestroyTensor))),
      recent_error_(reinterpret_cast<RecentErrMsgFn>(dlsym(handle, kRecentErrMsg))),
      use_stream_resources_(reinterpret_cast<UseStreamResFn>(dlsym(handle, kUseStreamRes))) {}

const OpApiLibrary &OpApiLibrary::Load(const std::vector<std::string> &candidates,
                                       const std::vector<std::string> &aclnn_symbols) {
  std::lock_guard<std::mutex> lock(load_mutex);
  if (const OpApiLibrary *library = loaded.load()) {
    return *library;
  }
  std::vector<std::string> required = aclnn_symbols;
  required.insert(required.end(), {kCreateTensor, kDestroyTensor});
  std::string rejected;
  for (const std::string &path : candidates) {
    void *handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (handle == nullptr) {
      rejected += "\n  " + LastDlError();  // names the file
      continue;
    }
    std::string missing;
    for (const std::string &name : required) {
      if (dlsym(handle, name.c_str()) == nullptr) {
        missing += (missing.empty() ? "" : ", ") + name;
      }
    }
    if (!missing.empty()) {
      rejected += "\n  " + path + ": does not export " + missing;
      dlclose(handle);
      continue;
    }
    const OpApiLibrary *library = new OpApiLibrary(handle, path);
    loaded.store(library);
    return *library;
  }
  throw std::runtime_error(
      candidates.empty()
          ? std::string("flash_cann: no libcust_opapi.so candidate to load")
          : "flash_cann: no candidate is the flash-cann op package's aclnn library:" + rejected);
}

const OpApiLibrary &OpApiLibrary::Get() {
  const OpApiLibrary *library = loaded.load();
  if (library == nullptr) {
    throw std::runtime_error(
        "flash_cann: the op package's aclnn library is not loaded; the NPU backend "
        "(flash_cann.backends.npu) loads it before the first launch");
  }
  return *library;
}

void *OpApiLibrary::Symbol(const char *name) const {
  void *symbol = dlsym(handle_, name);
  if (symbol == nullptr) {
    throw std::runtime_error(std::string("flash_cann: ") + path_ + " does not export " + name);
  }
  return symbol;
}

std::string OpApiLibrary::RecentError() const {
  const char *message = recent_error_ != nullptr ? recent_error_() : nullptr;
  return message != nullptr ? message : "";
}

void OpApiLibrary::UseStreamResources(aclrtStream stream) const {
  if (use_stream_resources_ == nullptr) {
    throw std::runtime_error(std::string("flash_cann: torch_npu asks this thread to take the "
                                         "stream's resources, but ") +
                             path_ + " and its CANN libraries do not export " + kUseStreamRes);
  }
  const int status = use_stream_resources_(stream);
  if (status != 0) {
    throw std::runtime_error(std::string("flash_cann: ") + kUseStreamRes + " returned " +
                             std::to_string(status));
  }
}

}  // namespace flash_cann_npu
