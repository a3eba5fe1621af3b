// TEST-ONLY: graph capture on the fake NPU (fake_torch_npu.cpp includes this), modelled on
// torch_npu's ACL graphs (torch.npu.NPUGraph: capture_begin / capture_end / replay / reset,
// read in Ascend/pytorch torch_npu/npu/graphs.py and csrc/core/npu/NPUGraph*.{h,cpp};
// modelled, not copied). Not torch_npu.
//
// What a real capture does that matters to flash-cann, and how the fake device models it:
// * Nothing may wait for the device: reading an npu tensor on the host (item, int(), bool(),
//   .tolist(), .cpu(), printing), an op whose output size depends on the values (nonzero,
//   masked_select, a boolean-mask index), torch.equal, a synchronize. On an NPU the
//   capturing stream cannot be synchronised and the capture fails; here each of these
//   raises at once, naming the operation (the message ends as torch_npu's
//   assertNotCapturing does), and invalidates the capture: capture_end then raises too,
//   so code that catches the first error cannot hide it. A copy from host memory into an
//   npu tensor is refused as well: a graph would replay the bytes the host held at capture.
// * The device work is recorded and replay re-runs it, in order, on the same memory: every
//   aten op on npu tensors (run by torch's CPU fallback here), device-to-device copies,
//   and the aclnn launches the op package's stage 2 enqueues (the fake op library records
//   them through fake_npu_record_task). Here the work also runs once at capture (a real
//   capture only records it): tests set their inputs again before replaying.
// * Memory allocated during a capture belongs to the graph's pool: it outlives the tensors
//   freed during capture until the graph is reset, so replay never touches freed memory.
//
// The guards sit below the dispatcher (the fallback kernel, _copy_from, the device guard's
// synchronize), so code under test cannot go around them. The capture is process-wide
// (torch_npu's "global" capture mode): the autograd engine's device thread is covered too.
#pragma once

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>

namespace fake_npu {

enum class Status : int { kNone = 0, kActive = 1, kInvalidated = 2 };

// A block allocated during a capture: freed once both the graph and the tensor let go.
struct PoolBlock {
  void *data;
  bool graph_alive = true;
  bool tensor_alive = true;
};

struct Graph {
  std::vector<std::function<void()>> tasks;
  std::vector<PoolBlock *> pool;
};

struct State {
  std::mutex mutex;
  std::atomic<int> status{static_cast<int>(Status::kNone)};
  std::string invalidated_by;         // the first refused operation of this capture
  std::unique_ptr<Graph> capturing;   // the graph being captured
  std::map<int64_t, std::unique_ptr<Graph>> graphs;
  int64_t next_id = 1;
};

inline State &state() {
  static State *s = new State;  // never destroyed: tensors may outlive static destruction
  return *s;
}

// > 0 while the CPU fallback runs an op: its own copies between host and device are part
// of that op, not reads by the caller.
inline thread_local int fallback_depth = 0;

struct FallbackScope {
  FallbackScope() { ++fallback_depth; }
  ~FallbackScope() { --fallback_depth; }
  FallbackScope(const FallbackScope &) = delete;
  FallbackScope &operator=(const FallbackScope &) = delete;
};

inline bool Capturing() { return state().status.load() != static_cast<int>(Status::kNone); }

// Work issued by the caller (not by the fallback's own copies) during a capture.
inline bool CallerWorkInCapture() { return fallback_depth == 0 && Capturing(); }

inline const char *StatusName() {
  switch (static_cast<Status>(state().status.load())) {
    case Status::kActive:
      return "npuStreamCaptureStatusActive";
    case Status::kInvalidated:
      return "npuStreamCaptureStatusInvalidated";
    default:
      return "npuStreamCaptureStatusNone";
  }
}

// Raises if a capture is under way: `attempt` cannot be captured, for `why`.
inline void RefuseInCapture(const std::string &attempt, const std::string &why) {
  if (!Capturing()) {
    return;
  }
  const std::string message =
      "fake torch_npu: " + attempt + " during NPU graph capture: " + why +
      ". On an NPU the capture fails (a capturing stream cannot be synchronised with the "
      "host). Current npuStreamCaptureStatus: " + StatusName();
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    if (state().invalidated_by.empty()) {
      state().invalidated_by = message;
    }
    state().status = static_cast<int>(Status::kInvalidated);
  }
  TORCH_CHECK(false, message);
}

inline void Record(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (state().capturing) {
    state().capturing->tasks.push_back(std::move(task));
  }
}

// ---- the graph pool ------------------------------------------------------------------

inline void PoolRelease(void *context) {
  auto *block = static_cast<PoolBlock *>(context);
  std::lock_guard<std::mutex> lock(state().mutex);
  block->tensor_alive = false;
  if (!block->graph_alive) {
    std::free(block->data);
    delete block;
  }
}

// A block of the capturing graph's pool, or nullptr when no capture is under way.
inline PoolBlock *AllocateInPool(size_t bytes) {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (!state().capturing) {
    return nullptr;
  }
  auto *block = new PoolBlock{bytes ? std::calloc(bytes, 1) : nullptr};
  state().capturing->pool.push_back(block);
  return block;
}

inline void ReleasePool(Graph &graph) {
  std::lock_guard<std::mutex> lock(state().mutex);
  for (PoolBlock *block : graph.pool) {
    block->graph_alive = false;
    if (!block->tensor_alive) {
      std::free(block->data);
      delete block;
    }
  }
  graph.pool.clear();
}

// ---- ops run by the CPU fallback -------------------------------------------------------

inline bool IsMaskIndex(const c10::IValue &index) {
  if (!index.isTensor()) {
    return false;
  }
  const auto dtype = index.toTensor().scalar_type();
  return dtype == at::kBool || dtype == at::kByte;
}

// Raises for an op that must read an npu tensor's values on the host.
inline void RefuseHostReadingOp(const c10::OperatorHandle &op, const torch::jit::Stack &stack) {
  const auto &schema = op.schema();
  const std::string name = schema.operator_name().name +
                           (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  if (op.hasTag(at::Tag::data_dependent_output)) {
    RefuseInCapture(name + " (Tensor.item(), int(), float(), bool() of an npu tensor, "
                           "torch.equal, ...)",
                    "its result is an npu tensor's value, read on the host");
  }
  // Index lists (index.Tensor, index_put_): integer indices size the output by their
  // shapes; a boolean mask by its values (a nonzero inside).
  bool index_list = false;
  const size_t first = stack.size() - schema.arguments().size();
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    if (*schema.arguments()[i].type() != *c10::ListType::ofOptionalTensors() ||
        !stack[first + i].isList()) {
      continue;
    }
    index_list = true;
    for (const c10::IValue &index : stack[first + i].toListRef()) {
      if (IsMaskIndex(index)) {
        RefuseInCapture(name + " with a boolean mask index (t[mask], t[mask] = v)",
                        "the mask's values, read on the host, size the result");
      }
    }
  }
  // repeat_interleave's output_size: the caller gives the size, nothing is read.
  bool sized = false;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    sized = sized || (schema.arguments()[i].name() == "output_size" && !stack[first + i].isNone());
  }
  if (op.hasTag(at::Tag::dynamic_output_shape) && !index_list && !sized) {
    RefuseInCapture(name, "its output size depends on an npu tensor's values, read on the host");
  }
}

// After a replay re-ran an op: its fresh outputs into the tensors the capture returned
// (the caller holds those), unless the op wrote them in place.
inline void WriteBack(const c10::IValue &captured, const c10::IValue &fresh,
                      const std::function<void(const at::Tensor &, const at::Tensor &)> &copy) {
  if (captured.isTensor() && fresh.isTensor()) {
    const at::Tensor &to = captured.toTensor();
    const at::Tensor &from = fresh.toTensor();
    if (to.defined() && from.defined() && !from.is_alias_of(to)) {
      copy(from, to);
    }
  } else if (captured.isTensorList() && fresh.isTensorList()) {
    const auto to = captured.toTensorVector();
    const auto from = fresh.toTensorVector();
    for (size_t i = 0; i < to.size() && i < from.size(); ++i) {
      WriteBack(to[i], from[i], copy);
    }
  }
}

// The fallback kernel's body under a capture: refuse host reads, run, and record the op
// (its arguments and the outputs handed back) for replay.
inline void FallbackInCapture(
    const c10::OperatorHandle &op, torch::jit::Stack *stack,
    const std::function<void(const c10::OperatorHandle &, torch::jit::Stack *)> &run,
    const std::function<void(const at::Tensor &, const at::Tensor &)> &copy) {
  RefuseHostReadingOp(op, *stack);
  const size_t arguments = op.schema().arguments().size();
  std::vector<c10::IValue> inputs(stack->end() - static_cast<std::ptrdiff_t>(arguments),
                                  stack->end());
  run(op, stack);
  const size_t returns = op.schema().returns().size();
  std::vector<c10::IValue> outputs(stack->end() - static_cast<std::ptrdiff_t>(returns),
                                   stack->end());
  Record([op, inputs, outputs, run, copy]() {
    torch::jit::Stack again(inputs.begin(), inputs.end());
    run(op, &again);
    for (size_t i = 0; i < outputs.size() && i < again.size(); ++i) {
      WriteBack(outputs[i], again[i], copy);
    }
  });
}

// ---- torch.npu.NPUGraph's C++ side -------------------------------------------------------

inline void CaptureBegin() {
  std::lock_guard<std::mutex> lock(state().mutex);
  TORCH_CHECK(!state().capturing,
              "fake torch_npu: a graph capture is already under way (one at a time per "
              "process, as torch_npu's global capture mode)");
  state().capturing = std::make_unique<Graph>();
  state().invalidated_by.clear();
  state().status = static_cast<int>(Status::kActive);
}

inline int64_t CaptureEnd() {
  std::unique_ptr<Graph> graph;
  std::string invalidated_by;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    TORCH_CHECK(state().capturing, "fake torch_npu: capture_end without capture_begin");
    graph = std::move(state().capturing);
    invalidated_by = std::move(state().invalidated_by);
    state().invalidated_by.clear();
    state().status = static_cast<int>(Status::kNone);
  }
  if (!invalidated_by.empty()) {
    ReleasePool(*graph);
    TORCH_CHECK(false, "fake torch_npu: the NPU graph capture was invalidated by: ",
                invalidated_by);
  }
  std::lock_guard<std::mutex> lock(state().mutex);
  const int64_t id = state().next_id++;
  state().graphs[id] = std::move(graph);
  return id;
}

inline Graph &Captured(int64_t id) {
  auto found = state().graphs.find(id);
  TORCH_CHECK(found != state().graphs.end(), "fake torch_npu: no captured graph ", id);
  return *found->second;
}

inline void Replay(int64_t id) {
  TORCH_CHECK(!Capturing(), "fake torch_npu: replay during a graph capture");
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    tasks = Captured(id).tasks;
  }
  for (const auto &task : tasks) {
    task();
  }
}

inline int64_t TaskCount(int64_t id) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return static_cast<int64_t>(Captured(id).tasks.size());
}

inline void Reset(int64_t id) {
  std::unique_ptr<Graph> graph;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    auto found = state().graphs.find(id);
    if (found == state().graphs.end()) {
      return;
    }
    graph = std::move(found->second);
    state().graphs.erase(found);
  }
  graph->tasks.clear();  // drops the recorded tensors first
  ReleasePool(*graph);
}

}  // namespace fake_npu

// For the fake op library (fake_cust_opapi.c), which finds these in the process (weak
// references): whether a capture is under way, and a launch to record for replay.
extern "C" __attribute__((visibility("default"))) int fake_npu_capture_status(void) {
  return fake_npu::state().status.load();
}

extern "C" __attribute__((visibility("default"))) void fake_npu_record_task(
    void (*run)(void *), void (*release)(void *), void *argument) {
  std::shared_ptr<void> owned(argument, release);
  fake_npu::Record([run, owned]() { run(owned.get()); });
}
