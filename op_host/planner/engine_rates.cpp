#include "engine_rates.h"

#include <memory>

namespace flash_cann {
namespace {

// One MindStudio bandwidth table (GB/s per core at `clockGhz`), kept in bytes per cycle
// so that it can be applied at another SoC's clock.
struct BandwidthTable {
    double clockGhz;
    double l2ToL1, l1ToL0a, l1ToL0b, fixpipe, l2ToUb, ubToL2;

    double PerCycle(double gbPerSecond) const { return gbPerSecond / clockGhz; }
};

// msopmodeling arc_config/910B1/bandwidth_910B1.csv rows L2->L1, L1->L0A, L1->L0B,
// L0C->L2, L2->UB, UB->L2.
constexpr BandwidthTable k910B1{1.85, 221.0, 441.0, 220.5, 70.0, 137.0, 93.0};
// msopmodeling arc_config/910B4/bandwidth_910B4.csv, same rows (the table's clock is
// 1650 MHz).
constexpr BandwidthTable k910B4{1.65, 134.98, 285.82, 142.97, 46.66, 87.39, 64.82};

constexpr double kL2BytesPerCyclePerCore = 110;   // ini l2_rate (UT platform stub)
constexpr double kCrossCoreFlagCycles = 1000.0 / 4;  // pto-isa: 1000 per tile, 4 hand-offs
// Assumed arrival cycles (EngineRates), the twin's latency_cycles: GM -> L1/UB 150,
// UB -> GM and L0C -> GM 100, L1 -> L0 20.
constexpr double kReadArrivalCycles = 150, kWriteArrivalCycles = 100, kL0ArrivalCycles = 20;

// msopmodeling vec_cycle_910B1.csv, fp32 rows: computing_cycles, head_cycles.
void FillVectorTable(EngineRates& r)
{
    auto set = [&](VecOp op, double perRepeat, double head) {
        r.vector[static_cast<uint32_t>(op)] = {perRepeat, head};
    };
    set(VecOp::kScalarArith, 1, 14);  // VMULS 1/14, VADDS 1/13, VMINS 1/14
    set(VecOp::kBinary, 2, 14);       // VADD/VSUB/VMUL 2/13, VMAX 2/14
    set(VecOp::kExp, 2, 13);          // VEXP FP32 2/13
    set(VecOp::kLn, 2, 26);           // LOG FP32 2/26
    set(VecOp::kDiv, 4, 13);          // VDIV FP32 4/13
    set(VecOp::kBlockReduce, 1, 14);  // VCGMAX/VCGADD 1/14
    set(VecOp::kWholeReduce, 7, 14);  // VCADD 7/14 (no VCMAX row: taken equal)
    set(VecOp::kBroadcast, 1, 18);    // VBRCB 0/0, interval 18: one cycle per repeat assumed
    set(VecOp::kCast, 1, 16);         // CONV_F322F16 1/16, CONV_F322BF16 1/14
    set(VecOp::kDuplicate, 1, 11);    // VECTOR_DUP 1/11
    set(VecOp::kCompare, 2, 14);      // VCMPV_* 2/14
    set(VecOp::kSelect, 2, 13);       // VSEL FP32 2/13
}

}  // namespace

// The fit of model_fit.cpp (FitModel; `python benchmarks/npu_model.py --fit` reruns and
// prints it, tests/test_npu_model.py pins it) to hw-native-sys/pto-isa's published
// flash_atten tables (kernels/manual/common/flash_atten/README.md: the 1- and 2-core
// marginal time per key, the 910B2 24-core PTO column), PTO's hand kernel modelled as
// PtoDesign (cost_model.h); model_fit.h says what the fit leaves out.
const FittedFigures kFitted = {1.320141181, 0.9931214839, 1.291440187, 0, 0, 12703.08235};

EngineRates RatesFor(const Platform& p)
{
    return p.modelRates ? *p.modelRates : RatesFor(p, kFitted);
}

EngineRates RatesFor(const Platform& p, const FittedFigures& fit)
{
    const BandwidthTable& table = p.name == "Ascend910B4" ? k910B4 : k910B1;
    const double clock = p.cubeClockGhz * 1e9;
    EngineRates r;
    r.clockHz = clock;
    r.l2ToL1 = table.PerCycle(table.l2ToL1) * clock * fit.mte2Scale;
    r.l1ToL0a = table.PerCycle(table.l1ToL0a) * clock;
    r.l1ToL0b = table.PerCycle(table.l1ToL0b) * clock;
    r.fixpipe = table.PerCycle(table.fixpipe) * clock * fit.fixpipeScale;
    r.l2ToUb = table.PerCycle(table.l2ToUb) * clock * fit.mte2Scale;
    r.ubToL2 = table.PerCycle(table.ubToL2) * clock;
    r.l2Aggregate = kL2BytesPerCyclePerCore * p.aicCores * clock * fit.l2Scale;
    r.hbm = p.hbmBytesPerSecond;
    r.crossCoreFlag = kCrossCoreFlagCycles / clock;
    r.launch = fit.launchCycles / clock;
    r.mmadIssue = r.mte1Issue = r.vectorIssue = fit.issueCycles / clock;
    r.mte2Latency = r.mte3Latency = r.fixpipeLatency = fit.transferCycles / clock;
    r.l2ToL1Arrival = r.l2ToUbArrival = kReadArrivalCycles / clock;
    r.ubToL2Arrival = r.fixpipeArrival = kWriteArrivalCycles / clock;
    r.l1ToL0Arrival = kL0ArrivalCycles / clock;
    FillVectorTable(r);
    return r;
}

Platform WithRates(const Platform& platform, const EngineRates& rates)
{
    Platform p = platform;
    p.modelRates = std::make_shared<const EngineRates>(rates);
    return p;
}

}  // namespace flash_cann
