#include "aclnn_call.h"

#include <ATen/ops/empty.h>
#include <c10/util/StringUtil.h>

#include <torch_npu/csrc/core/npu/NPUFormat.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>
#include <torch_npu/csrc/framework/OpCommand.h>

#include "aclnn_status.h"
#include "torch_npu_compat.h"

namespace flash_cann_npu {
namespace {

aclDataType AclDataType(at::ScalarType dtype, const char *name) {
  switch (dtype) {
    case at::kHalf:
      return ACL_FLOAT16;
    case at::kBFloat16:
      return ACL_BF16;
    case at::kFloat:
      return ACL_FLOAT;
    case at::kBool:
      return ACL_BOOL;
    case at::kLong:  // rng_state: (seed, offset), read by the kernel
      return ACL_INT64;
    case at::kInt:  // cu_seqlens, the KV cache's lengths, block table, batch index, leftpad
      return ACL_INT32;
    default:
      TORCH_CHECK(false, "flash_cann: ", name, " has dtype ", dtype,
                  ", which the NPU op does not take (float16, bfloat16, float32, bool, int64, "
                  "int32)");
  }
}

// torch_npu keeps these formats in the plain strided layout torch describes; any other
// (FRACTAL_NZ, NC1HWC0, ... from npu_format_cast) is a private tiling the kernel can't read.
bool IsPlainFormat(int64_t format) {
  return format == ACL_FORMAT_ND || format == ACL_FORMAT_NCHW || format == ACL_FORMAT_NCL ||
         format == ACL_FORMAT_NCDHW;
}

std::string Describe(const at::Tensor &tensor) {
  return c10::str(tensor.scalar_type(), tensor.sizes());
}

std::string FailureMessage(const char *torch_op, const char *stage, aclnnStatus status,
                           const std::string &arguments, const std::string &cann_message) {
  return c10::str("flash_cann: ", torch_op, " on NPU: ", stage, " returned aclnn status ",
                  status, " (", DescribeStatus(status), ")\n  arguments: ", arguments,
                  "\n  CANN: ", cann_message.empty() ? "(no message)" : cann_message);
}

}  // namespace

AclnnCall::AclnnCall(const char *torch_op)
    : library_(OpApiLibrary::Get()), torch_op_(torch_op), device_guard_() {}

AclnnCall::~AclnnCall() {
  for (aclTensor *tensor : acl_tensors_) {
    library_.destroy_tensor()(tensor);
  }
}

void AclnnCall::describe(const char *name, const std::string &value) {
  arguments_ += arguments_.empty() ? "" : ", ";
  arguments_ += name;
  arguments_ += '=';
  arguments_ += value;
}

void AclnnCall::on_device_of(const at::Tensor &tensor) {
  if (!device_guard_.current_device().has_value()) {
    device_guard_.reset_device(tensor.device());
  }
}

const aclTensor *AclnnCall::convert(const char *name, const at::Tensor &tensor) {
  // View sizes/strides/offset over the whole storage, as op-plugin describes tensors.
  const int64_t storage_elements = static_cast<int64_t>(tensor.storage().nbytes()) /
                                   static_cast<int64_t>(tensor.itemsize());
  aclTensor *acl = library_.create_tensor()(
      tensor.sizes().data(), tensor.dim(), AclDataType(tensor.scalar_type(), name),
      tensor.strides().data(), tensor.storage_offset(), ACL_FORMAT_ND, &storage_elements, 1,
      const_cast<void *>(tensor.storage().data()));
  TORCH_CHECK(acl != nullptr, "flash_cann: ", torch_op_, ": aclCreateTensor failed for ", name,
              " (", Describe(tensor), ")");
  acl_tensors_.push_back(acl);
  return acl;
}

const aclTensor *AclnnCall::input(const char *name, const at::Tensor &tensor) {
  on_device_of(tensor);
  describe(name, Describe(tensor));
  at::Tensor plain = IsPlainFormat(at_npu::native::get_npu_format(tensor))
                         ? tensor
                         : at_npu::native::npu_format_cast(tensor, ACL_FORMAT_ND);
  // Strided views (a slice of packed qkv, an expanded mask) are copied: the kernel
  // reads dense tensors.
  plain = plain.contiguous();
  if (!plain.is_same(tensor)) {
    converted_.push_back(plain);
  }
  return convert(name, plain);
}

const aclTensor *AclnnCall::input(const char *name, const c10::optional<at::Tensor> &tensor) {
  if (!tensor.has_value()) {
    describe(name, "None");
    return nullptr;
  }
  return input(name, *tensor);
}

const aclTensor *AclnnCall::output(const char *name, const at::Tensor &tensor) {
  on_device_of(tensor);
  describe(name, Describe(tensor));
  TORCH_CHECK(tensor.is_contiguous() &&
                  IsPlainFormat(at_npu::native::get_npu_format(tensor)),
              "flash_cann: ", torch_op_, ": output ", name,
              " must be a dense tensor in a plain NPU format");
  return convert(name, tensor);
}

double AclnnCall::attr(const char *name, double value) {
  describe(name, c10::str(value));
  return value;
}

bool AclnnCall::attr(const char *name, bool value) {
  describe(name, value ? "True" : "False");
  return value;
}

int64_t AclnnCall::attr(const char *name, int64_t value) {
  describe(name, c10::str(value));
  return value;
}

char *AclnnCall::attr(const char *name, c10::string_view value) {
  strings_.emplace_back(value.data(), value.size());
  describe(name, strings_.back());
  return strings_.back().data();
}

void AclnnCall::run(const char *stage1_name, const char *stage2_name, const Stage1 &stage1) {
  using at_npu::native::OpCommand;
  // op-plugin's EXEC_NPU_CMD pattern: each aclnn stage runs on a thread that holds the
  // stream's resources when torch_npu's core control asks for it (torch_npu_compat.h).
  const aclrtStream stream = c10_npu::getCurrentNPUStream().stream(false);
  if (compat::StreamResourcesNeeded(stream, compat::Stage::kEnqueue)) {
    library_.UseStreamResources(stream);
  }
  uint64_t workspace_size = 0;
  aclOpExecutor *executor = nullptr;
  const aclnnStatus status = stage1(&workspace_size, &executor);
  // Stage 1 (argument checks, tiling, kernel lookup) runs here, so its errors and CANN's
  // thread-local message are reported synchronously, with the Python stack.
  TORCH_CHECK(status == 0, FailureMessage(torch_op_, stage1_name, status, arguments_,
                                          library_.RecentError()));

  // From torch_npu's caching allocator on the current stream, alive until stage 2 is
  // enqueued: afterwards the block can only be reused by work queued behind ours on the
  // same stream (op-plugin's EXEC_NPU_CMD relies on the same ordering). op-plugin takes
  // it from OpPreparation::unsafe_empty_workspace, which libtorch_npu.so does not export
  // (2.13.0): an extension built outside torch_npu cannot link it.
  at::Tensor workspace_buffer;
  void *workspace = nullptr;
  if (workspace_size > 0) {
    workspace_buffer = at::empty({static_cast<int64_t>(workspace_size)},
                                 at::TensorOptions(device_guard_.current_device().value())
                                     .dtype(at::kByte));
    workspace = workspace_buffer.data_ptr();
  }
  const auto stage2 = resolve<ExecuteFn>(stage2_name);
  const OpApiLibrary *library = &library_;
  // The queue thread owns the aclTensors from here (and destroys them after stage 2).
  std::vector<aclTensor *> acl_tensors = std::move(acl_tensors_);
  acl_tensors_.clear();
  // With TASK_QUEUE_ENABLE (torch_npu's default) this runs later on the queue thread:
  // everything is captured by value. An exception there is logged by torch_npu and
  // surfaces at the next synchronisation; with ASCEND_LAUNCH_BLOCKING=1 it is raised here.
  const at_npu::native::PROC_FUNC launch =
      [=, torch_op = torch_op_, arguments = arguments_]() -> int {
    if (compat::StreamResourcesNeeded(stream, compat::Stage::kDequeue)) {
      library->UseStreamResources(stream);
    }
    const aclnnStatus result = stage2(workspace, workspace_size, executor, stream);
    for (aclTensor *tensor : acl_tensors) {
      library->destroy_tensor()(tensor);
    }
    TORCH_CHECK(result == 0, FailureMessage(torch_op, stage2_name, result, arguments,
                                            library->RecentError()));
    return 0;
  };
  compat::RunOpApi<OpCommand>(stage2_name, launch);
}

}  // namespace flash_cann_npu
