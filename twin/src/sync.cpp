// Intra-core synchronisation: SetFlag/WaitFlag bookkeeping and PipeBarrier, with the
// happens-before edges they give the race detector, and TPipe's event-id pool.
//
// The pool (asc-devkit impl/basic_api/kernel_tpipe_impl.h, TPipe::AllocEventID /
// FetchEventID / ReleaseEventID): per HardEvent, ids 0-7; AllocEventID takes the lowest
// id nobody holds, FetchEventID names it without taking it. A queue takes its ids there
// (kernel_tquebind_impl.h: EnQue takes one and sets it, DeQue waits and gives it back;
// FreeTensor takes one and sets it, the buffer's next AllocTensor waits and gives it
// back), and on the dav-c220 cube core TPipe's constructor takes M_MTE1 ids 0-2 and sets
// them until it is destroyed. The SetFlag/WaitFlag docs: next to TPipe/TQue a kernel's
// ids must come from AllocEventID/FetchEventID; hand-managed ids are 0-5, 6 is reserved
// and 7 belongs to the automatic sync; a second SetFlag of a set id before its WaitFlag
// is undefined behaviour (a hang). So the twin reports a kernel flag on an id the pool
// holds for a queue or for TPipe (R65; a WaitFlag there, which would take the queue's
// flag: R69), a queue's flag on an id the kernel has set (R66), a hand-picked id 6 or 7
// (R64), a set id set again (R60), more than 8 ids of one HardEvent held at once (R67),
// and a ReleaseEventID of an id AllocEventID did not hand out (R68).
#include "kernel_operator.h"
#include "twin/race.h"

namespace twin {

namespace {

constexpr const char* kEventNames[] = {
    "MTE2_MTE1", "MTE1_MTE2", "MTE1_M", "M_MTE1", "MTE2_V", "V_MTE2", "MTE3_V", "V_MTE3", "M_V", "V_M",
    "V_V", "MTE3_MTE1", "MTE1_MTE3", "MTE1_V", "MTE2_M", "M_MTE2", "V_MTE1", "M_FIX", "FIX_M",
    "MTE3_MTE2", "MTE2_MTE3", "S_V", "V_S", "S_MTE2", "MTE2_S", "S_MTE3", "MTE3_S", "MTE2_FIX",
    "FIX_MTE2", "FIX_S", "M_S", "FIX_MTE3", "MTE1_FIX", "FIX_MTE1", "FIX_FIX"};
static_assert(sizeof(kEventNames) / sizeof(kEventNames[0]) == static_cast<size_t>(AscendC::HardEvent::MAX),
              "one name per HardEvent");

constexpr int kEventIds = 8;        // QUE_MAX_EVENT on 2201
constexpr int kFirstReservedId = 6; // 6: reserved, 7: the automatic sync (SetFlag/WaitFlag docs)

std::string Where(const Site& site)
{
    return std::string(site.file) + ":" + std::to_string(site.line);
}

// "the queue initialised at f:l (its FreeTensor at f:l)" and the like.
std::string Describe(const EventOwner& who)
{
    switch (who.kind) {
        case EventOwner::kKernel: return "the kernel (" + Where(who.site) + ")";
        case EventOwner::kQueue:
            return "the queue initialised at " + Where(who.owner) + " (its call at " + Where(who.site) + ")";
        case EventOwner::kTPipe:
            return "TPipe (its constructor holds and sets M_MTE1 ids 0-2 on the cube core for the matmul "
                   "macro; TPipe at " + Where(who.site) + ")";
        case EventOwner::kNone: break;
    }
    return "nobody";
}

bool HeldByFramework(int event, int32_t id)
{
    const EventOwner::Kind kind = Core().eventHolder[event][id].kind;
    return (Core().eventPool[event] >> id & 1) && (kind == EventOwner::kQueue || kind == EventOwner::kTPipe);
}

// The pool has handed `id` of `event` to the kernel (AllocEventID, FetchEventID).
bool HandedToKernel(int event, int32_t id)
{
    const CoreState& core = Core();
    const bool allocated = (core.eventPool[event] >> id & 1) && core.eventHolder[event][id].kind == EventOwner::kKernel;
    return allocated || (core.eventFetched[event] >> id & 1);
}

}  // namespace

const char* EventName(int event)
{
    return event >= 0 && event < static_cast<int>(AscendC::HardEvent::MAX) ? kEventNames[event] : "?";
}

void SetEvent(int event, int srcPipe, int32_t id, const Site& site)
{
    Require(id >= 0 && id < kEventIds, site, "[R59] ", "SetFlag: event id ", id, " outside [0, 8)");
    Require(!HeldByFramework(event, id), site, "[R65] ", "SetFlag<", EventName(event), ">(", id,
            "): TPipe's event pool holds this id for ", Describe(Core().eventHolder[event][id]),
            ", whose flag is set and not yet waited on; ids used beside TPipe/TQue must come from "
            "TPipe::AllocEventID/FetchEventID");
    Require(id < kFirstReservedId || HandedToKernel(event, id), site, "[R64] ", "SetFlag<", EventName(event),
            ">(", id, "): event ids 6 and 7 are reserved (SetFlag/WaitFlag docs: a kernel's own ids are "
            "0-5, 6 is reserved, 7 is the automatic sync's); take ids from TPipe::AllocEventID/FetchEventID");
    int& pending = Core().events[event][id];
    Require(pending == 0, site, "[R60] ", "SetFlag on event ", EventName(event), " id ", id,
            " which is already set and not yet waited on (by ", Describe(Core().eventSetter[event][id]),
            "): undefined behaviour, documented to hang");
    pending = 1;
    Core().eventSetter[event][id] = {EventOwner::kKernel, site, site};
    Core().eventWork[event][id] = SyncEdge("SetFlag", site) ? Completed(srcPipe) : Clock{};
}

void WaitEvent(int event, int dstPipe, int32_t id, const Site& site)
{
    Require(id >= 0 && id < kEventIds, site, "[R61] ", "WaitFlag: event id ", id, " outside [0, 8)");
    Require(!HeldByFramework(event, id), site, "[R69] ", "WaitFlag<", EventName(event), ">(", id,
            "): TPipe's event pool holds this id for ", Describe(Core().eventHolder[event][id]),
            ", which waits on it itself; ids used beside TPipe/TQue must come from "
            "TPipe::AllocEventID/FetchEventID");
    int& pending = Core().events[event][id];
    Require(pending == 1, site, "[R62] ", "WaitFlag on event ", EventName(event), " id ", id,
            " with no matching SetFlag: the pipe would wait forever");
    pending = 0;
    Core().eventSetter[event][id] = {};
    if (!SyncEdge("WaitFlag", site)) {
        return;
    }
    // A wait on the scalar pipe stalls the issue of everything after it.
    if (dstPipe == kPipeS) {
        AcquireAll(Core().eventWork[event][id]);
    } else {
        Acquire(dstPipe, Core().eventWork[event][id]);
    }
}

void PipeBarrierAt(int pipe, const Site& site)
{
    Require(pipe != kPipeS, site, "[R63] ", "PipeBarrier<PIPE_S> is a hardware error: the scalar pipe is "
            "ordered by hardware");
    if (SyncEdge("PipeBarrier", site)) {
        Barrier(pipe);
    }
}

namespace {

int LowestFree(int event, const Site& site, const char* what)
{
    const uint8_t held = Core().eventPool[event];
    for (int id = 0; id < kEventIds; ++id) {
        if (!(held >> id & 1)) {
            return id;
        }
    }
    std::string holders;
    for (int id = 0; id < kEventIds; ++id) {
        holders += "\n  id " + std::to_string(id) + ": " + Describe(Core().eventHolder[event][id]);
    }
    Fail(site, "[R67] ", what, ": all 8 ids of HardEvent ", EventName(event),
         " are held (TPipe's pool has one per pending queue hand-off and AllocEventID):", holders);
}

}  // namespace

int PoolAlloc(int event, const EventOwner& holder, const Site& site)
{
    const int id = LowestFree(event, site, holder.kind == EventOwner::kKernel ? "AllocEventID" :
                              holder.kind == EventOwner::kQueue ? "a queue's EnQue/FreeTensor" : "TPipe");
    Core().eventPool[event] |= static_cast<uint8_t>(1u << id);
    Core().eventFetched[event] &= static_cast<uint8_t>(~(1u << id));
    Core().eventHolder[event][id] = holder;
    return id;
}

void PoolRelease(int event, int id, bool byKernel, const Site& site)
{
    if (byKernel) {
        Require(id >= 0 && id < kEventIds && (Core().eventPool[event] >> id & 1) &&
                    Core().eventHolder[event][id].kind == EventOwner::kKernel,
                site, "[R68] ", "ReleaseEventID<", EventName(event), ">(", id,
                "): the id was not taken with AllocEventID (it is held by ",
                id >= 0 && id < kEventIds ? Describe(Core().eventHolder[event][id]) : std::string("nobody"), ")");
    }
    Core().eventPool[event] &= static_cast<uint8_t>(~(1u << id));
    Core().eventHolder[event][id] = {};
}

int PoolFetch(int event, const Site& site)
{
    const int id = LowestFree(event, site, "FetchEventID");
    Core().eventFetched[event] |= static_cast<uint8_t>(1u << id);
    return id;
}

void FrameworkSet(int event, int id, const EventOwner& setter, const Site& site)
{
    int& pending = Core().events[event][id];
    Require(pending == 0, site, "[R66] ", Describe(setter), " sets ", EventName(event), " id ", id,
            " from TPipe's event pool, but ", Describe(Core().eventSetter[event][id]),
            " set that id and has not waited on it: a second SetFlag before the WaitFlag is undefined "
            "behaviour (documented to hang); take the kernel's ids from TPipe::AllocEventID/FetchEventID");
    pending = 1;
    Core().eventSetter[event][id] = setter;
}

void FrameworkWait(int event, int id)
{
    Core().events[event][id] = 0;
    Core().eventSetter[event][id] = {};
}

}  // namespace twin
