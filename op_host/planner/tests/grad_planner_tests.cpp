// Backward planner tests: every plan fits (accounted from the kernel's GradBufferBytes)
// and its split walks every work unit exactly once (10,000 random shapes), the split is
// balanced (causal too), deterministic dQ chunks never depend on the core count, the
// workspace is the kernel's layout, refusals say what is wrong. Exit status 0 = all
// passed. `grad_planner_tests --seed N` reruns a draw.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "grad_planner.h"
#include "planner_test_support.h"

using namespace flash_cann;
using namespace flash_cann_test;

namespace {

std::string Describe(const GradPlanRequest& r, uint32_t cores)
{
    return flash_cann_test::Describe(r.problem, cores) +
           (r.deterministic ? " deterministic" : "");
}

// Every buffer the kernel allocates appears in the accounting: the listed sizes are, as
// a multiset, exactly the fields of GradBufferBytes, less the key mask's without a mask
// (so a buffer left out of the list, or listed with the wrong formula, fails here; the
// copy counts are checked against the kernel's InitBuffer calls by the twin).
void CheckAccountingCoversGradBufferBytes(const GradPlan& plan, uint32_t elemBytes, bool hasMask,
                                          const std::string& what)
{
    const GradBufferBytes b = ComputeGradBufferBytes(plan.tiling, elemBytes);
    static_assert(sizeof(GradBufferBytes) % sizeof(uint32_t) == 0, "uint32_t fields only");
    std::vector<uint64_t> fields;
    for (size_t i = 0; i < sizeof(b) / sizeof(uint32_t); ++i) {
        const size_t offset = i * sizeof(uint32_t);
        if (!hasMask && (offset == offsetof(GradBufferBytes, maskUb) ||
                         offset == offsetof(GradBufferBytes, maskHalfUb))) {
            continue;
        }
        uint32_t value;
        std::memcpy(&value, reinterpret_cast<const char*>(&b) + offset, sizeof(value));
        if (value == 0 && offset >= offsetof(GradBufferBytes, tanhUb)) {
            continue;  // a feature the call does not use: no buffer
        }
        fields.push_back(value);
    }
    std::vector<uint64_t> listed;
    for (const BufferUse& use : plan.buffers) {
        listed.push_back(use.bytes);
    }
    std::sort(fields.begin(), fields.end());
    std::sort(listed.begin(), listed.end());
    EXPECT(fields == listed, "%s: the buffer list (%zu entries) is not GradBufferBytes (%zu fields)",
           what.c_str(), listed.size(), fields.size());
}

// Walk every unit of every core with the kernel's UnitAt: the ranges partition the unit
// space in order; each (batch, head_kv) pair's key blocks tile [0, seqlen_k) exactly
// once; the first query block a unit visits is exactly the first that sees one of its
// keys (bottom-right causal); the per-core work is what the units add up to. The steps
// of each core's first and last unit are walked with StepAt.
void CheckUnitWalk(const GradPlan& plan, bool causal, bool deterministic, const std::string& what)
{
    const GradTilingData& t = plan.tiling;
    const uint64_t pairs = uint64_t{t.batch} * t.headsKv;
    EXPECT(t.units == pairs * t.keyBlocks && t.unitStart[0] == 0 &&
               t.unitStart[t.usedCores] == t.units,
           "%s: the ranges do not span the %llu units", what.c_str(),
           static_cast<unsigned long long>(t.units));
    uint64_t expectedPair = 0;
    uint64_t keysCovered = 0;
    for (uint32_t c = 0; c < t.usedCores; ++c) {
        // A core may have no units only where the query pass needs more cores than the key pass.
        EXPECT(t.unitStart[c] < t.unitStart[c + 1] || (deterministic && t.unitStart[c] == t.unitStart[c + 1]),
               "%s: core %u has no units", what.c_str(), c);
        uint64_t steps = 0;
        double macs = 0;
        for (uint64_t unit = t.unitStart[c]; unit < t.unitStart[c + 1]; ++unit) {
            const GradUnit u = causal ? UnitAt<true>(t, unit) : UnitAt<false>(t, unit);
            const uint64_t pair = uint64_t{u.batch} * t.headsKv + u.headKv;
            if (u.keyBlock == 0 && unit > 0) {
                EXPECT(keysCovered == t.seqlenK, "%s: pair %llu covered %llu of %u keys",
                       what.c_str(), static_cast<unsigned long long>(expectedPair),
                       static_cast<unsigned long long>(keysCovered), t.seqlenK);
                ++expectedPair;
                keysCovered = 0;
            }
            EXPECT(pair == expectedPair && u.batch < t.batch && u.headKv < t.headsKv,
                   "%s: unit %llu is in pair %llu, expected %llu", what.c_str(),
                   static_cast<unsigned long long>(unit), static_cast<unsigned long long>(pair),
                   static_cast<unsigned long long>(expectedPair));
            EXPECT(u.key0 == keysCovered && u.keys >= 1 && u.keys <= t.blockK,
                   "%s: unit %llu keys [%u, +%u)", what.c_str(),
                   static_cast<unsigned long long>(unit), u.key0, u.keys);
            keysCovered += u.keys;
            // Query block b sees the unit iff one of its rows i sees one of its keys j:
            // i + offset - left <= j <= i + offset + right (right 0 with causal; a
            // negative bound is unbounded), checked row by row.
            auto seesUnit = [&](uint32_t block) {
                const int64_t right = causal ? 0 : t.variant.windowRight;
                const int64_t left = t.variant.windowLeft;
                const int64_t end = std::min<int64_t>(t.seqlenQ, int64_t{block + 1} * t.blockQ);
                for (int64_t i = int64_t{block} * t.blockQ; i < end; ++i) {
                    const int64_t lo = left < 0 ? 0 : i + t.causalOffset - left;
                    const int64_t hi = right < 0 ? int64_t{t.seqlenK} - 1 : i + t.causalOffset + right;
                    if (std::max<int64_t>(lo, u.key0) <= std::min<int64_t>(hi, u.key0 + u.keys - 1)) {
                        return true;
                    }
                }
                return false;
            };
            // The rows that see a key interval are an interval (the band is convex), so the
            // blocks that do are too: checking the blocks at both ends of the walk's range
            // and just outside it decides it.
            const uint32_t queryBlocks = (t.seqlenQ + t.blockQ - 1) / t.blockQ;
            const uint32_t first = u.firstQueryBlock, end = u.endQueryBlock;
            bool exact = first <= end && end <= queryBlocks;
            if (exact && first < end) {
                exact = seesUnit(first) && seesUnit(end - 1) && (first == 0 || !seesUnit(first - 1)) &&
                        (end == queryBlocks || !seesUnit(end));
            } else if (exact) {  // no step: no block may see the unit (the first 64 checked)
                for (uint32_t block = 0; exact && block < queryBlocks && block < 64; ++block) {
                    exact = !seesUnit(block);
                }
            }
            EXPECT(exact, "%s: unit %llu walks query blocks [%u, %u) of %u", what.c_str(),
                   static_cast<unsigned long long>(unit), u.firstQueryBlock, u.endQueryBlock,
                   queryBlocks);
            steps += uint64_t{t.group} * (u.endQueryBlock - u.firstQueryBlock);
            macs += GradUnitMacs(t, causal, deterministic, unit);
            if (unit == t.unitStart[c] || unit + 1 == t.unitStart[c + 1]) {
                GradStep step{};
                uint32_t index = 0;
                while (StepAt(t, u, index, step)) {
                    EXPECT(step.headQ / t.group == u.headKv && step.rows >= 1 &&
                               step.rows <= t.blockQ && step.row0 + step.rows <= t.seqlenQ &&
                               step.first == (index == 0),
                           "%s: unit %llu step %u", what.c_str(),
                           static_cast<unsigned long long>(unit), index);
                    ++index;
                }
                EXPECT(index == GradUnitSteps(t, causal, unit) && (index == 0 || step.last),
                       "%s: unit %llu walked %u steps, UnitCost says %llu", what.c_str(),
                       static_cast<unsigned long long>(unit), index,
                       static_cast<unsigned long long>(GradUnitSteps(t, causal, unit)));
            }
        }
        const GradCoreWork& core = plan.cores[c];
        EXPECT(core.unitBegin == t.unitStart[c] && core.unitEnd == t.unitStart[c + 1] &&
                   core.steps == steps && std::fabs(core.macs - macs) <= 1e-9 * macs,
               "%s: core %u work (%llu steps, %g MACs) is not its units' (%llu, %g)",
               what.c_str(), c, static_cast<unsigned long long>(core.steps), core.macs,
               static_cast<unsigned long long>(steps), macs);
    }
    EXPECT(expectedPair + 1 == pairs && keysCovered == t.seqlenK,
           "%s: the walk ended in pair %llu with %llu keys", what.c_str(),
           static_cast<unsigned long long>(expectedPair),
           static_cast<unsigned long long>(keysCovered));
}

// The deterministic dQ's query pass: the ranges partition the query units in order; a
// query unit walks exactly the key blocks whose units walk its query block (the two
// passes cover the same (query block, key block) steps), checked on each core's first and
// last query unit; the per-core work is what the query units add up to. Fast dQ: no query
// pass.
void CheckQueryWalk(const GradPlan& plan, bool causal, bool deterministic, const std::string& what)
{
    const GradTilingData& t = plan.tiling;
    if (!deterministic) {
        EXPECT(t.queryUnits == 0 && t.queryStart[t.usedCores] == 0, "%s: a query pass without the "
               "deterministic dQ", what.c_str());
        return;
    }
    EXPECT(t.queryBlocks == (t.seqlenQ + t.blockQ - 1) / t.blockQ &&
               t.queryUnits == uint64_t{t.batch} * t.headsQ * t.queryBlocks && t.queryStart[0] == 0 &&
               t.queryStart[t.usedCores] == t.queryUnits,
           "%s: the query ranges do not span the %llu query units", what.c_str(),
           static_cast<unsigned long long>(t.queryUnits));
    for (uint32_t c = 0; c < t.usedCores; ++c) {
        EXPECT(t.queryStart[c] <= t.queryStart[c + 1], "%s: core %u query range", what.c_str(), c);
        uint64_t steps = 0;
        for (uint64_t q = t.queryStart[c]; q < t.queryStart[c + 1]; ++q) {
            steps += GradQueryUnitSteps(t, causal, q);
            if (q != t.queryStart[c] && q + 1 != t.queryStart[c + 1]) {
                continue;
            }
            const GradQueryUnit unit = causal ? QueryUnitAt<true>(t, q) : QueryUnitAt<false>(t, q);
            const uint32_t queryBlock = unit.row0 / t.blockQ;
            const uint64_t pair = uint64_t{unit.batch} * t.headsKv + unit.headQ / t.group;
            for (uint32_t kb = 0; kb < t.keyBlocks; ++kb) {
                const GradUnit key = causal ? UnitAt<true>(t, pair * t.keyBlocks + kb)
                                            : UnitAt<false>(t, pair * t.keyBlocks + kb);
                const bool walked = key.firstQueryBlock <= queryBlock && queryBlock < key.endQueryBlock;
                const bool mine = unit.firstKeyBlock <= kb && kb < unit.endKeyBlock;
                EXPECT(walked == mine, "%s: query unit %llu and key block %u: key pass %d, query pass %d",
                       what.c_str(), static_cast<unsigned long long>(q), kb, walked, mine);
            }
            GradUnit stepUnit{};
            GradStep step{};
            uint32_t index = 0;
            while (causal ? QueryStepAt<true>(t, unit, index, stepUnit, step)
                          : QueryStepAt<false>(t, unit, index, stepUnit, step)) {
                EXPECT(stepUnit.keyBlock == unit.firstKeyBlock + index && step.headQ == unit.headQ &&
                           step.row0 == unit.row0 && step.first == (index == 0) &&
                           step.last == (stepUnit.keyBlock + 1 == unit.endKeyBlock),
                       "%s: query unit %llu step %u", what.c_str(), static_cast<unsigned long long>(q), index);
                ++index;
            }
        }
        const GradCoreWork& core = plan.cores[c];
        EXPECT(core.queryBegin == t.queryStart[c] && core.queryEnd == t.queryStart[c + 1] &&
                   core.querySteps == steps,
               "%s: core %u query work (%llu steps) is not its query units' (%llu)", what.c_str(), c,
               static_cast<unsigned long long>(core.querySteps), static_cast<unsigned long long>(steps));
    }
}

void CheckGradPlan(const GradPlanRequest& r, uint32_t cores)
{
    const std::string what = Describe(r, cores);
    const GradPlanResult result = MakeGradPlan(r, WithCores(cores));
    EXPECT(result.ok(), "%s: refused: %s", what.c_str(), result.error.c_str());
    if (!result.ok()) {
        return;
    }
    const GradPlan& plan = result.plan;
    const GradTilingData& t = plan.tiling;
    const uint32_t elemBytes = ElementBytes(r.problem.dtype);
    for (const LevelUse& l : plan.levels) {
        EXPECT(l.used <= l.capacity, "%s: %s uses %llu > %llu", what.c_str(),
               MemLevelName(l.level), static_cast<unsigned long long>(l.used),
               static_cast<unsigned long long>(l.capacity));
    }
    CheckAccountingCoversGradBufferBytes(plan, elemBytes, r.problem.hasMask, what);
    EXPECT(t.blockQ % kCubeBlock == 0 && t.blockK % kCubeBlock == 0 && t.passRows % 8 == 0 &&
               t.passRows > 0 && t.keyBlocks == (t.seqlenK + t.blockK - 1) / t.blockK,
           "%s: blocks %ux%u, pass rows %u", what.c_str(), t.blockQ, t.blockK, t.passRows);
    // The kernel allocates l0cScratchBuffers product copies (the level totals above count
    // them) of one piece; the deterministic query pass's dQ fits where dK and dV were.
    EXPECT(t.l0cScratchBuffers >= 1 && t.l0cScratchBuffers <= kGradMaxL0cScratch &&
               t.productRows % kCubeBlock == 0 && t.productRows >= kCubeBlock && t.productRows <= t.blockQ &&
               t.dqColumns % kCubeBlock == 0 && t.dqColumns >= kCubeBlock && t.dqColumns <= t.headDimPad &&
               (!r.deterministic || t.blockQ <= 2 * t.blockK),
           "%s: %u L0C scratch copies, blocks %ux%u, pieces %u rows x %u columns", what.c_str(),
           t.l0cScratchBuffers, t.blockQ, t.blockK, t.productRows, t.dqColumns);
    EXPECT(t.usedCores >= 1 && t.usedCores <= cores && plan.blockDim == t.usedCores,
           "%s: used cores %u, block dim %u", what.c_str(), t.usedCores, plan.blockDim);
    CheckUnitWalk(plan, r.problem.causal, r.deterministic, what);
    CheckQueryWalk(plan, r.problem.causal, r.deterministic, what);
    const GradWorkspace ws(t, elemBytes);
    const uint64_t dq = GradWorkspace::Align(uint64_t{t.batch} * t.headsQ * t.seqlenQ * t.headDimPad * 4);
    EXPECT(plan.userWorkspaceBytes == ws.total &&
               plan.workspace.dq == dq &&
               plan.workspace.exchange == t.usedCores * ws.exchangePerCore &&
               plan.workspace.offsets == ws.total - ws.offsets &&
               plan.workspace.delta + plan.workspace.dq + plan.workspace.dkdv +
                       plan.workspace.exchange + plan.workspace.offsets == ws.total,
           "%s: workspace %llu", what.c_str(), static_cast<unsigned long long>(ws.total));
    const uint64_t key = 20000 + 1000 * r.deterministic + 100 * (r.problem.dtype == DType::BFloat16) +
                         10 * r.problem.causal + r.problem.hasMask;
    EXPECT(plan.tilingKey == key, "%s: tiling key %llu", what.c_str(),
           static_cast<unsigned long long>(plan.tilingKey));
}

// The schedule model's prediction of a plan is a time and a utilisation within the peak.
void CheckGradPrediction(const GradPlanRequest& r, uint32_t cores)
{
    const Platform platform = WithCores(cores);
    const GradPlanResult result = MakeGradPlan(r, platform);
    if (!result.ok()) {
        return;  // CheckGradPlan reports it
    }
    const std::string what = Describe(r, cores);
    const BackwardPrediction p = PredictGradPlan(result.plan, r, platform);
    EXPECT(p.seconds > 0 && p.mainSeconds > 0 && p.cubeUtilization > 0 && p.cubeUtilization <= 1,
           "%s: prediction %g s, utilisation %g", what.c_str(), p.seconds, p.cubeUtilization);
}

// Features as the checks normalise them: a window side < seqlen_k or -1, the right
// side -1 with causal (variant.window_bounds).
VariantTiling RandomGradVariant(std::mt19937_64& rng, const PlanRequest& r)
{
    auto side = [&] {
        return rng() % 3 == 0 ? int64_t{-1} : static_cast<int64_t>(rng() % r.seqlenK);
    };
    const int64_t left = side();
    const int64_t right = r.causal ? -1 : side();
    const double softcap = rng() & 1 ? 0.0 : 5.0;
    const Alibi alibi = static_cast<Alibi>(rng() % 3);
    const double dropout = rng() % 4 == 0 ? 0.1 : 0.0;
    return MakeVariant(left, right, softcap, dropout, alibi, rng() & 1);
}

void TestRandomShapes(uint64_t seed)
{
    std::mt19937_64 rng(seed);
    const int kShapes = 10000;
    const int kPredictEvery = 20;  // the schedule model costs ~1 ms a plan
    const int failuresBefore = g_failures;
    for (int i = 0; i < kShapes && g_failures - failuresBefore < 20; ++i) {
        GradPlanRequest r;
        // Every unit is walked: at most ~1M query rows per plan.
        r.problem = RandomProblem(rng, int64_t{1} << 20);
        r.deterministic = rng() & 1;
        if (rng() % 3 == 0) {  // the features
            r.problem.variant = RandomGradVariant(rng, r.problem);
        }
        const uint32_t cores = RandomCores(rng);
        CheckGradPlan(r, cores);
        if (i % kPredictEvery == 0) {
            CheckGradPrediction(r, cores);
        }
    }
    std::printf("random shapes: %d backward plans (seed %llu) fit and walk every unit once; "
                "%d predicted\n", kShapes, static_cast<unsigned long long>(seed),
                kShapes / kPredictEvery);
}

// The deterministic dQ's summation order is fixed by the blocks (a query unit adds its key
// blocks in order), so the blocks and pieces must be the same for every core count.
void TestDeterministicBlocksIgnoreCores()
{
    GradPlanRequest r;
    r.problem.batch = 1;
    r.problem.headsQ = 8;
    r.problem.headsKv = 2;
    r.problem.seqlenQ = r.problem.seqlenK = 5000;
    r.problem.headDim = 128;
    r.problem.causal = true;
    r.problem.scale = 0.1;
    r.deterministic = true;
    const GradTilingData reference = MakeGradPlan(r, WithCores(24)).plan.tiling;
    for (uint32_t cores : {1u, 3u, 7u, 20u, 48u}) {
        const GradTilingData t = MakeGradPlan(r, WithCores(cores)).plan.tiling;
        EXPECT(t.blockQ == reference.blockQ && t.blockK == reference.blockK &&
                   t.productRows == reference.productRows && t.dqColumns == reference.dqColumns,
               "%u cores: %ux%u blocks, 24 cores: %ux%u", cores, t.blockQ, t.blockK, reference.blockQ,
               reference.blockK);
    }
    std::printf("deterministic dQ: %ux%u blocks for every core count\n", reference.blockQ, reference.blockK);
}

// The work of each split unit of one segment: the key blocks of a (batch, head_kv) pair,
// or (query pass) the query blocks of a (batch, head_q) pair.
std::vector<double> SplitUnitWork(const GradTilingData& t, bool causal, bool deterministic, bool queryPass)
{
    std::vector<double> work(queryPass ? t.queryBlocks : t.keyBlocks, 0.0);
    for (uint32_t block = 0; block < work.size(); ++block) {
        work[block] = queryPass ? GradQueryUnitMacs(t, causal, block) : GradUnitMacs(t, causal, deterministic, block);
    }
    return work;
}

// The least possible work of the busiest of `cores` contiguous ranges over `pairs`
// repetitions of `units`: an O(units^2 x cores) dynamic programme, independent of the
// planner's binary search.
double OptimalBusiest(const std::vector<double>& units, uint64_t pairs, uint32_t cores)
{
    std::vector<double> prefix{0};
    for (uint64_t p = 0; p < pairs; ++p) {
        for (double w : units) {
            prefix.push_back(prefix.back() + w);
        }
    }
    const size_t n = prefix.size() - 1;
    const double inf = 1e300;
    std::vector<double> best(n + 1, inf);  // best[i]: units [0, i) in the ranges so far
    best[0] = 0;
    for (uint32_t c = 0; c < cores; ++c) {
        std::vector<double> next(best);
        for (size_t end = 1; end <= n; ++end) {
            for (size_t begin = 0; begin < end; ++begin) {
                next[end] = std::min(next[end], std::max(best[begin], prefix[end] - prefix[begin]));
            }
        }
        best = next;
    }
    return best[n];
}

// The split is the least-busiest contiguous split: equal to an independent dynamic
// programme on small shapes; on every shape at most one split unit above the mean
// (which the optimum always achieves). Where that unit is at most 5% of the mean
// (enough units per core: ~20 of equal work, ~40 causal), max/mean work <= 1.05.
void TestBalance()
{
    double worst[2][2] = {};
    double sum[2][2] = {};
    int count[2][2] = {};
    int optimal = 0;
    for (bool deterministic : {false, true}) {
        for (bool causal : {false, true}) {
            for (uint32_t cores : {20u, 24u, 7u, 48u}) {
                for (int64_t seqlen : {200, 1024, 3000, 4096, 8192, 16384, 65536, 131072}) {
                    for (int64_t heads : {1, 3, 8, 32}) {
                        for (int64_t batch : {1, 2, 5}) {
                            GradPlanRequest r;
                            r.problem.batch = batch;
                            r.problem.headsQ = heads;
                            r.problem.headsKv = heads;
                            r.problem.seqlenQ = r.problem.seqlenK = seqlen;
                            r.problem.headDim = 128;
                            r.problem.causal = causal;
                            r.problem.scale = 0.125;
                            r.deterministic = deterministic;
                            const std::string what = Describe(r, cores);
                            const GradPlanResult result = MakeGradPlan(r, WithCores(cores));
                            if (!result.ok()) {
                                EXPECT(false, "%s refused: %s", what.c_str(), result.error.c_str());
                                continue;
                            }
                            const GradPlan& plan = result.plan;
                            const GradTilingData& t = plan.tiling;
                            // Each pass is split on its own: both must be least-busiest.
                            double heaviestShare = 0;  // the heaviest unit / a core's mean work
                            for (const bool queryPass : {false, true}) {
                                if (queryPass && !deterministic) {
                                    break;
                                }
                                const std::vector<double> units = SplitUnitWork(t, causal, deterministic, queryPass);
                                const uint64_t pairs = uint64_t{t.batch} * (queryPass ? t.headsQ : t.headsKv);
                                double total = 0;
                                double busiest = 0;
                                for (const GradCoreWork& c : plan.cores) {
                                    const double w = queryPass ? c.queryMacs : c.macs;
                                    total += w;
                                    busiest = std::max(busiest, w);
                                }
                                const double passMean = total / cores;
                                const double passHeaviest = *std::max_element(units.begin(), units.end());
                                heaviestShare = std::max(heaviestShare, passHeaviest / passMean);
                                EXPECT(busiest <= (passMean + passHeaviest) * (1 + 1e-9),
                                       "%s: busiest core %g > mean %g + heaviest unit %g",
                                       what.c_str(), busiest, passMean, passHeaviest);
                                if (units.size() * pairs <= 300) {
                                    const double best = OptimalBusiest(units, pairs, cores);
                                    EXPECT(busiest <= best * (1 + 1e-9),
                                           "%s: busiest core %g, the optimum is %g", what.c_str(),
                                           busiest, best);
                                    ++optimal;
                                }
                            }
                            if (heaviestShare > 0.05) {
                                continue;
                            }
                            EXPECT(plan.imbalance <= 1.05, "%s: max/mean work %.4f", what.c_str(),
                                   plan.imbalance);
                            worst[deterministic][causal] =
                                std::max(worst[deterministic][causal], plan.imbalance);
                            sum[deterministic][causal] += plan.imbalance;
                            count[deterministic][causal] += 1;
                        }
                    }
                }
            }
        }
    }
    std::printf("balance: the split is optimal on %d small shapes (dynamic programme)\n", optimal);
    for (int deterministic : {0, 1}) {
        for (int causal : {0, 1}) {
            std::printf("balance (%s, %s dQ): %d shapes whose heaviest unit is <= 5%% of a "
                        "core's mean work, max/mean work per core: worst %.4f, average %.4f\n",
                        causal ? "causal" : "non-causal", deterministic ? "deterministic" : "fast",
                        count[deterministic][causal], worst[deterministic][causal],
                        sum[deterministic][causal] / std::max(1, count[deterministic][causal]));
        }
    }
}

void ExpectRefusal(const GradPlanRequest& r, const Platform& platform, const std::string& fragment)
{
    const GradPlanResult result = MakeGradPlan(r, platform);
    EXPECT(!result.ok(), "%s was planned, expected a refusal mentioning '%s'",
           Describe(r, platform.aicCores).c_str(), fragment.c_str());
    EXPECT(result.error.find(fragment) != std::string::npos, "refusal '%s' lacks '%s'",
           result.error.c_str(), fragment.c_str());
}

void TestRefusals()
{
    GradPlanRequest ok;
    ok.problem.batch = 2;
    ok.problem.headsQ = 8;
    ok.problem.headsKv = 2;
    ok.problem.seqlenQ = ok.problem.seqlenK = 512;
    ok.problem.headDim = 128;
    ok.problem.scale = 0.1;
    const Platform b2 = *FindPlatform("Ascend910B2");
    EXPECT(MakeGradPlan(ok, b2).ok(), "baseline refused");
    auto with = [&](const std::function<void(GradPlanRequest&)>& edit) {
        GradPlanRequest r = ok;
        edit(r);
        return r;
    };
    ExpectRefusal(with([](GradPlanRequest& r) { r.problem.headDim = 257; }), b2,
                  "head_dim 257 exceeds the kernel's maximum of 256");
    ExpectRefusal(with([](GradPlanRequest& r) { r.problem.dtype = DType::Float32; }), b2,
                  "dtype float32 is not supported");
    ExpectRefusal(with([](GradPlanRequest& r) { r.problem.headsKv = 3; }), b2,
                  "heads_q (8) must be a multiple of heads_kv (3)");
    ExpectRefusal(with([](GradPlanRequest& r) { r.problem.seqlenQ = 0; }), b2,
                  "seqlen_q must be >= 1 (got 0)");
    ExpectRefusal(with([](GradPlanRequest& r) {
                      r.problem.batch = int64_t{1} << 24;
                      r.problem.headsQ = r.problem.headsKv = int64_t{1} << 14;
                      r.problem.seqlenQ = r.problem.seqlenK = int64_t{1} << 14;
                      r.problem.headDim = 256;
                  }),
                  b2, "the backward's fp32 workspace (dQ, dK, dV: ");
    Platform noCores = b2;
    noCores.aicCores = 0;
    ExpectRefusal(ok, noCores, "reports no AI cores");
    Platform smallL0c = b2;
    smallL0c.l0cBytes = 16 * 1024;
    ExpectRefusal(ok, smallL0c, "head_dim 128: no block shape of the backward fits Ascend910B2's "
                                "buffers (the smallest, 16x16, needs L0C 17408 of 16384 bytes");
    std::printf("refusals: 7 unsupported inputs refused with specific messages\n");
}

}  // namespace

// A sliding window's plan costs its band: the units outside it have no step, and the
// split balances the visible work (max / mean <= 1.05 on 24 cores).
void TestWindowBalance()
{
    for (const int64_t left : {int64_t{4096}, int64_t{2048}}) {
        GradPlanRequest r;
        r.problem.batch = 1;
        r.problem.headsQ = r.problem.headsKv = 16;
        r.problem.seqlenQ = r.problem.seqlenK = 32768;
        r.problem.headDim = 128;
        r.problem.scale = 0.1;
        r.problem.variant = MakeVariant(left, left == 4096 ? 0 : left, 0.0, 0.0, Alibi::kNone, false);
        const GradPlanResult windowed = MakeGradPlan(r, WithCores(24));
        r.problem.variant = kPlainVariant;
        const GradPlanResult full = MakeGradPlan(r, WithCores(24));
        double work = 0, fullWork = 0;
        for (const GradCoreWork& c : windowed.plan.cores) {
            work += c.macs;
        }
        for (const GradCoreWork& c : full.plan.cores) {
            fullWork += c.macs;
        }
        const double band = (left + (left == 4096 ? 0 : left) + 1) / 32768.0;
        EXPECT(windowed.ok() && windowed.plan.imbalance <= 1.05 && work < 1.15 * band * fullWork,
               "window (%lld): imbalance %g, work %g of the square's (band %g)",
               static_cast<long long>(left), windowed.plan.imbalance, work / fullWork, band);
        std::printf("window %lld at 32k: %.3f of the square's MACs (band %.3f), imbalance %.3f\n",
                    static_cast<long long>(left), work / fullWork, band, windowed.plan.imbalance);
    }
}

int main(int argc, char** argv)
{
    uint64_t seed = 20261123;
    if (argc == 3 && std::string(argv[1]) == "--seed") {
        seed = std::strtoull(argv[2], nullptr, 10);
    }
    std::printf("grad tiling data: %zu bytes (limit 2048)\n", sizeof(GradTilingData));
    EXPECT(sizeof(GradTilingData) <= 2048, "GradTilingData is %zu bytes", sizeof(GradTilingData));
    TestRefusals();
    TestDeterministicBlocksIgnoreCores();
    TestBalance();
    TestWindowBalance();
    TestRandomShapes(seed);
    if (g_failures != 0) {
        std::fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all backward planner tests passed\n");
    return 0;
}
