// TEST-ONLY: a fake libtorch_npu.so, so CI can run framework/csrc without an NPU. Built
// against the real torch_npu headers (the torch-npu wheel's include/), it defines the
// torch_npu functions the extension calls -- the extension is linked against the real
// libtorch_npu.so and runs against this one (same soname) -- doing the least that keeps
// their contract: "npu" (PrivateUse1) tensors live in host memory, every tensor is in the
// plain ND format, OpCommand::RunOpApiV2 runs the handler at once (as torch_npu does with
// ASCEND_LAUNCH_BLOCKING=1), and the stream-resource checks answer $FAKE_NPU_CORE_CONTROL
// ("1": the thread must take the stream's resources; "enqueue" / "dequeue": only that check says so). Other aten ops run on the CPU
// (torch's cpu_fallback), so a loss can be computed. Graph capture (torch.npu.NPUGraph):
// fake_npu_capture.h. Not torch_npu.
#include <cstdlib>
#include <cstring>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/native/CPUFallback.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <torch_npu/csrc/core/npu/NPUFormat.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>
#include <torch_npu/csrc/framework/OpCommand.h>

#include "fake_npu_capture.h"

namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kNpu, 0);

void Free(void *data) { std::free(data); }

struct HostAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    if (fake_npu::PoolBlock *block = fake_npu::AllocateInPool(bytes)) {
      return {block->data, block, &fake_npu::PoolRelease, kDevice};
    }
    void *data = bytes ? std::calloc(bytes, 1) : nullptr;
    return {data, data, &Free, kDevice};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }
  void copy_data(void *dest, const void *src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
HostAllocator allocator;

struct Guard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device) const override { return kDevice; }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override { return stream; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // torch.accelerator.synchronize(), Stream.synchronize(), Event.synchronize(): the host
  // waits for the device, which a capture forbids.
  void synchronizeDevice(const c10::DeviceIndex) const override {
    fake_npu::RefuseInCapture("synchronize (device)", "the host would wait for the device");
  }
  void synchronizeStream(const c10::Stream &) const override {
    fake_npu::RefuseInCapture("synchronize (stream)", "the host would wait for the stream");
  }
  void synchronizeEvent(void *) const override {
    fake_npu::RefuseInCapture("synchronize (event)", "the host would wait for the event");
  }
  bool queryStream(const c10::Stream &) const override {
    fake_npu::RefuseInCapture("query (stream)", "the host would poll the stream");
    return true;
  }
  bool isStreamCapturing(const c10::Stream &) const override { return fake_npu::Capturing(); }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

// What the autograd engine asks of a PrivateUse1 device.
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  at::Device getDeviceFromPtr(void *) const override { return kDevice; }
};
[[maybe_unused]] const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks);
  return true;
}();

const c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

at::Tensor Empty(c10::IntArrayRef size, c10::optional<at::ScalarType> dtype,
                 c10::optional<at::Layout>, c10::optional<at::Device>, c10::optional<bool>,
                 c10::optional<at::MemoryFormat> memory_format) {
  return at::detail::empty_generic(size, &allocator, kKeys, c10::dtype_or_default(dtype),
                                   memory_format);
}

at::Tensor EmptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        c10::optional<at::ScalarType> dtype, c10::optional<at::Layout>,
                        c10::optional<at::Device>, c10::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &allocator, kKeys,
                                           c10::dtype_or_default(dtype));
}

// The same bytes seen as a CPU tensor (both devices are host memory here).
at::Tensor OnHost(const at::Tensor &t) {
  if (t.device().is_cpu()) {
    return t;
  }
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

void Copy(const at::Tensor &from, const at::Tensor &to) { OnHost(to).copy_(OnHost(from)); }

at::Tensor CopyFrom(const at::Tensor &self, const at::Tensor &dst, bool) {
  if (fake_npu::CallerWorkInCapture()) {
    if (dst.device().is_cpu()) {
      fake_npu::RefuseInCapture(
          "a copy of an npu tensor to the host (Tensor.cpu(), .tolist(), .numpy(), "
          ".to(\"cpu\"))", "the host would wait for the device's values");
    }
    if (self.device().is_cpu()) {
      fake_npu::RefuseInCapture(
          "a copy from host memory into an npu tensor (torch.tensor(..., device=\"npu\"), "
          ".to(\"npu\"))",
          "a replay would copy the bytes the host held at capture, not new ones; fill a "
          "static npu input outside the capture instead");
    }
    fake_npu::Record([self, dst]() { Copy(self, dst); });
  }
  Copy(self, dst);
  return dst;
}

// What cpu_fallback writes results back with (in-place and out= ops). An out= result of
// another size (arange into an empty tensor) first grows the npu tensor, through its
// storage's allocator (this device's), as torch's CPU resize_ does.
at::Tensor CopyFromAndResize(const at::Tensor &self, const at::Tensor &dst) {
  if (self.sizes() != dst.sizes()) {
    at::native::resize_(dst, self.sizes());
  }
  return CopyFrom(self, dst, false);
}

void RunOnCpu(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  fake_npu::FallbackScope scope;
  at::native::cpu_fallback(op, stack);
}

void CpuFallback(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  if (fake_npu::CallerWorkInCapture()) {
    fake_npu::FallbackInCapture(op, stack, &RunOnCpu, &Copy);
    return;
  }
  RunOnCpu(op, stack);
}

// $FAKE_NPU_CORE_CONTROL: "1" both checks say yes; "enqueue" or "dequeue" only that one.
bool CoreControl(const char *stage) {
  const char *value = std::getenv("FAKE_NPU_CORE_CONTROL");
  return value != nullptr && (std::strcmp(value, "1") == 0 || std::strcmp(value, stage) == 0);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &Empty);
  m.impl("empty_strided", &EmptyStrided);
  m.impl("_copy_from", &CopyFrom);
  m.impl("_copy_from_and_resize", &CopyFromAndResize);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
}

// torch.npu.NPUGraph's C++ side, for the torch_npu stand-in (torch_npu/graphs.py).
TORCH_LIBRARY(fake_npu, m) {
  m.def("capture_begin() -> ()", &fake_npu::CaptureBegin);
  m.def("capture_end() -> int", &fake_npu::CaptureEnd);
  m.def("replay(int graph) -> ()", &fake_npu::Replay);
  m.def("reset(int graph) -> ()", &fake_npu::Reset);
  m.def("tasks(int graph) -> int", &fake_npu::TaskCount);
  m.def("is_capturing() -> bool", &fake_npu::Capturing);
  m.def("synchronize() -> ()", [] {
    fake_npu::RefuseInCapture("torch.npu.synchronize()", "the host would wait for the device");
  });
}

namespace c10_npu {

aclrtStream NPUStream::stream(const bool) const {
  return reinterpret_cast<aclrtStream>(0x5EED);  // the fake aclnn library checks it
}

NPUStream getCurrentNPUStream(c10::DeviceIndex) {
  return NPUStream(NPUStream::UNCHECKED, c10::Stream(c10::Stream::DEFAULT, kDevice));
}

bool check_enqueue_need_use(aclrtStream) { return CoreControl("enqueue"); }

bool check_dequeue_need_use(aclrtStream) { return CoreControl("dequeue"); }

}  // namespace c10_npu

namespace at_npu {
namespace native {

int64_t get_npu_format(const at::Tensor &) { return ACL_FORMAT_ND; }

at::Tensor npu_format_cast(const at::Tensor &self, int64_t) { return self; }

void OpCommand::RunOpApiV2(const std::string &op_name, const PROC_FUNC &func, bool) {
  TORCH_CHECK(func() == 0, "fake torch_npu: ", op_name, " returned non-zero");
}

}  // namespace native
}  // namespace at_npu
