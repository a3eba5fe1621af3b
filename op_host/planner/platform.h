// Platform descriptions the planner plans against.
//
// At run time the CANN shell (op_host/flash_cann_attention.cpp) fills a Platform from
// platform_ascendc::PlatformAscendC (core counts, buffer sizes); the table in
// platform.cpp holds defaults for planning off-device (`flash-cann plan`, tests), with
// the public source of every number.
#ifndef FLASH_CANN_PLANNER_PLATFORM_H
#define FLASH_CANN_PLANNER_PLATFORM_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flash_cann {

struct EngineRates;

struct Platform {
    std::string name;
    // What the kernel must fit in (read at run time from the platform API).
    uint32_t aicCores = 0;       // AI cores = cube cores; each pairs with 2 vector cores
    uint32_t aivCores = 0;
    uint64_t ubBytes = 0;        // per vector core, as PlatformAscendC::GetCoreMemSize reports
    uint64_t l1Bytes = 0;        // per cube core
    uint64_t l0aBytes = 0;
    uint64_t l0bBytes = 0;
    uint64_t l0cBytes = 0;
    // For the cost model only (predictions, never used to decide correctness).
    double cubeClockGhz = 0;     // cube frequency
    double hbmBytesPerSecond = 0;
    double l2BytesPerSecond = 0;
    std::string source;          // where the numbers come from
    // The schedule model's figures when set (the fit and its sensitivity tables run
    // every design on other rates this way); RatesFor(platform) otherwise.
    std::shared_ptr<const EngineRates> modelRates;
};

// The SoC names with built-in defaults: Ascend910B1..B4, Ascend910_93.
const std::vector<Platform>& KnownPlatforms();
// nullptr if unknown.
const Platform* FindPlatform(const std::string& name);

// `platform` with `aicCores` AI cores (each with its two vector cores); aicCores == 0
// keeps the platform's own count.
Platform WithAiCores(Platform platform, uint32_t aicCores);

// The schedule modes of a launch (gert::TilingContext::SetScheduleMode). Batch mode
// starts a kernel only when every block of it can be resident at once: a kernel that
// waits across blocks (SyncAll) needs it, or under concurrent streams some of its blocks
// may wait for others that never start (asc-devkit SyncAll documentation).
constexpr uint32_t kScheduleNormal = 0;
constexpr uint32_t kScheduleBatch = 1;

// "" or why a plan of `blockDim` blocks for a kernel that synchronises across blocks
// (SyncAll) cannot launch on `platform`: the blocks must not outnumber its AI cores, or the
// runtime schedules them in rounds and the first round waits for the next forever.
std::string CheckAllCoreLaunch(uint32_t blockDim, const Platform& platform);

// Dense fp16/bf16 cube peak: 16 x 16 x 16 MACs per cycle per AI core.
double CubePeakFlops(const Platform& p);

}  // namespace flash_cann

#endif
