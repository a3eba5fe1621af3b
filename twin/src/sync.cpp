// Intra-core synchronisation: SetFlag/WaitFlag bookkeeping and PipeBarrier, with the
// happens-before edges they give the race detector.
#include "kernel_operator.h"
#include "twin/race.h"

namespace twin {

void SetEvent(int event, int srcPipe, int32_t id, const Site& site)
{
    Require(id >= 0 && id < 8, site, "[R59] ", "SetFlag: event id ", id, " outside [0, 8)");
    int& pending = Core().events[event][id];
    Require(pending == 0, site, "[R60] ", "SetFlag on event ", event, " id ", id,
            " which is already set and not yet waited on");
    pending = 1;
    Core().eventWork[event][id] = SyncEdge("SetFlag", site) ? Completed(srcPipe) : Clock{};
}

void WaitEvent(int event, int dstPipe, int32_t id, const Site& site)
{
    Require(id >= 0 && id < 8, site, "[R61] ", "WaitFlag: event id ", id, " outside [0, 8)");
    int& pending = Core().events[event][id];
    Require(pending == 1, site, "[R62] ", "WaitFlag on event ", event, " id ", id,
            " with no matching SetFlag: the pipe would wait forever");
    pending = 0;
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

}  // namespace twin
