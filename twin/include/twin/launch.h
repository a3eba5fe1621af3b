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
};

struct LaunchConfig {
    uint32_t blockDim = 1;   // AI cores; each runs 1 AIC + 2 AIV threads (MIX 1:2)
    uint64_t tilingKey = 0;
    std::vector<GmRegion> gm;
};

// Runs `kernel` on every core of the launch; returns "" or the first violation of a
// hardware rule ("file:line: rule ..."). Local memories start poisoned (all bytes 0xFF,
// NaN as floats), so reading what was never written shows up in the results.
std::string Launch(const LaunchConfig& config, const std::function<void()>& kernel);

// How long CrossCoreWaitFlag waits before it reports a deadlock (default 30 s).
void SetDeadlockTimeout(std::chrono::milliseconds timeout);

}  // namespace twin

#endif
