// The twin's runtime: core identity, local memories, the GM registry, cross-core flags,
// launching, and the queue/pipe bookkeeping.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "kernel_operator.h"
#include "twin/launch.h"

namespace twin {
namespace {

thread_local CoreState g_core;

// Launch-wide state (launches are serialised).
std::mutex g_launchMutex;
const LaunchConfig* g_launch = nullptr;
std::atomic<bool> g_abort{false};

// Cross-core flags of one AI core: AIC -> each AIV, and each AIV -> AIC.
struct FlagGroup {
    std::mutex mutex;
    std::condition_variable changed;
    int toAiv[2][16] = {};
    int toAic[2][16] = {};
};
std::vector<std::unique_ptr<FlagGroup>> g_groups;

constexpr int kMaxPendingFlag = 15;
std::chrono::milliseconds g_deadlockTimeout{30000};

FlagGroup& Group()
{
    const int64_t core = g_core.type == CoreType::AIV ? g_core.blockIdx / 2 : g_core.blockIdx;
    return *g_groups.at(static_cast<size_t>(core));
}

void RequireMix(const Site& site, const char* what)
{
    Require(g_core.mixDeclared, site, what, " needs a MIX kernel: declare "
            "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)");
}

}  // namespace

const char* MemoryName(Memory memory)
{
    switch (memory) {
        case Memory::GM: return "GM";
        case Memory::UB: return "UB";
        case Memory::L1: return "L1";
        case Memory::L0A: return "L0A";
        case Memory::L0B: return "L0B";
        case Memory::L0C: return "L0C";
    }
    return "?";
}

uint32_t MemoryBytes(Memory memory)
{
    switch (memory) {
        case Memory::UB: return 192 * 1024;
        case Memory::L1: return 512 * 1024;
        case Memory::L0A: return 64 * 1024;
        case Memory::L0B: return 64 * 1024;
        case Memory::L0C: return 128 * 1024;
        case Memory::GM: return 0;
    }
    return 0;
}

uint8_t* LocalMemories::Base(Memory memory)
{
    switch (memory) {
        case Memory::UB: return ub.data();
        case Memory::L1: return l1.data();
        case Memory::L0A: return l0a.data();
        case Memory::L0B: return l0b.data();
        case Memory::L0C: return l0c.data();
        case Memory::GM: return nullptr;
    }
    return nullptr;
}

CoreState& Core()
{
    return g_core;
}

uint64_t TilingKey()
{
    return g_launch->tilingKey;
}

void CheckGm(const void* begin, size_t bytes, const Site& site, const char* what)
{
    const auto* b = static_cast<const uint8_t*>(begin);
    for (const GmRegion& region : g_launch->gm) {
        const auto* r = static_cast<const uint8_t*>(region.begin);
        if (b >= r && b + bytes <= r + region.bytes) {
            return;
        }
    }
    Fail(site, what, ": GM access of ", bytes, " bytes at ", begin,
         " lies outside every tensor handed to the kernel");
}

void CrossCoreSet(uint16_t flag, const Site& site)
{
    RequireMix(site, "CrossCoreSetFlag");
    Require(flag < 16, site, "CrossCoreSetFlag: flag id ", flag, " outside [0, 16)");
    FlagGroup& group = Group();
    std::lock_guard<std::mutex> lock(group.mutex);
    if (g_core.type == CoreType::AIC) {
        for (auto& aiv : group.toAiv) {
            Require(aiv[flag] < kMaxPendingFlag, site, "CrossCoreSetFlag(", flag,
                    "): more than 15 sets not yet waited on");
            ++aiv[flag];
        }
    } else {
        int& pending = group.toAic[g_core.subBlockIdx][flag];
        Require(pending < kMaxPendingFlag, site, "CrossCoreSetFlag(", flag,
                "): more than 15 sets not yet waited on");
        ++pending;
    }
    group.changed.notify_all();
}

void CrossCoreWait(uint16_t flag, const Site& site)
{
    RequireMix(site, "CrossCoreWaitFlag");
    Require(flag < 16, site, "CrossCoreWaitFlag: flag id ", flag, " outside [0, 16)");
    FlagGroup& group = Group();
    std::unique_lock<std::mutex> lock(group.mutex);
    auto ready = [&] {
        if (g_core.type == CoreType::AIC) {  // mode 2: both vector cores must have set it
            return group.toAic[0][flag] > 0 && group.toAic[1][flag] > 0;
        }
        return group.toAiv[g_core.subBlockIdx][flag] > 0;
    };
    const auto deadline = std::chrono::steady_clock::now() + g_deadlockTimeout;
    while (!ready()) {
        if (g_abort) {
            throw Violation("aborted: another core failed");
        }
        if (group.changed.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() +
                                                                  std::chrono::milliseconds(50))) ==
                std::cv_status::timeout &&
            std::chrono::steady_clock::now() >= deadline) {
            Fail(site, "CrossCoreWaitFlag(", flag, "): no matching CrossCoreSetFlag arrived "
                 "(the cores would deadlock)");
        }
    }
    if (g_core.type == CoreType::AIC) {
        --group.toAic[0][flag];
        --group.toAic[1][flag];
    } else {
        --group.toAiv[g_core.subBlockIdx][flag];
    }
}

void SetDeadlockTimeout(std::chrono::milliseconds timeout)
{
    g_deadlockTimeout = timeout;
}

std::string Launch(const LaunchConfig& config, const std::function<void()>& kernel)
{
    std::lock_guard<std::mutex> launchLock(g_launchMutex);
    g_launch = &config;
    g_abort = false;
    std::mutex errorMutex;
    std::string firstError;
    auto record = [&](const std::string& message) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (firstError.empty()) {
            firstError = message;
        }
        g_abort = true;
    };
    for (uint32_t core = 0; core < config.blockDim && firstError.empty(); ++core) {
        g_groups.clear();
        g_groups.resize(config.blockDim);
        g_groups[core] = std::make_unique<FlagGroup>();
        std::vector<std::thread> threads;
        for (int role = 0; role < 3; ++role) {  // AIC, AIV0, AIV1
            threads.emplace_back([&, core, role] {
                LocalMemories memories;
                CoreState& state = g_core;
                state = CoreState{};
                state.memories = &memories;
                state.blockNum = config.blockDim;
                if (role == 0) {
                    state.type = CoreType::AIC;
                    state.blockIdx = core;
                    memories.l1.assign(MemoryBytes(Memory::L1), 0xFF);
                    memories.l0a.assign(MemoryBytes(Memory::L0A), 0xFF);
                    memories.l0b.assign(MemoryBytes(Memory::L0B), 0xFF);
                    memories.l0c.assign(MemoryBytes(Memory::L0C), 0xFF);
                } else {
                    state.type = CoreType::AIV;
                    state.subBlockIdx = role - 1;
                    state.blockIdx = 2 * int64_t{core} + state.subBlockIdx;
                    memories.ub.assign(MemoryBytes(Memory::UB), 0xFF);
                }
                try {
                    kernel();
                    if (!state.pending.empty()) {
                        record(state.pending);
                    }
                } catch (const Violation& v) {
                    if (!g_abort || std::string(v.what()).rfind("aborted", 0) != 0) {
                        record(v.what());
                    }
                } catch (const std::exception& e) {
                    record(std::string("unexpected exception: ") + e.what());
                }
            });
        }
        for (std::thread& t : threads) {
            t.join();
        }
    }
    g_groups.clear();
    g_launch = nullptr;
    return firstError;
}

}  // namespace twin

namespace AscendC {

twin::Memory PhysicalMemory(TPosition position)
{
    switch (position) {
        case TPosition::VECIN:
        case TPosition::VECOUT:
        case TPosition::VECCALC: return twin::Memory::UB;
        case TPosition::A1:
        case TPosition::B1:
        case TPosition::C1:
        case TPosition::TSCM: return twin::Memory::L1;
        case TPosition::A2: return twin::Memory::L0A;
        case TPosition::B2: return twin::Memory::L0B;
        case TPosition::CO1: return twin::Memory::L0C;
        default: return twin::Memory::GM;
    }
}

namespace twin_detail {

void RequireCore(twin::CoreType type, const twin::Site& site, const char* what)
{
    twin::Require(twin::Core().type == type, site, what, " runs on the ",
                  type == twin::CoreType::AIC ? "cube (AIC)" : "vector (AIV)",
                  " core only; guard it with ",
                  type == twin::CoreType::AIC ? "ASCEND_IS_AIC" : "ASCEND_IS_AIV");
}

void RequireMemory(twin::Memory actual, std::initializer_list<twin::Memory> allowed,
                   const twin::Site& site, const char* what)
{
    if (std::find(allowed.begin(), allowed.end(), actual) != allowed.end()) {
        return;
    }
    std::string names;
    for (twin::Memory m : allowed) {
        names += std::string(names.empty() ? "" : "/") + twin::MemoryName(m);
    }
    twin::Fail(site, what, ": a ", twin::MemoryName(actual), " tensor where ", names, " is required");
}

void RequireAligned(uint32_t byteOffset, uint32_t alignment, const twin::Site& site, const char* what)
{
    twin::Require(byteOffset % alignment == 0, site, what, ": address ", byteOffset,
                  " is not ", alignment, "-byte aligned");
}

void RequireUbScratchFree(const twin::Site& site, const char* what)
{
    const twin::Pipe* pipe = twin::Core().pipe;
    const uint32_t used = pipe ? pipe->Used(twin::Memory::UB) : 0;
    const uint32_t limit = twin::MemoryBytes(twin::Memory::UB) - twin::kUbApiScratch;
    twin::Require(used <= limit, site, what, " uses the top 8 KB of UB as scratch, but the "
                  "pipe's buffers occupy ", used, " bytes (at most ", limit, " leave it free)");
}

}  // namespace twin_detail

TPipe::TPipe()
{
    twin::Core().pipe = &pipe_;
}

TPipe::~TPipe()
{
    pipe_.CheckBalanced();
    if (twin::Core().pending.empty()) {
        twin::Core().pending = pipe_.pending;
    }
    twin::Core().pipe = nullptr;
}

}  // namespace AscendC

namespace twin {

void Pipe::Register(QueueBase& queue, AscendC::TPosition position, uint32_t count, uint32_t bytes,
                    int32_t depth, bool isQueue, const Site& site)
{
    const Memory memory = AscendC::PhysicalMemory(position);
    Require(memory != Memory::GM, site, "InitBuffer: a buffer cannot live in GM");
    Require(queue.buffers.empty(), site, "InitBuffer called twice for the same queue");
    Require(count >= 1 && count <= 64, site, "InitBuffer: ", count, " buffers (1..64 allowed)");
    Require(bytes >= 1, site, "InitBuffer: a buffer of 0 bytes");
    buffers_ += count;
    Require(buffers_ <= 64, site, "InitBuffer: a TPipe manages at most 64 buffers (now ", buffers_,
            ")");
    if (isQueue) {
        uint32_t atPosition = count;
        for (const QueueBase* q : queues_) {
            atPosition += q->isQueue && q->position == position ? q->buffers.size() : 0;
        }
        Require(atPosition <= 8, site, "InitBuffer: more than 8 queue buffers at one position (",
                atPosition, "): there are 8 hardware event ids");
    }
    const uint32_t rounded = (bytes + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
    uint32_t& used = used_[static_cast<int>(memory)];
    const uint64_t need = uint64_t{used} + uint64_t{count} * rounded;
    Require(need <= MemoryBytes(memory), site, "InitBuffer: ", MemoryName(memory),
            " over capacity: ", used, " bytes in use + ", count, " x ", rounded, " bytes = ", need,
            " > ", MemoryBytes(memory));
    queue.position = position;
    queue.bytes = rounded;
    queue.depth = depth;
    queue.isQueue = isQueue;
    queue.initSite = site;
    queue.owner = this;
    for (uint32_t i = 0; i < count; ++i) {
        queue.buffers.push_back({used + i * rounded});
    }
    used = static_cast<uint32_t>(need);
    queues_.push_back(&queue);
}

uint32_t Pipe::Used(Memory memory) const
{
    return used_[static_cast<int>(memory)];
}

namespace {

std::string Unbalanced(const QueueBase& q)
{
    static const char* kStates[] = {"free", "allocated (no FreeTensor)", "enqueued (no DeQue)",
                                    "dequeued (no FreeTensor)"};
    for (size_t i = 0; q.isQueue && i < q.buffers.size(); ++i) {
        if (q.buffers[i].state != QueueBase::State::Free) {
            std::ostringstream out;
            out << q.initSite.file << ":" << q.initSite.line
                << ": AllocTensor/EnQue/DeQue/FreeTensor unbalanced: buffer " << i
                << " of this queue is still " << kStates[static_cast<int>(q.buffers[i].state)]
                << " at the end of the kernel";
            return out.str();
        }
    }
    return "";
}

}  // namespace

void Pipe::CheckBalanced()
{
    for (const QueueBase* q : queues_) {
        if (pending.empty()) {
            pending = Unbalanced(*q);
        }
    }
}

void Pipe::Retire(QueueBase& queue)
{
    if (pending.empty()) {
        pending = Unbalanced(queue);
    }
    queues_.erase(std::remove(queues_.begin(), queues_.end(), &queue), queues_.end());
    queue.owner = nullptr;
}

QueueBase::~QueueBase()
{
    if (owner != nullptr) {
        owner->Retire(*this);
    }
}

uint8_t* QueueBase::Base() const
{
    return Core().memories->Base(AscendC::PhysicalMemory(position));
}

QueueBase::Buffer& QueueBase::Find(uint32_t offset, const Site& site, const char* what)
{
    for (Buffer& b : buffers) {
        if (b.offset == offset) {
            return b;
        }
    }
    Fail(site, what, ": the tensor is not one of this queue's buffers");
}

size_t QueueBase::Allocate(const Site& site)
{
    Require(!buffers.empty(), site, "AllocTensor before TPipe::InitBuffer");
    for (size_t tried = 0; tried < buffers.size(); ++tried) {
        const size_t i = (next + tried) % buffers.size();
        if (buffers[i].state == State::Free) {
            buffers[i].state = State::Allocated;
            next = (i + 1) % buffers.size();
            return i;
        }
    }
    Fail(site, "AllocTensor: all ", buffers.size(), " buffers of the queue initialised at ",
         initSite.file, ":", initSite.line, " are in use (a FreeTensor is missing)");
}

void QueueBase::Enqueue(uint32_t offset, const Site& site)
{
    Buffer& b = Find(offset, site, "EnQue");
    Require(b.state == State::Allocated || b.state == State::Dequeued, site,
            "EnQue of a tensor that is not allocated");
    Require(static_cast<int32_t>(fifo.size()) < depth, site, "EnQue: the queue's depth ", depth,
            " is exceeded (DeQue first)");
    b.state = State::Enqueued;
    fifo.push_back(static_cast<size_t>(&b - buffers.data()));
}

size_t QueueBase::Dequeue(const Site& site)
{
    Require(!fifo.empty(), site, "DeQue on an empty queue: no EnQue precedes it");
    const size_t i = fifo.front();
    fifo.erase(fifo.begin());
    buffers[i].state = State::Dequeued;
    return i;
}

void QueueBase::Release(uint32_t offset, const Site& site)
{
    Buffer& b = Find(offset, site, "FreeTensor");
    Require(b.state != State::Free, site, "FreeTensor of a tensor that is already free");
    Require(b.state != State::Enqueued, site, "FreeTensor of a tensor still in the queue "
            "(EnQue without DeQue)");
    b.state = State::Free;
}

}  // namespace twin
