#include "platform.h"

namespace flash_cann {
namespace {

// Buffer sizes of every NpuArch 2201 part (910B1..B4, 910_93): UB 192 KB per vector
// core, L1 512 KB, L0A/L0B 64 KB, L0C 128 KB per cube core (asc-devkit docs,
// "NPU架构版本2201.md"). PlatformAscendC::GetCoreMemSize reports UB and L1 256 bytes
// smaller on these parts (LOCAL_RESERV_SIZE, asc-devkit
// impl/utils/tiling/platform/platform_ascendc.cpp); the defaults use what it reports.
constexpr uint64_t kUb = 192 * 1024 - 256;
constexpr uint64_t kL1 = 512 * 1024 - 256;
constexpr uint64_t kL0ab = 64 * 1024;
constexpr uint64_t kL0c = 128 * 1024;

// HBM bandwidth is not published by the vendor. The model uses the platform ini's
// ddr_rate (32 bytes/cycle per AI core) x cube clock x AI cores, e.g. 1.38 TB/s on
// 910B2 (1.6 TB/s is often quoted; unverified). L2: l2_rate 110 bytes/cycle per core
// (ops-transformer tests/ut/framework_special/utils/src/platform.cpp, a UT stub).
constexpr double kDdrBytesPerCycle = 32;
constexpr double kL2BytesPerCycle = 110;

Platform Make(const char* name, uint32_t aic, double ghz, const char* source)
{
    Platform p;
    p.name = name;
    p.aicCores = aic;
    p.aivCores = 2 * aic;
    p.ubBytes = kUb;
    p.l1Bytes = kL1;
    p.l0aBytes = kL0ab;
    p.l0bBytes = kL0ab;
    p.l0cBytes = kL0c;
    p.cubeClockGhz = ghz;
    p.hbmBytesPerSecond = kDdrBytesPerCycle * ghz * 1e9 * aic;
    p.l2BytesPerSecond = kL2BytesPerCycle * ghz * 1e9 * aic;
    p.source = source;
    return p;
}

}  // namespace

const std::vector<Platform>& KnownPlatforms()
{
    // Core counts: ops-transformer's UT platform stub (tests/ut/framework_special/utils/
    // src/platform.cpp) and hicann/catlass include/catlass/arch/arch.hpp; clocks: platform
    // ini quotes (cube_freq) and the cost model of hw-native-sys/pto-isa
    // kernels/manual/common/flash_atten/ (README.md, scripts/fa_cost_model.py).
    static const std::vector<Platform> platforms = {
        Make("Ascend910B1", 24, 1.85, "24 AIC/48 AIV (ops-transformer UT stub); 1850 MHz "
                                     "(platform ini quote, pto-isa cost model)"),
        Make("Ascend910B2", 24, 1.80, "24 AIC/48 AIV (ops-transformer UT stub); 1800 MHz "
                                     "(Ascend910B2.ini cube_freq quotes)"),
        Make("Ascend910B3", 20, 1.80, "20 AIC/40 AIV (ops-transformer UT stub, catlass "
                                     "arch.hpp); 1800 MHz (pto-isa cost model)"),
        Make("Ascend910B4", 20, 1.50, "20 AIC/40 AIV (platform ini quotes); 1500 MHz "
                                     "(platform ini quote)"),
        Make("Ascend910_93", 24, 1.80, "per die: 24 AIC/48 AIV, 1800 MHz (Ascend910_9382.ini "
                                      "quote; arXiv 2509.25224)"),
    };
    return platforms;
}

const Platform* FindPlatform(const std::string& name)
{
    for (const Platform& p : KnownPlatforms()) {
        if (p.name == name) {
            return &p;
        }
    }
    return nullptr;
}

Platform WithAiCores(Platform platform, uint32_t aicCores)
{
    if (aicCores > 0) {
        platform.aicCores = aicCores;
        platform.aivCores = 2 * aicCores;
    }
    return platform;
}

std::string CheckAllCoreLaunch(uint32_t blockDim, const Platform& platform)
{
    if (blockDim >= 1 && blockDim <= platform.aicCores) {
        return "";
    }
    return "the plan launches " + std::to_string(blockDim) + " blocks of a kernel that synchronises "
           "across blocks (SyncAll) on " + std::to_string(platform.aicCores) + " AI cores: blockDim "
           "must be in [1, AI cores]";
}

double CubePeakFlops(const Platform& p)
{
    return 16.0 * 16.0 * 16.0 * 2.0 * p.aicCores * p.cubeClockGhz * 1e9;
}

}  // namespace flash_cann
