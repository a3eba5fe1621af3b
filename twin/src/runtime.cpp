// The twin's runtime: local memories and the queue/pipe bookkeeping (launching, core
// identity and cross-core synchronisation are in launch.cpp).
#include <algorithm>

#include "kernel_operator.h"

namespace twin {

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
    twin::Require(twin::Core().type == type, site, "[R40] ", what, " runs on the ",
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
    twin::Fail(site, "[R41] ", what, ": a ", twin::MemoryName(actual), " tensor where ", names, " is required");
}

void RequireAligned(uint32_t byteOffset, uint32_t alignment, const twin::Site& site, const char* what)
{
    twin::Require(byteOffset % alignment == 0, site, "[R42] ", what, ": address ", byteOffset,
                  " is not ", alignment, "-byte aligned");
}

void RequireUbScratchFree(const twin::Site& site, const char* what)
{
    const twin::Pipe* pipe = twin::Core().pipe;
    const uint32_t used = pipe ? pipe->Used(twin::Memory::UB) : 0;
    const uint32_t limit = twin::MemoryBytes(twin::Memory::UB) - twin::kUbApiScratch;
    twin::Require(used <= limit, site, "[R43] ", what, " uses the top 8 KB of UB as scratch, but the "
                  "pipe's buffers occupy ", used, " bytes (at most ", limit, " leave it free)");
}

}  // namespace twin_detail

TPipe::TPipe(twin::Site file_and_line)
{
    twin::Core().pipe = &pipe_;
    pipe_.Open(TWIN_HERE);
}

TPipe::~TPipe()
{
    pipe_.CheckBalanced();
    pipe_.Close();
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
    Require(memory != Memory::GM, site, "[R44] ", "InitBuffer: a buffer cannot live in GM");
    Require(queue.buffers.empty(), site, "[R45] ", "InitBuffer called twice for the same queue");
    Require(count >= 1 && count <= 64, site, "[R46] ", "InitBuffer: ", count, " buffers (1..64 allowed)");
    Require(bytes >= 1, site, "[R47] ", "InitBuffer: a buffer of 0 bytes");
    buffers_ += count;
    Require(buffers_ <= 64, site, "[R48] ", "InitBuffer: a TPipe manages at most 64 buffers (now ", buffers_,
            ")");
    if (isQueue) {
        uint32_t atPosition = count;
        for (const QueueBase* q : queues_) {
            atPosition += q->isQueue && q->position == position ? q->buffers.size() : 0;
        }
        Require(atPosition <= 8, site, "[R49] ", "InitBuffer: more than 8 queue buffers at one position (",
                atPosition, "): there are 8 hardware event ids");
    }
    const uint32_t rounded = (bytes + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
    uint32_t& used = used_[static_cast<int>(memory)];
    const uint64_t need = uint64_t{used} + uint64_t{count} * rounded;
    Require(need <= MemoryBytes(memory), site, "[R50] ", "InitBuffer: ", MemoryName(memory),
            " over capacity: ", used, " bytes in use + ", count, " x ", rounded, " bytes = ", need,
            " > ", MemoryBytes(memory));
    queue.position = position;
    queue.bytes = rounded;
    queue.depth = depth;
    queue.isQueue = isQueue;
    queue.initSite = site;
    queue.owner = this;
    for (uint32_t i = 0; i < count; ++i) {
        queue.buffers.push_back({used + i * rounded, QueueBase::State::Free, {}, {}});
    }
    used = static_cast<uint32_t>(need);
    uint64_t& peak = Core().peakBytes[static_cast<int>(memory)];
    peak = std::max<uint64_t>(peak, used);
    queues_.push_back(&queue);
}

namespace {

constexpr int kMatmulMacroIds = 3;  // M_MTE1 ids 0-2 (TPipe::Init on 2201: two for L0, one for the bias)

}  // namespace

void Pipe::Open(const Site& site)
{
    // TPipe::Init (ResetPool): no id is held. Flags a previous pipe left set stay set.
    CoreState& core = Core();
    std::fill(std::begin(core.eventPool), std::end(core.eventPool), uint8_t{0});
    std::fill(std::begin(core.eventFetched), std::end(core.eventFetched), uint8_t{0});
    for (auto& ids : core.eventHolder) {
        std::fill(std::begin(ids), std::end(ids), EventOwner{});
    }
    open_ = true;
    if (core.type != CoreType::AIC) {
        return;
    }
    const int event = static_cast<int>(AscendC::HardEvent::M_MTE1);
    const EventOwner pipe{EventOwner::kTPipe, site, site};
    for (int i = 0; i < kMatmulMacroIds; ++i) {
        FrameworkSet(event, PoolAlloc(event, pipe, site), pipe, site);
    }
}

void Pipe::Close()
{
    if (!open_) {
        return;
    }
    open_ = false;
    for (QueueBase* q : queues_) {
        q->ReleaseEvents();
    }
    if (Core().type != CoreType::AIC) {
        return;
    }
    const int event = static_cast<int>(AscendC::HardEvent::M_MTE1);
    for (int i = 0; i < kMatmulMacroIds; ++i) {
        if (Core().eventHolder[event][i].kind == EventOwner::kTPipe) {
            FrameworkWait(event, i);
            PoolRelease(event, i, false, {"", 0});
        }
    }
}

uint32_t Pipe::Used(Memory memory) const
{
    return used_[static_cast<int>(memory)];
}

std::string Pipe::Owner(Memory memory, uint32_t offset) const
{
    for (const QueueBase* q : queues_) {
        if (AscendC::PhysicalMemory(q->position) != memory) {
            continue;
        }
        for (const QueueBase::Buffer& b : q->buffers) {
            if (offset >= b.offset && offset < b.offset + q->bytes) {
                return " (the buffer initialised at " + std::string(q->initSite.file) + ":" +
                       std::to_string(q->initSite.line) + ")";
            }
        }
    }
    return "";
}

namespace {

// The pipes of a queue position's hand-off events (asc-devkit impl/basic_api/
// kernel_event.h, GetQueEvt on 2201): EnQue -> DeQue from the producer to the consumer,
// FreeTensor -> AllocTensor back. VECCALC/TBuf has none.
struct HandOff {
    int producer, consumer;
};

// The HardEvents of a queue position's hand-offs (asc-devkit kernel_tpipe.h, enQueEvt and
// freeBufEvt = GetQueEvt(src, dst, fwd) of TQue<pos>'s TQueBind<GetBufferLogicPos(pos)>
// on 2201); -1: none.
struct HandOffEvents {
    int enqueue, free;
};

HandOffEvents HandOffEventsOf(AscendC::TPosition position)
{
    using AscendC::HardEvent;
    using AscendC::TPosition;
    auto ev = [](HardEvent e) { return static_cast<int>(e); };
    switch (position) {
        case TPosition::A1:
        case TPosition::B1: return {ev(HardEvent::MTE2_MTE1), ev(HardEvent::MTE1_MTE2)};
        case TPosition::A2:
        case TPosition::B2: return {ev(HardEvent::MTE1_M), ev(HardEvent::M_MTE1)};
        case TPosition::CO1: return {ev(HardEvent::M_FIX), ev(HardEvent::FIX_M)};
        case TPosition::VECIN: return {ev(HardEvent::MTE2_V), ev(HardEvent::V_MTE2)};
        case TPosition::VECOUT: return {ev(HardEvent::V_MTE3), ev(HardEvent::MTE3_V)};
        default: return {-1, -1};
    }
}

HandOff HandOffPipes(AscendC::TPosition position)
{
    using AscendC::TPosition;
    switch (position) {
        case TPosition::A1:
        case TPosition::B1: return {kPipeMte2, kPipeMte1};  // GM -> L1: MTE2_MTE1
        case TPosition::A2:
        case TPosition::B2: return {kPipeMte1, kPipeM};     // L1 -> L0A/L0B: MTE1_M
        case TPosition::CO1: return {kPipeM, kPipeFix};     // L0C -> GM: M_FIX
        case TPosition::VECIN: return {kPipeMte2, kPipeV};  // GM -> UB: MTE2_V
        case TPosition::VECOUT: return {kPipeV, kPipeMte3}; // UB -> GM: V_MTE3
        default: return {-1, -1};
    }
}

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
    if (open_) {
        queue.ReleaseEvents();
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
    Fail(site, "[R51] ", what, ": the tensor is not one of this queue's buffers");
}

size_t QueueBase::Allocate(const Site& site)
{
    Require(!buffers.empty(), site, "[R52] ", "AllocTensor before TPipe::InitBuffer");
    for (size_t tried = 0; tried < buffers.size(); ++tried) {
        const size_t i = (next + tried) % buffers.size();
        if (buffers[i].state == State::Free) {
            buffers[i].state = State::Allocated;
            next = (i + 1) % buffers.size();
            if (buffers[i].freeEventId >= 0) {  // AllocBuffer: WaitFlag, ReleaseEventID
                const int event = HandOffEventsOf(position).free;
                FrameworkWait(event, buffers[i].freeEventId);
                PoolRelease(event, buffers[i].freeEventId, false, site);
                buffers[i].freeEventId = -1;
            }
            const HandOff pipes = HandOffPipes(position);
            if (pipes.producer >= 0 && SyncEdge("AllocTensor", site, &initSite)) {
                Acquire(pipes.producer, buffers[i].freed);
            }
            return i;
        }
    }
    Fail(site, "[R53] ", "AllocTensor: all ", buffers.size(), " buffers of the queue initialised at ",
         initSite.file, ":", initSite.line, " are in use (a FreeTensor is missing)");
}

void QueueBase::Enqueue(uint32_t offset, const Site& site)
{
    Buffer& b = Find(offset, site, "EnQue");
    Require(b.state == State::Allocated || b.state == State::Dequeued, site, "[R54] ",
            "EnQue of a tensor that is not allocated");
    Require(static_cast<int32_t>(fifo.size()) < depth, site, "[R55] ", "EnQue: the queue's depth ", depth,
            " is exceeded (DeQue first)");
    b.state = State::Enqueued;
    fifo.push_back(static_cast<size_t>(&b - buffers.data()));
    const int event = HandOffEventsOf(position).enqueue;
    if (event >= 0) {  // EnQue: AllocEventID, SetFlag
        const EventOwner self{EventOwner::kQueue, site, initSite};
        b.enqueueEventId = PoolAlloc(event, self, site);
        FrameworkSet(event, b.enqueueEventId, self, site);
    }
    const HandOff pipes = HandOffPipes(position);
    if (pipes.producer >= 0) {
        b.handedOver = SyncEdge("EnQue", site, &initSite) ? Completed(pipes.producer) : Clock{};
    }
}

size_t QueueBase::Dequeue(const Site& site)
{
    Require(!fifo.empty(), site, "[R56] ", "DeQue on an empty queue: no EnQue precedes it");
    const size_t i = fifo.front();
    fifo.erase(fifo.begin());
    buffers[i].state = State::Dequeued;
    if (buffers[i].enqueueEventId >= 0) {  // DeQue: WaitFlag, ReleaseEventID
        const int event = HandOffEventsOf(position).enqueue;
        FrameworkWait(event, buffers[i].enqueueEventId);
        PoolRelease(event, buffers[i].enqueueEventId, false, site);
        buffers[i].enqueueEventId = -1;
    }
    const HandOff pipes = HandOffPipes(position);
    if (pipes.producer >= 0 && SyncEdge("DeQue", site, &initSite)) {
        Acquire(pipes.consumer, buffers[i].handedOver);
    }
    return i;
}

void QueueBase::Release(uint32_t offset, const Site& site)
{
    Buffer& b = Find(offset, site, "FreeTensor");
    Require(b.state != State::Free, site, "[R57] ", "FreeTensor of a tensor that is already free");
    Require(b.state != State::Enqueued, site, "[R58] ", "FreeTensor of a tensor still in the queue "
            "(EnQue without DeQue)");
    b.state = State::Free;
    const int event = HandOffEventsOf(position).free;
    if (event >= 0) {  // FreeBuffer: AllocEventID, SetFlag
        const EventOwner self{EventOwner::kQueue, site, initSite};
        b.freeEventId = PoolAlloc(event, self, site);
        FrameworkSet(event, b.freeEventId, self, site);
    }
    const HandOff pipes = HandOffPipes(position);
    if (pipes.producer >= 0) {
        b.freed = SyncEdge("FreeTensor", site, &initSite) ? Completed(pipes.consumer) : Clock{};
    }
}

void QueueBase::ReleaseEvents()
{
    const HandOffEvents events = HandOffEventsOf(position);
    for (Buffer& b : buffers) {
        if (b.freeEventId >= 0) {
            FrameworkWait(events.free, b.freeEventId);
            PoolRelease(events.free, b.freeEventId, false, {"", 0});
            b.freeEventId = -1;
        }
        if (b.enqueueEventId >= 0) {
            FrameworkWait(events.enqueue, b.enqueueEventId);
            PoolRelease(events.enqueue, b.enqueueEventId, false, {"", 0});
            b.enqueueEventId = -1;
        }
    }
}

}  // namespace twin
