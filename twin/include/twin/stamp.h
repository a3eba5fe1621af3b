// A moment of the timing mode's timeline (twin/timing.h), which every happens-before edge
// of the race detector carries (twin::Clock, core.h).
#ifndef FLASH_CANN_TWIN_STAMP_H
#define FLASH_CANN_TWIN_STAMP_H

#include <cstdint>
#include <vector>

namespace twin {

constexpr int kTimedPipes = 8;           // pipe_t values (PIPE_ALL's slot stays empty)
constexpr int kSyncSlot = kTimedPipes;   // critical-path slot of flag and SyncAll latencies
constexpr int kPathSlots = kTimedPipes + 1;

// A moment, in cycles, with its critical path: the cycles per pipe (and of flag and
// SyncAll latencies) of the chain of instructions that made it as late as it is.
struct Stamp {
    double at = 0;
    double path[kPathSlots] = {};
};

// A vector clock over every agent of the launch (the race detector, twin/race.h); with
// timing on, also the Stamp of the work it releases, so that every happens-before edge
// orders the timeline too.
struct Clock : std::vector<uint32_t> {
    Stamp stamp;
};

}  // namespace twin

#endif
