// How the twin's C ABI hands results to its (ctypes) caller: an error message, the
// bytes a kernel allocated per memory level, and the tensors with unordered atomic adds.
#ifndef FLASH_CANN_TWIN_REPORT_H
#define FLASH_CANN_TWIN_REPORT_H

#include <cstdint>
#include <cstring>
#include <string>

#include "twin/launch.h"

namespace twin {

// The AI cores of the twin's device for a launch planned on `plannedCores`: the plan's own
// platform, unless a test shrank the device (flash_cann_twin_device_cores).
uint32_t DeviceAiCores(uint32_t plannedCores);

// Copies `message` into the caller's buffer (truncated, NUL-terminated); returns 1, the
// C ABI's failure status.
inline int Report(const std::string& message, char* error, uint64_t capacity)
{
    if (capacity > 0) {
        std::strncpy(error, message.c_str(), capacity - 1);
        error[capacity - 1] = '\0';
    }
    return 1;
}

// The peak InitBuffer bytes per memory level, in the planner's MemLevel order: L1, L0A,
// L0B, L0C (per cube core), UB (per vector core). `allocatedBytes` may be null.
inline void CopyAllocated(const LaunchReport& report, uint64_t* allocatedBytes)
{
    if (allocatedBytes == nullptr) {
        return;
    }
    const Memory aic[] = {Memory::L1, Memory::L0A, Memory::L0B, Memory::L0C};
    for (int i = 0; i < 4; ++i) {
        allocatedBytes[i] = report.PeakBytes(CoreType::AIC, aic[i]);
    }
    allocatedBytes[4] = report.PeakBytes(CoreType::AIV, Memory::UB);
}

// LaunchReport::unorderedAtomicAdds, comma-separated, into the caller's buffer
// (truncated, NUL-terminated). `names` may be null.
inline void CopyUnorderedAtomicAdds(const LaunchReport& report, char* names, uint64_t capacity)
{
    if (names == nullptr || capacity == 0) {
        return;
    }
    std::string joined;
    for (const std::string& name : report.unorderedAtomicAdds) {
        joined += (joined.empty() ? "" : ",") + name;
    }
    std::strncpy(names, joined.c_str(), capacity - 1);
    names[capacity - 1] = '\0';
}

}  // namespace twin

#endif
