// The hardware figures the schedule model (schedule_model.h) runs on: per-core transfer
// rates of every engine, vector instruction costs, shared L2 and HBM bandwidth, and the
// fixed latencies. PREDICTION inputs only: nothing here decides correctness.
//
// Sources (docs/schedule-model.md, "Hardware figures", says which we trust and why):
//   per-core rates, vector costs  MindStudio operator modelling tables, PyPI `msopmodeling`
//                                 1.0.9, tilesim/core/config/arc_config/910B1/
//                                 bandwidth_910B1.csv and vec_cycle_910B1.csv (910B1 at
//                                 1850 MHz); converted to bytes per cycle and applied at
//                                 each SoC's clock. 910B4 has its own, slower table there.
//   shared L2 bandwidth           l2_rate 110 bytes/cycle per AI core (ops-transformer
//                                 tests/ut/framework_special/utils/src/platform.cpp)
//   HBM                           Platform::hbmBytesPerSecond (ini ddr_rate, 1.38 TB/s on
//                                 910B2); msopmodeling's GM->L2 row says 1.64 TB/s
//   cross-core flag               hw-native-sys/pto-isa kernels/manual/common/flash_atten/
//                                 scripts/fa_cost_model.py (NPU_LOGICAL_TILE_SYNC_CYCLES
//                                 1000 per logical tile, which holds 4 cross-core hand-offs)
//   fitted (kFitted, model_fit.h) scales of the Fixpipe, MTE2 and shared-L2 figures above,
//                                 the per-instruction issue and per-transfer start-up
//                                 cycles, the launch (from pto-isa's 10905 cycles)
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
    double launch = 0;            // per kernel launch (fitted: see engine_rates.cpp)
    // Per-instruction issue overheads, seconds per instruction (fitted, one value for
    // all: the scalar unit's issue of an instruction and its queue hand-off).
    double mmadIssue = 0;         // one Mmad
    double mte1Issue = 0;         // one LoadData (L1 -> L0A/L0B)
    double vectorIssue = 0;       // one vector instruction, on top of its repeats
    // Per-transfer start-up latency, seconds per transfer (fitted, one value for all).
    double mte2Latency = 0;       // one DataCopy GM/L2 -> L1 or UB
    double mte3Latency = 0;       // one DataCopy UB -> GM/L2
    double fixpipeLatency = 0;    // one Fixpipe L0C -> GM/L2
    // Arrival: seconds from a transfer's end on its engine to its data being usable by
    // another engine (assumed, the CPU twin's latency_cycles in twin/timing/costs.json:
    // no public figure; the twin's trace waits them out, so the model does too).
    double l2ToL1Arrival = 0;     // GM/L2 -> L1 (cube MTE2)
    double l1ToL0Arrival = 0;     // L1 -> L0A/L0B (MTE1)
    double fixpipeArrival = 0;    // L0C -> GM/L2
    double l2ToUbArrival = 0;     // GM/L2 -> UB (vector MTE2)
    double ubToL2Arrival = 0;     // UB -> GM/L2 (MTE3)
    VecOpCost vector[static_cast<uint32_t>(VecOp::kCount)];

    const VecOpCost& Cost(VecOp op) const { return vector[static_cast<uint32_t>(op)]; }

    // Task costs every design calls (forward, backward, decode): `bytes` moved in
    // `transfers` DataCopy/LoadData/Fixpipe instructions, `macs` multiply-accumulates in
    // `instructions` Mmads.
    double L2ToL1(double bytes, double transfers) const { return transfers * mte2Latency + bytes / l2ToL1; }
    double L1ToL0a(double bytes, double transfers) const { return transfers * mte1Issue + bytes / l1ToL0a; }
    double L1ToL0b(double bytes, double transfers) const { return transfers * mte1Issue + bytes / l1ToL0b; }
    double Fixpipe(double bytes, double transfers) const { return transfers * fixpipeLatency + bytes / fixpipe; }
    double L2ToUb(double bytes, double transfers) const { return transfers * mte2Latency + bytes / l2ToUb; }
    double UbToL2(double bytes, double transfers) const { return transfers * mte3Latency + bytes / ubToL2; }
    double Mmad(double macs, double instructions) const
    {
        return instructions * mmadIssue + macs / (16.0 * 16.0 * 16.0) / clockHz;
    }
};

// The figures the fit (model_fit.h) adjusts; the rest of EngineRates stays its sourced
// value. Rates are scales of the sourced figures (so that 910B4's own table scales
// alike), fixed costs cycles of the SoC's clock.
struct FittedFigures {
    double fixpipeScale;          // multiplies the sourced Fixpipe rate (L0C -> GM/L2)
    double mte2Scale;             // multiplies the sourced MTE2 rates (L2 -> L1, L2 -> UB)
    double l2Scale;               // multiplies the sourced shared-L2 rate (l2_rate)
    double transferCycles;        // start-up of each MTE2, MTE3 and Fixpipe transfer
    double issueCycles;           // issue of each Mmad, LoadData and vector instruction
    double launchCycles;          // per kernel launch, as the published tables time it
};
// The committed fit (engine_rates.cpp says of what).
extern const FittedFigures kFitted;

// The figures for `platform` (its clock, core count and HBM; the 910B4 table for
// Ascend910B4, the 910B1 table scaled to the clock for the others), with `fit` applied;
// `platform.modelRates`, when set, instead (the fit and the sensitivity tables).
EngineRates RatesFor(const Platform& platform);
EngineRates RatesFor(const Platform& platform, const FittedFigures& fit);
// `platform` with the schedule model running on `rates` (Platform::modelRates).
Platform WithRates(const Platform& platform, const EngineRates& rates);

}  // namespace flash_cann

#endif
