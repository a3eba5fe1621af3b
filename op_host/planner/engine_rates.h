// The hardware figures the schedule model (schedule_model.h) runs on: per-core transfer
// rates of every engine, vector instruction costs, shared L2 and HBM bandwidth, and the
// fixed latencies. PREDICTION inputs only: nothing here decides correctness.
//
// Sources (docs/planner.md, "Hardware figures", says which we trust and why):
//   per-core rates, vector costs  MindStudio operator modelling tables, PyPI `msopmodeling`
//                                 1.0.9, tilesim/core/config/arc_config/910B1/
//                                 bandwidth_910B1.csv and vec_cycle_910B1.csv (910B1 at
//                                 1850 MHz); converted to bytes per cycle and applied at
//                                 each SoC's clock. 910B4 has its own, slower table there.
//   shared L2 bandwidth           l2_rate 110 bytes/cycle per AI core (ops-transformer
//                                 tests/ut/framework_special/utils/src/platform.cpp)
//   HBM                           Platform::hbmBytesPerSecond (ini ddr_rate, 1.38 TB/s on
//                                 910B2); msopmodeling's GM->L2 row says 1.64 TB/s
//   launch, cross-core flag       hw-native-sys/pto-isa kernels/manual/common/flash_atten/
//                                 scripts/fa_cost_model.py (launch_overhead_cycles 10905;
//                                 NPU_LOGICAL_TILE_SYNC_CYCLES 1000 per logical tile, which
//                                 holds 4 cross-core hand-offs)
#ifndef FLASH_CANN_PLANNER_ENGINE_RATES_H
#define FLASH_CANN_PLANNER_ENGINE_RATES_H

#include <cstdint>

#include "platform.h"

namespace flash_cann {

// Vector instructions, by the cost class of the MindStudio table.
enum class VecOp : uint32_t {
    kScalarArith,  // Muls, Adds, Maxs, Mins (VMULS/VADDS...)
    kBinary,       // Add, Sub, Mul, Max, Min (VADD...)
    kExp,          // VEXP fp32
    kLn,           // LOG fp32
    kDiv,          // VDIV fp32
    kBlockReduce,  // BlockReduceMax/Sum (VCGMAX/VCGADD)
    kWholeReduce,  // WholeReduceMax/Sum (VCADD; VCMAX assumed the same)
    kBroadcast,    // Brcb (VBRCB)
    kCast,         // fp32 <-> fp16/bf16 (CONV_*), per 64-element repeat
    kDuplicate,    // Duplicate (VECTOR_DUP)
    kCompare,      // Compares (VCMPV)
    kSelect,       // Select (VSEL)
    kCount
};

struct VecOpCost {
    double cyclesPerRepeat;  // issue-to-issue cost of one 256-byte repeat
    double headCycles;       // latency of the first repeat: exposed when a barrier follows
};

struct EngineRates {
    double clockHz = 0;           // AI core clock (cube and vector)
    // Per-core transfer rates, bytes per second.
    double l2ToL1 = 0;            // MTE2 on the cube core (GM/L2 -> L1)
    double l1ToL0a = 0;           // MTE1
    double l1ToL0b = 0;
    double fixpipe = 0;           // L0C -> GM/L2
    double l2ToUb = 0;            // MTE2 on a vector core
    double ubToL2 = 0;            // MTE3
    // Shared by all cores.
    double l2Aggregate = 0;       // bytes per second, all AI cores together
    double hbm = 0;
    // Fixed costs, seconds.
    double crossCoreFlag = 0;     // one CrossCoreSetFlag -> WaitFlag hand-off
    double launch = 0;            // per kernel launch
    VecOpCost vector[static_cast<uint32_t>(VecOp::kCount)];

    const VecOpCost& Cost(VecOp op) const { return vector[static_cast<uint32_t>(op)]; }
};

// The figures for `platform` (its clock, core count and HBM; the 910B4 table for
// Ascend910B4, the 910B1 table scaled to the clock for the others).
EngineRates RatesFor(const Platform& platform);

}  // namespace flash_cann

#endif
