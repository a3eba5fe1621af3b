#include "backward_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cost_model.h"
#include "engine_rates.h"
#include "schedule_model.h"

namespace flash_cann {
namespace {

constexpr double kMacsPerCycle = 16 * 16 * 16;
// A unit's steps are simulated up to this many; longer units are extrapolated from the
// steady state (as the forward's tiles are).
constexpr uint64_t kExactSteps = 8;
constexpr uint64_t kExtrapolationStep = 8;

struct StepCosts {
    double loadQ, loadKv, loadPds;             // cube MTE2: Q + dO; K + V per unit; P + dS
    double mte1S, mte1Dp, mte1Dv, mte1Dk, mte1Dq;
    double mmad;                                // one of the five products
    double fixScores, fixDp, fixDq, fixDkDv;    // S; dP; dQ (atomic); dK + dV per unit
    double vecIn, vecCompute, vecOut;           // one vector core
    double l2BytesStep, l2BytesUnit;
};

// The fraction of a windowed call's steps whose tile a band edge crosses (BandMasking's
// per-row Compares and Selects run only there): per query block, the key blocks it
// touches, of which about (blockQ / blockK + 1) per bounded side hold an edge.
double BandEdgeFraction(const BackwardDesign& d, const BackwardProblem& pr)
{
    const VariantTiling& v = pr.variant;
    const bool left = v.windowLeft >= 0;
    const bool right = !pr.causal && v.windowRight >= 0;
    if (!left && !right) {
        return 0;
    }
    const double width = (left ? double(v.windowLeft) : double(pr.seqlenK)) +
                         (right ? double(v.windowRight) : double(pr.seqlenK)) + 1;
    const double touched = std::ceil((std::min(width, double(pr.seqlenK)) + d.blockQ) / d.blockK) + 1;
    const double edges = (left + right) * (double(d.blockQ) / d.blockK + 1);
    return std::min(1.0, edges / touched);
}

StepCosts CostStep(const BackwardDesign& d, const BackwardProblem& pr, const EngineRates& r)
{
    const VariantTiling& variant = pr.variant;
    const double edgeFraction = BandEdgeFraction(d, pr);
    const double bq = d.blockQ, bk = d.blockK, dim = d.headDimPad, e = d.elemBytes;
    const double rows = bq / 2;
    StepCosts c{};
    c.loadQ = 2 * bq * dim * e / r.l2ToL1;
    c.loadKv = 2 * bk * dim * e / r.l2ToL1;
    c.loadPds = 2 * bq * bk * e / r.l2ToL1;
    const double a = 1 / r.l1ToL0a, b = 1 / r.l1ToL0b;
    c.mte1S = (bq * dim * a + bk * dim * b) * e;   // Q, K^T
    c.mte1Dp = c.mte1S;                             // dO, V^T
    c.mte1Dv = (bq * bk * a + bq * dim * b) * e;    // P^T, dO
    c.mte1Dk = c.mte1Dv;                            // dS^T, Q
    c.mte1Dq = (bq * bk * a + bk * dim * b) * e;    // dS, K
    c.mmad = bq * bk * dim / kMacsPerCycle / r.clockHz;
    c.fixScores = bq * bk * d.scoreBytes / r.fixpipe;
    c.fixDp = bq * bk * 4 / r.fixpipe;
    c.fixDq = bq * dim * 4 / r.fixpipe;
    c.fixDkDv = 2 * bk * dim * 4 / r.fixpipe;
    const double tile = FloatRepeats(rows * bk);
    VecProgram v;
    if (d.scoreBytes < 4) {  // fp16 S: widened to fp32, clamped to +-65504
        const VecProgram widen = ScoreWidenProgram(rows, bk);
        v.insert(v.end(), widen.begin(), widen.end());
    }
    AppendVec(v, VecOp::kScalarArith, tile, true);                  // S * scale
    if (variant.softcap > 0) {  // Softcap (flash_attention_features.h)
        AppendVec(v, VecOp::kScalarArith, tile, true, 2);           // 2x / softcap, Mins
        AppendVec(v, VecOp::kExp, tile, true);                      // e = exp(2x)
        AppendVec(v, VecOp::kScalarArith, tile, true, 2);           // e + 1, e - 1
        AppendVec(v, VecOp::kDiv, tile, true);                      // t
        AppendVec(v, VecOp::kScalarArith, tile, true);              // softcap t
    }
    if (variant.alibi != 0) {  // AlibiBias::Apply; Abs costs as a scalar op (one pass)
        AppendVec(v, VecOp::kScalarArith, tile, true, 3);           // + offset, Abs, * slope
        AppendVec(v, VecOp::kBinary, tile, true);                   // s += bias
    }
    if (edgeFraction > 0) {  // BandMasking: per row of an edge tile, Compares + Select
        const double lanes = FloatRepeats(std::ceil(d.blockK / 64.0) * 64);
        AppendVec(v, VecOp::kCompare, lanes, true, rows * edgeFraction);
        AppendVec(v, VecOp::kSelect, FloatRepeats(d.blockK), true, rows * edgeFraction);
    }
    AppendVec(v, VecOp::kBroadcast, std::ceil(rows / 8), true);     // lse per row
    AppendVec(v, VecOp::kBinary, tile, true);                       // - lse
    AppendVec(v, VecOp::kExp, tile, true);                          // P
    AppendVec(v, VecOp::kCast, tile, false);                        // P in the input dtype
    AppendVec(v, VecOp::kBroadcast, std::ceil(rows / 8), true);     // D per row
    AppendVec(v, VecOp::kBinary, tile, true);                       // dP - D
    AppendVec(v, VecOp::kBinary, tile, true);                       // * P
    if (variant.softcap > 0) {
        AppendVec(v, VecOp::kBinary, tile, true, 3);                // dS -= dS t^2
    }
    AppendVec(v, VecOp::kCast, tile, false);                        // dS
    if (d.dropoutPassElements > 0) {
        const VecProgram mask = DropoutMaskProgram(rows, bk, d.dropoutPassElements, d.dropoutDraw);
        v.insert(v.end(), mask.begin(), mask.end());
        AppendVec(v, VecOp::kSelect, tile, true, 2);                // P, dP where kept
        AppendVec(v, VecOp::kScalarArith, tile, true);              // dP / (1 - p)
    }
    c.vecIn = rows * bk * (d.scoreBytes + 4) / r.l2ToUb;
    c.vecCompute = VecSeconds(v, r);
    c.vecOut = 2 * rows * bk * e / r.ubToL2;
    c.l2BytesStep = 2 * bq * dim * e + 2 * bq * bk * e            // Q, dO, P, dS into L1
                    + bq * bk * (d.scoreBytes + 4) + 2 * bq * dim * 4  // S, dP; dQ read-add-write
                    + bq * bk * (d.scoreBytes + 4) + 2 * bq * bk * e;  // vector in and out
    c.l2BytesUnit = 2 * bk * dim * e + 2 * bk * dim * 4;          // K, V in; dK, dV out
    return c;
}

struct Run {
    double seconds = 0;
    EngineSeconds busy{};
};

// The task graph of `units` units of `steps` steps each on one AI core.
Run Simulate(const BackwardDesign& d, const StepCosts& c, uint64_t units, uint64_t steps,
             double flag)
{
    using Id = Timeline::TaskId;
    struct StepIds {
        Id fixS = Timeline::kNone, fixDp = Timeline::kNone, loadPds = Timeline::kNone;
        Id vecIn = Timeline::kNone, vecCompute = Timeline::kNone, vecOut = Timeline::kNone;
        Id mmadDv = Timeline::kNone, mmadDk = Timeline::kNone;
    };
    Timeline t;
    const uint64_t n = units * steps;
    std::vector<StepIds> ids(n);
    std::vector<Id> unitKv(units), unitFix(units);
    std::vector<std::pair<Id, Id>> scratch;  // (mmad, fix) of each use of the L0C scratch
    auto product = [&](double mte1, double fix, Id input, bool usesScratch) {
        const Id m1 = t.Add(Engine::kCubeMte1, mte1);
        t.After(m1, input);
        const Id mm = t.Add(Engine::kCube, c.mmad);
        t.After(mm, m1);
        Id fx = Timeline::kNone;
        if (fix > 0) {
            fx = t.Add(Engine::kFixpipe, fix);
            t.After(fx, mm);
        }
        if (usesScratch) {
            if (scratch.size() >= d.l0cScratchBuffers) {
                t.After(mm, scratch[scratch.size() - d.l0cScratchBuffers].second);
            }
            scratch.emplace_back(mm, fx);
        }
        return std::make_pair(mm, fx);
    };
    auto scores = [&](uint64_t i) {
        const uint64_t u = i / steps;
        if (i % steps == 0) {
            unitKv[u] = t.Add(Engine::kCubeMte2, c.loadKv);
            if (u >= d.kvL1Buffers) {  // the K/V buffer of unit u - kvL1Buffers is free
                t.After(unitKv[u], ids[(u - d.kvL1Buffers + 1) * steps - 1].mmadDk);
            }
        }
        const Id q = t.Add(Engine::kCubeMte2, c.loadQ);
        t.After(q, unitKv[u]);
        ids[i].fixS = product(c.mte1S, c.fixScores, q, true).second;
        ids[i].fixDp = product(c.mte1Dp, c.fixDp, q, true).second;
        if (i >= d.exchangeSlots) {  // workspace slot free once the vector has read it
            t.After(ids[i].fixS, ids[i - d.exchangeSlots].vecIn, flag);
        }
    };
    auto gradients = [&](uint64_t i) {
        const uint64_t u = i / steps;
        ids[i].loadPds = t.Add(Engine::kCubeMte2, c.loadPds);
        t.After(ids[i].loadPds, ids[i].vecOut, flag);
        ids[i].mmadDv = product(c.mte1Dv, 0, ids[i].loadPds, false).first;
        ids[i].mmadDk = product(c.mte1Dk, 0, ids[i].loadPds, false).first;
        if (i % steps == 0 && u > 0) {  // one dK/dV accumulator: wait for its write-out
            t.After(ids[i].mmadDv, unitFix[u - 1]);
        }
        product(c.mte1Dq, c.fixDq, ids[i].loadPds, true);
        if ((i + 1) % steps == 0) {
            unitFix[u] = t.Add(Engine::kFixpipe, c.fixDkDv);
            t.After(unitFix[u], ids[i].mmadDk);
        }
    };
    for (uint64_t i = 0; i < std::min<uint64_t>(n, d.stepsAhead); ++i) {
        scores(i);
    }
    for (uint64_t i = 0; i < n; ++i) {
        gradients(i);
        if (i + d.stepsAhead < n) {
            scores(i + d.stepsAhead);
        }
    }
    for (uint64_t i = 0; i < n; ++i) {
        ids[i].vecIn = t.Add(Engine::kVecMte2, c.vecIn);
        t.After(ids[i].vecIn, ids[i].fixS, flag);
        t.After(ids[i].vecIn, ids[i].fixDp, flag);
        if (i > 0) {  // one UB copy of S and dP
            t.After(ids[i].vecIn, ids[i - 1].vecCompute);
        }
        ids[i].vecCompute = t.Add(Engine::kVector, c.vecCompute);
        t.After(ids[i].vecCompute, ids[i].vecIn);
        if (i > 0) {  // one UB copy of P and dS
            t.After(ids[i].vecCompute, ids[i - 1].vecOut);
        }
        ids[i].vecOut = t.Add(Engine::kVecMte3, c.vecOut);
        t.After(ids[i].vecOut, ids[i].vecCompute);
        if (i >= d.exchangeSlots) {
            t.After(ids[i].vecOut, ids[i - d.exchangeSlots].loadPds, flag);
        }
    }
    Run run;
    run.seconds = t.Run();
    run.busy = t.Busy();
    return run;
}

// Steady time of one unit of `steps` steps in a stream of them, and the fill of the first.
struct UnitCost {
    double steady = 0;
    double fill = 0;
    EngineSeconds busy{};
    bool deadlock = false;
};

UnitCost CostUnit(const BackwardDesign& d, const StepCosts& c, uint64_t steps, double flag)
{
    if (steps > kExactSteps + kExtrapolationStep) {
        const UnitCost a = CostUnit(d, c, kExactSteps, flag);
        const UnitCost b = CostUnit(d, c, kExactSteps + kExtrapolationStep, flag);
        const double f = double(steps - kExactSteps) / kExtrapolationStep;
        UnitCost u;
        u.steady = a.steady + (b.steady - a.steady) * f;
        u.fill = b.fill;
        for (uint32_t e = 0; e < kEngines; ++e) {
            u.busy[e] = a.busy[e] + (b.busy[e] - a.busy[e]) * f;
        }
        u.deadlock = a.deadlock || b.deadlock;
        return u;
    }
    const Run one = Simulate(d, c, 1, steps, flag);
    const Run three = Simulate(d, c, 3, steps, flag);
    UnitCost u;
    u.steady = (three.seconds - one.seconds) / 2;
    u.fill = one.seconds - u.steady;
    u.busy = one.busy;
    u.deadlock = one.seconds < 0 || three.seconds < 0;
    return u;
}

// A pass over rows of the whole problem on all vector cores: bandwidth and HBM bound.
double PassSeconds(double readBytes, double writeBytes, const Platform& p, const EngineRates& r)
{
    const double perCore = std::max(readBytes / r.l2ToUb, writeBytes / r.ubToL2) / p.aivCores;
    return std::max(perCore, (readBytes + writeBytes) / r.hbm) + 2 * r.crossCoreFlag;
}

// Query blocks that see key block `kb` (bottom-right causal and window), per query head:
// the rows key0 - offset - right .. key0 + keys - 1 - offset + left.
uint64_t StepsOfKeyBlock(const BackwardDesign& d, const BackwardProblem& pr, uint64_t kb)
{
    const int64_t offset = pr.seqlenK - pr.seqlenQ;
    const int64_t key0 = static_cast<int64_t>(kb * d.blockK);
    const int64_t keys = std::min<int64_t>(d.blockK, pr.seqlenK - key0);
    const int64_t right = pr.causal ? 0 : pr.variant.windowRight;
    const int64_t first = right >= 0 ? std::clamp<int64_t>(key0 - offset - right, 0, pr.seqlenQ) : 0;
    const int64_t end = pr.variant.windowLeft >= 0
                            ? std::clamp<int64_t>(key0 + keys - offset + pr.variant.windowLeft, first, pr.seqlenQ)
                            : pr.seqlenQ;
    if (end <= first) {
        return 0;
    }
    return static_cast<uint64_t>((end + d.blockQ - 1) / d.blockQ - first / d.blockQ);
}

// The (query, key) pairs a row's band and causal bound leave visible, summed over rows.
double VisibleBandPairs(const BackwardProblem& pr)
{
    const int64_t offset = pr.seqlenK - pr.seqlenQ;
    const int64_t right = pr.causal ? 0 : pr.variant.windowRight;
    const int64_t left = pr.variant.windowLeft;
    double pairs = 0;
    for (int64_t i = 0; i < pr.seqlenQ; ++i) {
        const int64_t lo = left >= 0 ? std::max<int64_t>(0, i + offset - left) : 0;
        const int64_t hi = right >= 0 ? std::min<int64_t>(pr.seqlenK - 1, i + offset + right) : pr.seqlenK - 1;
        pairs += static_cast<double>(std::max<int64_t>(0, hi - lo + 1));
    }
    return pairs;
}

}  // namespace

std::vector<BackwardCoreWork> EvenBackwardSplit(const BackwardDesign& d, const BackwardProblem& pr,
                                                uint32_t cores)
{
    const uint64_t keyBlocks = (pr.seqlenK + d.blockK - 1) / d.blockK;
    const uint64_t group = pr.headsQ / pr.headsKv;
    const uint64_t units = pr.batch * pr.headsKv * keyBlocks;
    std::vector<uint64_t> steps(units);
    uint64_t total = 0;
    for (uint64_t u = 0; u < units; ++u) {
        steps[u] = group * StepsOfKeyBlock(d, pr, u % keyBlocks);
        total += steps[u];
    }
    // Contiguous ranges, each cut where the running total passes the next c/cores share.
    std::vector<BackwardCoreWork> work(std::max<uint32_t>(1, cores));
    uint64_t done = 0;
    size_t core = 0;
    for (uint64_t u = 0; u < units; ++u) {
        while (core + 1 < work.size() && done * work.size() >= total * (core + 1)) {
            ++core;
        }
        work[core].units += 1;
        work[core].steps += steps[u];
        done += steps[u];
    }
    return work;
}

BackwardPrediction PredictBackward(const BackwardDesign& d, const BackwardProblem& pr,
                                   const std::vector<BackwardCoreWork>& cores, const Platform& p)
{
    const EngineRates r = RatesFor(p);
    const StepCosts c = CostStep(d, pr, r);
    const double e = d.elemBytes;
    const double queryRows = double(pr.batch) * pr.headsQ * pr.seqlenQ;
    const double keyRows = double(pr.batch) * pr.headsKv * pr.seqlenK;
    const double dim = d.headDimPad;
    BackwardPrediction out;
    // Pre-pass: read dO and O, write D, zero the dQ accumulators.
    out.preSeconds = PassSeconds(2 * queryRows * dim * e, queryRows * 4 + d.dqSlots * queryRows * dim * 4, p, r);
    // Post-pass: read the dQ slots and fp32 dK, dV; write dQ, dK, dV.
    out.postSeconds = PassSeconds(d.dqSlots * queryRows * dim * 4 + 2 * keyRows * dim * 4,
                                  (queryRows + 2 * keyRows) * dim * e, p, r);
    if (pr.variant.sinks != 0) {
        // SinkGrad: one vector core per query head reads lse and D of its (batch, row)s
        // and runs five one-pass ops over them (SumSinkTerms).
        const double rowsPerCore = std::ceil(double(pr.headsQ) / p.aivCores) * pr.batch * pr.seqlenQ;
        VecProgram sink;
        AppendVec(sink, VecOp::kScalarArith, FloatRepeats(rowsPerCore), true, 2);
        AppendVec(sink, VecOp::kExp, FloatRepeats(rowsPerCore), true);
        AppendVec(sink, VecOp::kBinary, FloatRepeats(rowsPerCore), true, 2);
        out.postSeconds += std::max(2 * rowsPerCore * 4 / r.l2ToUb, VecSeconds(sink, r));
    }
    out.vectorStepSeconds = c.vecCompute;
    const double l2Share = r.l2Aggregate / std::max<size_t>(1, cores.size());
    EngineSeconds slowestBusy{};
    bool l2Bound = false;
    bool deadlock = false;
    for (const BackwardCoreWork& w : cores) {
        if (w.units == 0) {
            continue;
        }
        const uint64_t perUnit = std::max<uint64_t>(1, (w.steps + w.units - 1) / w.units);
        const UnitCost u = CostUnit(d, c, perUnit, r.crossCoreFlag);
        deadlock = deadlock || u.deadlock;
        double seconds = u.fill + u.steady * w.units * (double(w.steps) / (perUnit * w.units));
        const double l2 = (c.l2BytesStep * w.steps + c.l2BytesUnit * w.units) / l2Share;
        const bool bound = l2 > seconds;
        seconds = std::max(seconds, l2);
        if (seconds > out.mainSeconds) {
            out.mainSeconds = seconds;
            l2Bound = bound;
            for (uint32_t i = 0; i < kEngines; ++i) {
                slowestBusy[i] = u.busy[i] * double(w.steps) / perUnit;
            }
        }
    }
    out.seconds = r.launch + out.preSeconds + out.mainSeconds + out.postSeconds;
    out.usefulFlops = 2.5 * 4.0 * pr.headDim * pr.batch * pr.headsQ *
                      VisibleBandPairs(pr);
    out.cubeUtilization = out.usefulFlops / (out.seconds * CubePeakFlops(p));
    uint32_t busiest = 0;
    for (uint32_t i = 0; i < kEngines; ++i) {
        out.engineBusySeconds.emplace_back(EngineName(Engine(i)), slowestBusy[i]);
        if (slowestBusy[i] > slowestBusy[busiest]) {
            busiest = i;
        }
    }
    char text[160];
    if (deadlock) {
        out.seconds = 0;
        out.cubeUtilization = 0;
        out.bound = "deadlock in the design's task graph";
    } else if (l2Bound) {
        out.bound = "shared L2 bandwidth (workspace traffic)";
    } else {
        const double share = out.mainSeconds > 0 ? slowestBusy[busiest] / out.mainSeconds : 0;
        std::snprintf(text, sizeof(text), share >= 0.85 ? "%s, busy %.0f%%"
                                                        : "dependency chain (busiest: %s, %.0f%%)",
                      EngineName(Engine(busiest)), 100 * share);
        out.bound = text;
    }
    return out;
}

}  // namespace flash_cann
