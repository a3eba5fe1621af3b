#include "backward_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cost_model.h"
#include "engine_rates.h"
#include "schedule_model.h"

namespace flash_cann {
namespace {

// A unit's steps are simulated up to this many; longer units are extrapolated from the
// steady state (as the forward's tiles are).
constexpr uint64_t kExactSteps = 8;
constexpr uint64_t kExtrapolationStep = 8;

// One step of a pass (query block x key block) and one unit of it. The key pass's unit is
// a key block (K, V in; dK, dV out), the deterministic dQ's query pass's a query block
// (Q, dO in; dQ out).
struct StepCosts {
    double loadUnit, loadStep, loadPds;        // cube MTE2: K + V (Q + dO); Q + dO (K + V); P + dS (dS)
    double mte1S, mte1Dp, mte1Dq;
    std::vector<double> mte1Acc;               // products accumulated in L0C: dV, dK (dQ)
    double mmad;                                // one of the products, whole
    double mmadS;                               // S (deeper with fp16 scores' offset panel)
    uint32_t scorePieces = 1;                   // Mmad + Fixpipe pieces of S, dP (productRows)
    uint32_t dqPieces = 0;                      // ... of the fast dQ (0: no dQ product in the step)
    double fixScores, fixDp, fixDq, fixUnit;    // S; dP; dQ (atomic); dK + dV (dQ) per unit
    double vecIn, vecCompute, vecOut;           // one vector core
    double l2BytesStep, l2BytesUnit;
    EngineSeconds arrival;                      // ArrivalOf the rates
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

StepCosts CostStep(const BackwardDesign& d, const BackwardProblem& pr, const EngineRates& r, bool queryPass)
{
    const VariantTiling& variant = pr.variant;
    const double edgeFraction = BandEdgeFraction(d, pr);
    const double bq = d.blockQ, bk = d.blockK, dim = d.headDimPad, e = d.elemBytes;
    const double rows = bq / 2;
    const double productRows = d.productRows > 0 ? d.productRows : bq;
    const double dqColumns = d.dqColumns > 0 ? d.dqColumns : dim;
    StepCosts c{};
    c.arrival = ArrivalOf(r);
    // One transfer per operand, one Mmad and its LoadDatas per product (pieces: one
    // Mmad and one Fixpipe each, engine_rates' per-instruction and per-transfer costs).
    const double pieces = std::ceil(bq / productRows);
    // fp16 scores: Q's offset panel is one more transfer with Q, K's ones panel one more
    // L1 fill (MTE2) with K, and S's product is that much deeper.
    const double x = d.scoreOffsetColumns;
    const bool offset = x > 0;
    const double loadQ = r.L2ToL1(2 * bq * dim * e + bq * x * e, offset ? 3 : 2);   // Q (, panel), dO
    const double loadKv = r.L2ToL1(2 * bk * dim * e + bk * x * e, offset ? 3 : 2);  // K (, ones), V
    c.loadUnit = queryPass ? loadQ : loadKv;
    c.loadStep = queryPass ? loadKv : loadQ;
    c.loadPds = r.L2ToL1((queryPass ? 1 : 2) * bq * bk * e, queryPass ? 1 : 2);
    c.mte1S = r.L1ToL0a(bq * (dim + x) * e, 1) + r.L1ToL0b(bk * (dim + x) * e, 1);   // Q, K^T
    c.mte1Dp = r.L1ToL0a(bq * dim * e, 1) + r.L1ToL0b(bk * dim * e, 1);              // dO, V^T
    const double mte1Dv = r.L1ToL0a(bq * bk * e, 1) + r.L1ToL0b(bq * dim * e, 1);  // P^T, dO (dS^T, Q for dK)
    c.mte1Dq = r.L1ToL0a(bq * bk * e, 1) + r.L1ToL0b(bk * dim * e, 1);  // dS, K
    if (queryPass) {
        c.mte1Acc = {c.mte1Dq};
    } else {
        c.mte1Acc = {mte1Dv, mte1Dv};
    }
    c.mmad = r.Mmad(bq * bk * dim, pieces);
    c.mmadS = r.Mmad(bq * bk * (dim + x), pieces);
    c.scorePieces = static_cast<uint32_t>(pieces);
    c.dqPieces = queryPass || d.deterministic ? 0
                                              : c.scorePieces * static_cast<uint32_t>(std::ceil(dim / dqColumns));
    c.fixScores = r.Fixpipe(bq * bk * d.scoreBytes, pieces);  // fp16 with fp16 scores
    c.fixDp = r.Fixpipe(bq * bk * 4, pieces);
    c.fixDq = r.Fixpipe(bq * dim * 4, std::max<uint32_t>(c.dqPieces, 1));
    c.fixUnit = queryPass ? r.Fixpipe(bq * dim * 4, 1) : r.Fixpipe(2 * bk * dim * 4, 2);
    const double tile = FloatRepeats(rows * bk);
    VecProgram v;
    if (d.scoreBytes < 4) {  // fp16 S: widened to fp32, clamped to +-65504
        const VecProgram widen = ScoreWidenProgram(rows, bk);
        v.insert(v.end(), widen.begin(), widen.end());
    }
    if (offset) {  // lse -= c scale: the offset, from lse (AddOffsetToLse), on one row each
        AppendVec(v, VecOp::kScalarArith, FloatRepeats(rows), true, 4);  // scale, clamp, * 16 scale
        AppendVec(v, VecOp::kCast, FloatRepeats(rows), true, 2);         // to fp16 and back
        AppendVec(v, VecOp::kBinary, FloatRepeats(rows), true);          // lse - c scale
        if (variant.softcap > 0) {  // softcap takes the scores themselves: + c scale per row
            AppendVec(v, VecOp::kBroadcast, std::ceil(rows / 8), true);
            AppendVec(v, VecOp::kBinary, tile, true);
        }
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
    if (!queryPass) {  // the query pass's cube reads dS only
        AppendVec(v, VecOp::kCast, tile, false);                    // P in the input dtype
    }
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
        AppendVec(v, VecOp::kSelect, tile, true, queryPass ? 1 : 2); // (P,) dP where kept
        AppendVec(v, VecOp::kScalarArith, tile, true);              // dP / (1 - p)
    }
    c.vecIn = r.L2ToUb(rows * bk * (d.scoreBytes + 4), 2);      // S, dP
    c.vecCompute = VecSeconds(v, r);
    const double pds = queryPass ? 1 : 2;
    c.vecOut = r.UbToL2(pds * rows * bk * e, pds);               // P and dS (dS)
    c.l2BytesStep = (queryPass ? 2 * bk * dim * e : 2 * bq * dim * e + bq * x * e)  // K, V (Q, dO, panel)
                    + pds * bq * bk * e                                 // P, dS (dS) into L1
                    + bq * bk * (d.scoreBytes + 4)                      // S, dP out
                    + (c.dqPieces > 0 ? 2 * bq * dim * 4 : 0)           // dQ read-add-write
                    + bq * bk * (d.scoreBytes + 4) + pds * bq * bk * e; // vector in and out
    c.l2BytesUnit = queryPass ? 2 * bq * dim * e + bq * x * e + bq * dim * 4  // Q, dO, panel in; dQ out
                              : 2 * bk * dim * e + 2 * bk * dim * 4;  // K, V in; dK, dV out
    return c;
}

struct Run {
    double seconds = 0;
    EngineSeconds busy{};
};

// The task graph of `units` units of `steps` steps each of one pass on one AI core.
Run Simulate(const BackwardDesign& d, const StepCosts& c, uint64_t units, uint64_t steps,
             double flag)
{
    using Id = Timeline::TaskId;
    struct StepIds {
        Id fixS = Timeline::kNone, fixDp = Timeline::kNone, loadPds = Timeline::kNone;
        Id vecIn = Timeline::kNone, vecCompute = Timeline::kNone, vecOut = Timeline::kNone;
        Id lastAcc = Timeline::kNone;
    };
    Timeline t(c.arrival);
    const uint64_t n = units * steps;
    std::vector<StepIds> ids(n);
    std::vector<Id> unitLoad(units), unitFix(units);
    std::vector<std::pair<Id, Id>> scratch;  // (mmad, fix) of each use of the L0C scratch
    Id operandsFreed = Timeline::kNone;  // the last Mmad that read L0A/L0B
    // One L1 -> L0 load, then `pieces` Mmads of 1/pieces of `mmad` each; with `fix`, each
    // piece leaves L0C through Fixpipe from one of the L0C scratch copies. L0A and L0B
    // hold one operand each (the kernel's aQue_/bQue_ have one buffer): the load waits
    // for the previous product's last Mmad.
    auto product = [&](double mte1, double mmad, uint32_t pieces, double fix, Id input) {
        const Id m1 = t.Add(Engine::kCubeMte1, mte1);
        t.After(m1, input);
        t.After(m1, operandsFreed);
        Id mm = Timeline::kNone, fx = Timeline::kNone;
        for (uint32_t p = 0; p < pieces; ++p) {
            const Id previous = mm;
            mm = t.Add(Engine::kCube, mmad / pieces);
            t.After(mm, previous == Timeline::kNone ? m1 : previous);
            if (fix > 0) {
                fx = t.Add(Engine::kFixpipe, fix / pieces);
                t.After(fx, mm);
                if (scratch.size() >= d.l0cScratchBuffers) {
                    t.After(mm, scratch[scratch.size() - d.l0cScratchBuffers].second);
                }
                scratch.emplace_back(mm, fx);
            }
        }
        operandsFreed = mm;
        return std::make_pair(mm, fx);
    };
    auto scores = [&](uint64_t i) {
        const uint64_t u = i / steps;
        if (i % steps == 0) {
            unitLoad[u] = t.Add(Engine::kCubeMte2, c.loadUnit);
            if (u >= d.kvL1Buffers) {  // the L1 buffer of unit u - kvL1Buffers is free
                t.After(unitLoad[u], ids[(u - d.kvL1Buffers + 1) * steps - 1].lastAcc);
            }
        }
        const Id load = t.Add(Engine::kCubeMte2, c.loadStep);
        t.After(load, unitLoad[u]);
        ids[i].fixS = product(c.mte1S, c.mmadS, c.scorePieces, c.fixScores, load).second;
        ids[i].fixDp = product(c.mte1Dp, c.mmad, c.scorePieces, c.fixDp, load).second;
        if (i >= d.exchangeSlots) {  // workspace slot free once the vector has read it
            t.After(ids[i].fixS, ids[i - d.exchangeSlots].vecIn, flag);
        }
    };
    auto gradients = [&](uint64_t i) {
        const uint64_t u = i / steps;
        ids[i].loadPds = t.Add(Engine::kCubeMte2, c.loadPds);
        t.After(ids[i].loadPds, ids[i].vecOut, flag);
        for (size_t k = 0; k < c.mte1Acc.size(); ++k) {
            ids[i].lastAcc = product(c.mte1Acc[k], c.mmad, 1, 0, ids[i].loadPds).first;
            if (k == 0 && i % steps == 0 && u > 0) {  // one accumulator: wait for its write-out
                t.After(ids[i].lastAcc, unitFix[u - 1]);
            }
        }
        if (c.dqPieces > 0) {
            product(c.mte1Dq, c.mmad, c.dqPieces, c.fixDq, ids[i].loadPds);
        }
        if ((i + 1) % steps == 0) {
            unitFix[u] = t.Add(Engine::kFixpipe, c.fixUnit);
            t.After(unitFix[u], ids[i].lastAcc);
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

// Key blocks that query block `qb` sees, per query head: the keys row + offset - left ..
// row + offset + right of its rows (the kernel's KeyBlockRange).
uint64_t StepsOfQueryBlock(const BackwardDesign& d, const BackwardProblem& pr, uint64_t qb)
{
    const int64_t offset = pr.seqlenK - pr.seqlenQ;
    const int64_t row0 = static_cast<int64_t>(qb * d.blockQ);
    const int64_t rows = std::min<int64_t>(d.blockQ, pr.seqlenQ - row0);
    const int64_t right = pr.causal ? 0 : pr.variant.windowRight;
    const int64_t first = pr.variant.windowLeft >= 0
                              ? std::clamp<int64_t>(row0 + offset - pr.variant.windowLeft, 0, pr.seqlenK)
                              : 0;
    const int64_t end = right >= 0 ? std::clamp<int64_t>(row0 + rows + offset + right, first, pr.seqlenK)
                                   : pr.seqlenK;
    if (end <= first) {
        return 0;
    }
    return static_cast<uint64_t>((end + d.blockK - 1) / d.blockK - first / d.blockK);
}

// A pass's main-loop time on one core: `units` units of `steps` steps in all.
struct CorePass {
    double seconds = 0;
    double l2Seconds = 0;
    EngineSeconds busy{};
    bool deadlock = false;
};

CorePass RunPassOnCore(const BackwardDesign& d, const StepCosts& c, uint64_t units, uint64_t steps,
                       double flag, double l2Share)
{
    CorePass pass;
    if (units == 0) {
        return pass;
    }
    const uint64_t perUnit = std::max<uint64_t>(1, (steps + units - 1) / units);
    const UnitCost u = CostUnit(d, c, perUnit, flag);
    pass.deadlock = u.deadlock;
    pass.seconds = u.fill + u.steady * units * (double(steps) / (perUnit * units));
    pass.l2Seconds = (c.l2BytesStep * steps + c.l2BytesUnit * units) / l2Share;
    for (uint32_t i = 0; i < kEngines; ++i) {
        pass.busy[i] = u.busy[i] * double(steps) / perUnit;
    }
    // No engine can be busier than the pass's time (the steady estimate of a short unit
    // can undercut its work when its fill overlaps the next unit's).
    pass.seconds = std::max(pass.seconds, *std::max_element(pass.busy.begin(), pass.busy.end()));
    return pass;
}

// Contiguous ranges of `steps` (one entry per unit), each cut where the running total
// passes the next c / cores share; adds each range's units and steps through `add`.
template <typename Add>
void SplitEvenly(const std::vector<uint64_t>& steps, size_t cores, Add add)
{
    uint64_t total = 0;
    for (uint64_t s : steps) {
        total += s;
    }
    uint64_t done = 0;
    size_t core = 0;
    for (uint64_t s : steps) {
        while (core + 1 < cores && done * cores >= total * (core + 1)) {
            ++core;
        }
        add(core, s);
        done += s;
    }
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
    std::vector<uint64_t> steps(pr.batch * pr.headsKv * keyBlocks);
    for (uint64_t u = 0; u < steps.size(); ++u) {
        steps[u] = group * StepsOfKeyBlock(d, pr, u % keyBlocks);
    }
    std::vector<BackwardCoreWork> work(std::max<uint32_t>(1, cores));
    SplitEvenly(steps, work.size(), [&](size_t core, uint64_t s) {
        work[core].units += 1;
        work[core].steps += s;
    });
    if (d.deterministic) {  // the query pass: query units split the same way
        const uint64_t queryBlocks = (pr.seqlenQ + d.blockQ - 1) / d.blockQ;
        steps.assign(pr.batch * pr.headsQ * queryBlocks, 0);
        for (uint64_t u = 0; u < steps.size(); ++u) {
            steps[u] = StepsOfQueryBlock(d, pr, u % queryBlocks);
        }
        SplitEvenly(steps, work.size(), [&](size_t core, uint64_t s) {
            work[core].queryUnits += 1;
            work[core].querySteps += s;
        });
    }
    return work;
}

namespace {

// BackwardSecondsPerScore's work; with `simulate` false only the shared L2's share (no
// simulation: a lower bound of the full figure, for pruning).
double SecondsPerScore(const BackwardDesign& d, const BackwardProblem& pr, uint32_t cores, const Platform& p,
                       bool simulate)
{
    const EngineRates r = RatesFor(p);
    const double l2Share = r.l2Aggregate / std::max<uint32_t>(1, cores);
    double seconds = 0;
    for (const bool queryPass : {false, true}) {
        if (queryPass && !d.deterministic) {
            break;
        }
        const StepCosts c = CostStep(d, pr, r, queryPass);
        // A unit as long as the middle key block's (query block's) of the problem.
        const uint64_t steps = std::max<uint64_t>(
            1, queryPass ? StepsOfQueryBlock(d, pr, (pr.seqlenQ + d.blockQ - 1) / d.blockQ / 2)
                         : pr.headsQ / pr.headsKv * StepsOfKeyBlock(d, pr, (pr.seqlenK + d.blockK - 1) / d.blockK / 2));
        const double l2 = (c.l2BytesStep * steps + c.l2BytesUnit) / l2Share;
        const double compute = simulate ? CostUnit(d, c, steps, r.crossCoreFlag).steady : 0;
        seconds += std::max(compute, l2) / (double(steps) * d.blockQ * d.blockK);
    }
    return seconds;
}

}  // namespace

double BackwardSecondsPerScore(const BackwardDesign& d, const BackwardProblem& pr, uint32_t cores,
                               const Platform& p)
{
    return SecondsPerScore(d, pr, cores, p, true);
}

double BackwardL2SecondsPerScore(const BackwardDesign& d, const BackwardProblem& pr, uint32_t cores,
                                 const Platform& p)
{
    return SecondsPerScore(d, pr, cores, p, false);
}

BackwardPrediction PredictBackward(const BackwardDesign& d, const BackwardProblem& pr,
                                   const std::vector<BackwardCoreWork>& cores, const Platform& p)
{
    const EngineRates r = RatesFor(p);
    const StepCosts c = CostStep(d, pr, r, false);
    const StepCosts query = CostStep(d, pr, r, true);
    const double e = d.elemBytes;
    const double queryRows = double(pr.batch) * pr.headsQ * pr.seqlenQ;
    const double keyRows = double(pr.batch) * pr.headsKv * pr.seqlenK;
    const double dim = d.headDimPad;
    BackwardPrediction out;
    // Pre-pass: read dO and O, write D, zero the dQ accumulator; fp16 scores: read lse,
    // write the offset panels (the cube's first S waits for them: the pre-pass and the
    // main loop are serial here either way).
    const double x = d.scoreOffsetColumns;
    out.preSeconds = PassSeconds(2 * queryRows * dim * e + (x > 0 ? queryRows * 4 : 0),
                                 queryRows * 4 + queryRows * dim * 4 + queryRows * x * e, p, r);
    // Post-pass: read the fp32 dQ, dK, dV; write dQ, dK, dV.
    out.postSeconds = PassSeconds(queryRows * dim * 4 + 2 * keyRows * dim * 4,
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
        // The key pass, then (deterministic dQ) the query pass, on this core.
        const CorePass keys = RunPassOnCore(d, c, w.units, w.steps, r.crossCoreFlag, l2Share);
        const CorePass queries = RunPassOnCore(d, query, w.queryUnits, w.querySteps, r.crossCoreFlag, l2Share);
        deadlock = deadlock || keys.deadlock || queries.deadlock;
        const double compute = keys.seconds + queries.seconds;
        const double l2 = keys.l2Seconds + queries.l2Seconds;
        if (std::max(compute, l2) > out.mainSeconds) {
            out.mainSeconds = std::max(compute, l2);
            out.queryPassSeconds = std::max(queries.seconds, queries.l2Seconds);
            l2Bound = l2 > compute;
            for (uint32_t i = 0; i < kEngines; ++i) {
                slowestBusy[i] = keys.busy[i] + queries.busy[i];
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
