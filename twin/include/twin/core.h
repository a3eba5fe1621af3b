// The CPU twin of the Ascend C API: the core of it.
//
// A kernel launch runs every AI core of the plan: per AI core one cube (AIC) thread and
// two vector (AIV) threads, each with its own local memory (L1/L0A/L0B/L0C for the AIC,
// a UB for each AIV). Every API call checks the hardware rules it is subject to and
// throws twin::Violation naming the rule and the kernel's file and line (captured with
// __builtin_FILE/__builtin_LINE default arguments at the call site).
#ifndef FLASH_CANN_TWIN_CORE_H
#define FLASH_CANN_TWIN_CORE_H

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "stamp.h"

namespace twin {

// Where a kernel called the API from.
struct Site {
    const char* file;
    int line;
};
#define TWIN_SITE ::twin::Site file_and_line = {__builtin_FILE(), __builtin_LINE()}
#define TWIN_HERE file_and_line

class Violation : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

template <typename... Parts>
[[noreturn]] void Fail(const Site& site, const Parts&... parts)
{
    std::ostringstream out;
    out << site.file << ":" << site.line << ": ";
    (out << ... << parts);
    throw Violation(out.str());
}

template <typename... Parts>
void Require(bool condition, const Site& site, const Parts&... parts)
{
    if (!condition) {
        Fail(site, parts...);
    }
}

// Physical local memories and their sizes on Ascend 910B (NPU arch 2201).
enum class Memory : uint8_t { GM, UB, L1, L0A, L0B, L0C };
const char* MemoryName(Memory memory);
uint32_t MemoryBytes(Memory memory);
constexpr uint32_t kUbApiScratch = 8 * 1024;  // Select/Compares scratch at the top of UB
constexpr uint32_t kBlockBytes = 32;
constexpr uint32_t kRepeatBytes = 256;
constexpr uint32_t kFractalBytes = 512;
constexpr uint32_t kMaxRepeat = 255;

enum class CoreType : int32_t { MIX = 0, AIC = 1, AIV = 2 };

// One core's local memories (zero-filled so that reads of unwritten memory are at least
// deterministic; the kernel must not rely on them: the checks below do not model that).
struct LocalMemories {
    std::vector<uint8_t> ub, l1, l0a, l0b, l0c;
    uint8_t* Base(Memory memory);
    std::vector<uint8_t>& Bytes(Memory memory);
};

class Pipe;

// Who set an intra-core flag or holds an id of TPipe's event pool: the kernel itself
// (SetFlag, AllocEventID), a queue (EnQue, FreeTensor; `owner` is where the queue was
// initialised), or TPipe (on the dav-c220 cube core its constructor holds and sets
// M_MTE1 ids 0-2 for the matmul macro until it is destroyed).
struct EventOwner {
    enum Kind : uint8_t { kNone, kKernel, kQueue, kTPipe } kind = kNone;
    Site site{"", 0};
    Site owner{"", 0};
};

// The identity and state of the core a thread is running.
struct CoreState {
    CoreType type = CoreType::MIX;
    int64_t blockIdx = 0;      // AIC: AI core index; AIV: 2 * AI core + sub-block
    int64_t blockNum = 1;
    int64_t subBlockIdx = 0;
    LocalMemories* memories = nullptr;
    Pipe* pipe = nullptr;
    bool mixDeclared = false;  // KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2) ran
    // Intra-core events: outstanding SetFlag count per (HardEvent, event id), and the
    // work each outstanding SetFlag releases (race detector).
    int events[64][8] = {};
    Clock eventWork[64][8];
    // Who set each outstanding flag (for the collision messages).
    EventOwner eventSetter[64][8];
    // TPipe's event-id pool (asc-devkit kernel_tpipe_impl.h, AllocEventID: per HardEvent,
    // the lowest id not held): the ids held per HardEvent (bit i: id i), who holds each,
    // and the ids FetchEventID has answered (they are the kernel's to use, unheld).
    uint8_t eventPool[64] = {};
    EventOwner eventHolder[64][8];
    uint8_t eventFetched[64] = {};
    // A violation found when the kernel's TPipe was torn down.
    std::string pending;
    // The most bytes the kernel's TPipe(s) held at once per memory (every InitBuffer).
    uint64_t peakBytes[6] = {};
    // SetAtomicAdd<float>() is in force: copies to GM add instead of storing.
    bool atomicAddFloat = false;
    // SetSaturationFlag<SaturationMode::INT> (CTRL bit 53): -1 never set (its reset value
    // is not documented), 0 integer results wrap (truncation), 1 they saturate.
    int8_t intSaturation = -1;
    Site intSaturationSite{"", 0};  // where the kernel last set it
};

// CTRL bit 53 as the twin's kernels find it (GetSaturationFlag<INT> before any set): the
// hardware's reset value is not documented, so the twin picks saturation, the opposite of
// the truncation the dropout generator needs; a kernel must leave the bit as it found it
// (rule R99), since the CTRL register outlives the kernel on its core.
constexpr int8_t kIntSaturationAtEntry = 1;

CoreState& Core();
uint64_t TilingKey();

// GM: the tensors handed to the kernel. Every GM access must lie inside one of them.
void CheckGm(const void* begin, size_t bytes, const Site& site, const char* what);

// Cross-core flags (mode 2: an AIC and the two AIVs of its AI core).
void CrossCoreSet(uint16_t flag, int pipe, const Site& site);
void CrossCoreWait(uint16_t flag, const Site& site);
// Intra-core events (SetFlag/WaitFlag) and PipeBarrier, with their race-detector edges.
void SetEvent(int event, int srcPipe, int32_t id, const Site& site);
void WaitEvent(int event, int dstPipe, int32_t id, const Site& site);
void PipeBarrierAt(int pipe, const Site& site);
// TPipe's event-id pool. PoolAlloc: the lowest id of `event` nobody holds, now held by
// `holder` (AllocEventID, a queue's EnQue/FreeTensor); PoolRelease gives it back.
// PoolFetch: the lowest free id, not held (FetchEventID).
int PoolAlloc(int event, const EventOwner& holder, const Site& site);
void PoolRelease(int event, int id, bool byKernel, const Site& site);
int PoolFetch(int event, const Site& site);
// The flags TPipe's queues and TPipe itself set and wait on with the ids they hold (no
// race-detector edge: the queues give theirs through their buffers' clocks).
void FrameworkSet(int event, int id, const EventOwner& setter, const Site& site);
void FrameworkWait(int event, int id);
const char* EventName(int event);
// The hardware SyncAll: a barrier over every AIC and AIV of the launch (aivOnly: over
// the AIVs only).
void SyncAllCores(bool aivOnly, const Site& site);

// GM stores under SetAtomicAdd<float>: *to += value, atomically w.r.t. other cores.
void AtomicAddFloat(float* to, float value);

}  // namespace twin

#endif
