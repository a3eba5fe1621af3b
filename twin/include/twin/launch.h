// Launching a kernel on the twin.
#ifndef FLASH_CANN_TWIN_LAUNCH_H
#define FLASH_CANN_TWIN_LAUNCH_H

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core.h"

namespace twin {

// A tensor handed to the kernel: the only GM the kernel may touch.
struct GmRegion {
    const void* begin;
    size_t bytes;
    std::string name;
    // The race detector checks accesses to it (outputs, workspace); read-only inputs
    // need no check.
    bool checkRaces = true;
};

struct LaunchConfig {
    uint32_t blockDim = 1;   // AI cores; each runs 1 AIC + 2 AIV threads (MIX 1:2)
    uint64_t tilingKey = 0;
    // The AI cores of the device running the launch (0: as many as blockDim). A kernel
    // that calls SyncAll must not launch more blocks than that: the runtime would run
    // them in rounds and the first round would wait in SyncAll for the next forever.
    uint32_t aiCores = 0;
    // The tiling's schedule mode (SetScheduleMode): 1, batch mode, starts the kernel only
    // when every block is resident; a kernel that calls SyncAll needs it.
    uint32_t scheduleMode = 0;
    std::vector<GmRegion> gm;
};

// What a launch measured.
struct LaunchReport {
    // The most bytes one core of the type held at once in the memory, over all cores of
    // the launch (the sum of its InitBuffer calls, each rounded to 32 bytes).
    uint64_t PeakBytes(CoreType type, Memory memory) const;
    uint64_t peakBytes[2][6] = {};  // [AIC, AIV][Memory]
    // The checked GM tensors (GmRegion::name, launch order) where some element received
    // atomic adds from two agents that no happens-before edge orders: the hardware fixes
    // no order among them, so a floating-point sum there may differ between runs. Empty
    // with the race detector off (FLASH_CANN_TWIN_RACE_CHECK=0): it is the detector's
    // bookkeeping.
    std::vector<std::string> unorderedAtomicAdds;
    // The timing mode's report (JSON, twin/timing.h), "" with timing off.
    std::string timing;
};

// Runs `kernel` on every core of the launch, all AI cores at once; returns "" or the
// first violation of a hardware rule ("file:line: rule ..."), a deadlock included. Local
// memories start poisoned (all bytes 0xFF, NaN as floats), so reading what was never
// written shows up in the results.
std::string Launch(const LaunchConfig& config, const std::function<void()>& kernel,
                   LaunchReport* report = nullptr);

// A backstop only: how long a wait may last before the twin gives up on it (default
// 120 s). Deadlocks are detected exactly, as soon as every core waits in vain.
void SetDeadlockTimeout(std::chrono::milliseconds timeout);

}  // namespace twin

#endif
