// Synchronisation in the twin. Each core's instruction stream runs in program order on one
// thread, so pipes never race here (the twin cannot find missing intra-core barriers);
// what it checks is the bookkeeping: every WaitFlag needs an outstanding SetFlag of the
// same event and id, an event is not set twice before it is waited on, cross-core flags
// really synchronise the cube and vector threads of an AI core, and SyncAll those of
// every AI core of the launch.
#ifndef FLASH_CANN_TWIN_SYNC_H
#define FLASH_CANN_TWIN_SYNC_H

#include "core.h"

enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX };
enum event_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6,
               EVENT_ID7 };

namespace AscendC {

enum class HardEvent : uint8_t {
    MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V,
    MTE3_MTE1, MTE1_MTE3, MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3,
    S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S, MTE2_FIX, FIX_MTE2, FIX_S, M_S, FIX_MTE3,
    MTE1_FIX, FIX_MTE1, FIX_FIX, MAX
};

template <HardEvent event>
void SetFlag(int32_t eventID, TWIN_SITE)
{
    twin::Require(eventID >= 0 && eventID < 8, TWIN_HERE, "SetFlag: event id ", eventID,
                  " outside [0, 8)");
    int& pending = twin::Core().events[static_cast<int>(event)][eventID];
    twin::Require(pending == 0, TWIN_HERE, "SetFlag on event ", static_cast<int>(event), " id ",
                  eventID, " which is already set and not yet waited on");
    pending = 1;
}

template <HardEvent event>
void WaitFlag(int32_t eventID, TWIN_SITE)
{
    twin::Require(eventID >= 0 && eventID < 8, TWIN_HERE, "WaitFlag: event id ", eventID,
                  " outside [0, 8)");
    int& pending = twin::Core().events[static_cast<int>(event)][eventID];
    twin::Require(pending == 1, TWIN_HERE, "WaitFlag on event ", static_cast<int>(event), " id ",
                  eventID, " with no matching SetFlag: the pipe would wait forever");
    pending = 0;
}

template <pipe_t pipe>
void PipeBarrier()
{
}

template <uint8_t modeId, pipe_t pipe>
void CrossCoreSetFlag(uint16_t flagId, TWIN_SITE)
{
    static_assert(modeId == 2, "the twin implements mode 2 (an AIC and the AIVs of its AI core)");
    static_assert(pipe != PIPE_S && pipe != PIPE_ALL, "CrossCoreSetFlag takes a data pipe");
    twin::CrossCoreSet(flagId, TWIN_HERE);
}

template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
void CrossCoreWaitFlag(uint16_t flagId, TWIN_SITE)
{
    twin::CrossCoreWait(flagId, TWIN_HERE);
}

// The hardware all-core barrier (asc-devkit docs, SyncAll, "hard sync"): isAIVOnly = true
// synchronises the vector cores only; a MIX kernel synchronises every AIC and AIV of the
// launch with SyncAll<false>().
template <bool isAIVOnly = true>
void SyncAll(TWIN_SITE)
{
    twin::SyncAllCores(isAIVOnly, TWIN_HERE);
}

}  // namespace AscendC

#endif
