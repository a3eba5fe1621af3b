// Synchronisation in the twin: the bookkeeping (every WaitFlag needs an outstanding
// SetFlag of the same event and id, an event is not set twice before it is waited on,
// the kernel's ids neither collide with the ids TPipe's event pool has handed to its
// queues nor use the reserved ids 6 and 7, cross-core flags really synchronise the cube
// and vector threads of an AI core, SyncAll those of every AI core of the launch) and the
// happens-before edges each call gives the race detector (twin/race.h).
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

namespace twin_detail {

// The source and destination pipes of a HardEvent (asc-devkit impl/basic_api/
// kernel_event.h, SetFlagImpl: e.g. MTE2_V sets from PIPE_MTE2 for PIPE_V).
constexpr pipe_t kEventPipes[][2] = {
    {PIPE_MTE2, PIPE_MTE1}, {PIPE_MTE1, PIPE_MTE2}, {PIPE_MTE1, PIPE_M}, {PIPE_M, PIPE_MTE1},
    {PIPE_MTE2, PIPE_V}, {PIPE_V, PIPE_MTE2}, {PIPE_MTE3, PIPE_V}, {PIPE_V, PIPE_MTE3},
    {PIPE_M, PIPE_V}, {PIPE_V, PIPE_M}, {PIPE_V, PIPE_V}, {PIPE_MTE3, PIPE_MTE1},
    {PIPE_MTE1, PIPE_MTE3}, {PIPE_MTE1, PIPE_V}, {PIPE_MTE2, PIPE_M}, {PIPE_M, PIPE_MTE2},
    {PIPE_V, PIPE_MTE1}, {PIPE_M, PIPE_FIX}, {PIPE_FIX, PIPE_M}, {PIPE_MTE3, PIPE_MTE2},
    {PIPE_MTE2, PIPE_MTE3}, {PIPE_S, PIPE_V}, {PIPE_V, PIPE_S}, {PIPE_S, PIPE_MTE2},
    {PIPE_MTE2, PIPE_S}, {PIPE_S, PIPE_MTE3}, {PIPE_MTE3, PIPE_S}, {PIPE_MTE2, PIPE_FIX},
    {PIPE_FIX, PIPE_MTE2}, {PIPE_FIX, PIPE_S}, {PIPE_M, PIPE_S}, {PIPE_FIX, PIPE_MTE3},
    {PIPE_MTE1, PIPE_FIX}, {PIPE_FIX, PIPE_MTE1}, {PIPE_FIX, PIPE_FIX}};
static_assert(sizeof(kEventPipes) / sizeof(kEventPipes[0]) == static_cast<size_t>(HardEvent::MAX),
              "one pipe pair per HardEvent");

}  // namespace twin_detail

// An event id as TPipe's pool hands it out (asc-devkit kernel_tensor_base.h).
using TEventID = int8_t;

// SetFlag: the source pipe's work so far, once finished, releases the event; WaitFlag:
// the destination pipe's later instructions wait for it.
template <HardEvent event>
void SetFlag(int32_t eventID, TWIN_SITE)
{
    constexpr auto pipes = twin_detail::kEventPipes[static_cast<int>(event)];
    twin::SetEvent(static_cast<int>(event), pipes[0], eventID, TWIN_HERE);
}

template <HardEvent event>
void WaitFlag(int32_t eventID, TWIN_SITE)
{
    constexpr auto pipes = twin_detail::kEventPipes[static_cast<int>(event)];
    twin::WaitEvent(static_cast<int>(event), pipes[1], eventID, TWIN_HERE);
}

// Orders `pipe`'s later instructions after its earlier ones (PIPE_ALL: every pipe of the
// core after all of them). PIPE_S is a hardware error (PipeBarrier docs: the scalar pipe
// is ordered by hardware).
template <pipe_t pipe>
void PipeBarrier(TWIN_SITE)
{
    twin::PipeBarrierAt(pipe, TWIN_HERE);
}

template <uint8_t modeId, pipe_t pipe>
void CrossCoreSetFlag(uint16_t flagId, TWIN_SITE)
{
    static_assert(modeId == 2, "the twin implements mode 2 (an AIC and the AIVs of its AI core)");
    static_assert(pipe != PIPE_S && pipe != PIPE_ALL, "CrossCoreSetFlag takes a data pipe");
    twin::CrossCoreSet(flagId, pipe, TWIN_HERE);
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
