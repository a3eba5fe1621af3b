// What differs between torch_npu versions, detected at compile time from the headers the
// extension is built against (no version macros: torch_npu has none for these).
//
// op-plugin's EXEC_NPU_CMD (Ascend/op-plugin op_plugin/utils/op_api_common.h) asks
// c10_npu::check_enqueue_need_use(stream) before stage 1 and check_dequeue_need_use(stream)
// inside the queued stage 2 whether the calling thread must first take the stream's
// resources (torch_npu's core control), and enqueues stage 2 with OpCommand::RunOpApiV2.
// torch_npu versions without them get the older equivalents: no resource step, RunOpApi.
//
// Include after the torch_npu headers (NPUStream.h, OpCommand.h): detection sees what
// has been declared so far.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

// Found by unqualified lookup together with c10_npu's functions (through the
// using-directive below, both are looked up as members of the global namespace); a
// non-template exact match, which torch_npu declares where it has them, beats these.
namespace {
struct FlashCannNpuAbsent {};
template <class... Args>
FlashCannNpuAbsent check_enqueue_need_use(Args &&...);
template <class... Args>
FlashCannNpuAbsent check_dequeue_need_use(Args &&...);
}  // namespace

namespace flash_cann_npu {
namespace compat {

using namespace c10_npu;  // NOLINT: the detection needs c10_npu's names unqualified

template <class Stream>
constexpr bool kHasStreamResourceChecks =
    !std::is_same_v<decltype(check_enqueue_need_use(std::declval<Stream>())),
                    FlashCannNpuAbsent> &&
    !std::is_same_v<decltype(check_dequeue_need_use(std::declval<Stream>())),
                    FlashCannNpuAbsent>;

enum class Stage { kEnqueue, kDequeue };

// Whether the calling thread must take `stream`'s resources before the aclnn stage that
// runs at `stage` (always false where torch_npu has no core control).
template <class Stream>
bool StreamResourcesNeeded(Stream stream, Stage stage) {
  if constexpr (kHasStreamResourceChecks<Stream>) {
    return stage == Stage::kEnqueue ? check_enqueue_need_use(stream)
                                    : check_dequeue_need_use(stream);
  } else {
    return false;
  }
}

template <class Command, class Fn, class = void>
struct HasRunOpApiV2 : std::false_type {};
template <class Command, class Fn>
struct HasRunOpApiV2<Command, Fn,
                     std::void_t<decltype(Command::RunOpApiV2(
                         std::declval<const std::string &>(), std::declval<const Fn &>()))>>
    : std::true_type {};

// Enqueues `fn` on the current stream's task queue, as op-plugin does for aclnn stage 2.
template <class Command, class Fn>
void RunOpApi(const std::string &name, const Fn &fn) {
  if constexpr (HasRunOpApiV2<Command, Fn>::value) {
    Command::RunOpApiV2(name, fn);
  } else {
    Command::RunOpApi(name, fn);
  }
}

}  // namespace compat
}  // namespace flash_cann_npu
