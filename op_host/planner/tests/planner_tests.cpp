// Planner tests: every plan fits and covers the work exactly once (10,000 random
// shapes), the split is balanced, refusals say what is wrong, the tiling data fits
// CANN's buffer. Exit status 0 = all passed. `planner_tests --seed N` reruns a draw.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backward_model.h"
#include "cost_model.h"
#include "engine_rates.h"
#include "grad_planner.h"
#include "plan_json.h"
#include "planner.h"
#include "work_model.h"
#include "planner_test_support.h"

using namespace flash_cann;
using namespace flash_cann_test;

namespace {

// Visible keys of query row `row` (bottom-right causal).
// Keys [first, end) row `row` sees under causal and the sliding window (first >= end:
// none), from the variant's definition, not the kernel's helper.
std::pair<int64_t, int64_t> VisibleKeys(const TilingData& t, bool causal, uint32_t row)
{
    const int64_t diagonal = static_cast<int64_t>(row) + t.causalOffset;
    int64_t end = t.seqlenK;
    if (causal || t.variant.windowRight >= 0) {
        end = std::min(end, diagonal + (causal ? 0 : t.variant.windowRight) + 1);
    }
    const int64_t first = t.variant.windowLeft >= 0 ? std::max<int64_t>(0, diagonal - t.variant.windowLeft) : 0;
    return {first, end};
}

// Half the random problems get random features (window, softcap, ALiBi, sinks).
void AddRandomVariant(std::mt19937_64& rng, PlanRequest& r)
{
    if (rng() & 1) {
        return;
    }
    const auto bound = [&] { return rng() % 3 == 0 ? -1 : static_cast<int64_t>(rng() % (r.seqlenK + 1)); };
    r.variant = MakeVariant(bound(), r.causal ? -1 : bound(), (rng() & 1) ? 30.0 : 0.0, 0.0,
                            static_cast<Alibi>(rng() % 3), rng() & 1);
}

// Every buffer fits its level; the row ranges partition all rows; walking each core's
// tiles with the kernel's NextTile visits every query row exactly once, each tile lies
// in one (batch, head) pair and spans at most blockQ rows, and the key blocks a tile
// visits (TileKeys) are exactly those holding a key visible to some of its rows.
void CheckPlan(const PlanRequest& r, uint32_t cores)
{
    const Platform platform = WithCores(cores);
    const PlanResult result = MakePlan(r, platform);
    const std::string what = Describe(r, cores);
    EXPECT(result.ok(), "%s: refused: %s", what.c_str(), result.error.c_str());
    if (!result.ok()) {
        return;
    }
    const Plan& plan = result.plan;
    const TilingData& t = plan.tiling;
    for (const LevelUse& l : plan.levels) {
        EXPECT(l.used <= l.capacity, "%s: %s uses %llu > %llu", what.c_str(),
               MemLevelName(l.level), static_cast<unsigned long long>(l.used),
               static_cast<unsigned long long>(l.capacity));
    }
    EXPECT(t.headDimPad % kCubeBlock == 0 && t.headDimPad >= t.headDim &&
               t.headDimPad - t.headDim < kCubeBlock,
           "%s: head_dim padding", what.c_str());
    // The kernel's shape rules: a round is at most kMaxRoundKeys keys (the vector cores'
    // row reduction), 1024 only for long non-causal key sequences, slices start 32-byte
    // aligned, 256-row tiles only for long sequences.
    EXPECT(RoundKeys(t) <= kMaxRoundKeys && t.blockK % 64 == 0 && t.keyStack >= 1,
           "%s: round of %u x %u keys", what.c_str(), t.keyStack, t.blockK);
    EXPECT(RoundKeys(t) <= 512 || (!r.causal && r.seqlenK >= 4096), "%s: %u-key rounds",
           what.c_str(), RoundKeys(t));
    EXPECT(t.vecRows % 8 == 0 && t.vecRows >= 8 && t.vecRows <= AlignUp(t.blockQ / 2, 8),
           "%s: vecRows %u", what.c_str(), t.vecRows);
    EXPECT(t.blockQ <= 128 || r.seqlenQ >= 1024 || (t.blockQ == 160 && r.seqlenK >= 16384),
           "%s: %u-row tiles for a short sequence", what.c_str(), t.blockQ);
    EXPECT(t.causal == (r.causal ? 1u : 0u) && t.hasMask == (r.hasMask ? 1u : 0u),
           "%s: causal/mask flags", what.c_str());
    EXPECT(t.usedCores >= 1 && t.usedCores <= cores && t.usedCores <= kMaxCores,
           "%s: used cores %u", what.c_str(), t.usedCores);
    const uint64_t totalRows = uint64_t{t.batch} * t.headsQ * t.seqlenQ;
    EXPECT(t.rowStart[0] == 0 && t.rowStart[t.usedCores] == totalRows,
           "%s: ranges do not span the rows", what.c_str());
    uint64_t covered = 0;
    for (uint32_t c = 0; c < t.usedCores; ++c) {
        EXPECT(t.rowStart[c] < t.rowStart[c + 1], "%s: core %u has no rows", what.c_str(), c);
        uint64_t cursor = t.rowStart[c];
        QueryTile tile{};
        while (NextTile(t, cursor, t.rowStart[c + 1], tile)) {
            const uint64_t first = (uint64_t{tile.batch} * t.headsQ + tile.headQ) * t.seqlenQ + tile.row0;
            EXPECT(first == covered, "%s: tile starts at row %llu, expected %llu", what.c_str(),
                   static_cast<unsigned long long>(first), static_cast<unsigned long long>(covered));
            EXPECT(tile.rows >= 1 && tile.rows <= t.blockQ && tile.row0 + tile.rows <= t.seqlenQ,
                   "%s: tile rows", what.c_str());
            EXPECT(tile.headKv == tile.headQ / t.group && tile.headKv < t.headsKv, "%s: GQA map",
                   what.c_str());
            // The rows' bands move right with the row: the first row's first key and the
            // last row's end bound the tile's keys.
            const KeyRange keys = r.causal ? TileKeys<true>(t, tile) : TileKeys<false>(t, tile);
            const int64_t firstKey = VisibleKeys(t, r.causal, tile.row0).first;
            const int64_t endKey = VisibleKeys(t, r.causal, tile.row0 + tile.rows - 1).second;
            const bool none = endKey <= firstKey;
            EXPECT(none ? keys.begin == keys.end
                        : keys.begin == firstKey / t.blockK * t.blockK && keys.end == endKey,
                   "%s: tile visits keys [%u, %u) but its rows see [%lld, %lld)", what.c_str(),
                   keys.begin, keys.end, static_cast<long long>(firstKey),
                   static_cast<long long>(endKey));
            covered += tile.rows;
        }
    }
    EXPECT(covered == totalRows, "%s: covered %llu of %llu rows", what.c_str(),
           static_cast<unsigned long long>(covered), static_cast<unsigned long long>(totalRows));
    EXPECT(plan.userWorkspaceBytes == t.workspacePerCore * t.usedCores, "%s: workspace",
           what.c_str());
}

// The schedule model gives a positive time and a utilisation within (0, 1] (no deadlock,
// no NaN) for a plan.
void CheckPrediction(const PlanRequest& r, uint32_t cores)
{
    const Platform platform = WithCores(cores);
    const PlanResult result = MakePlan(r, platform);
    if (!result.ok()) {
        return;  // CheckPlan reports it
    }
    const Prediction p = Predict(result.plan, r, platform);
    EXPECT(p.seconds > 0 && p.cubeUtilization > 0 && p.cubeUtilization <= 1.0,
           "%s: prediction %g s, utilisation %g", Describe(r, cores).c_str(), p.seconds,
           p.cubeUtilization);
}

void TestRandomShapes(uint64_t seed)
{
    std::mt19937_64 rng(seed);
    const int kShapes = 10000;
    const int failuresBefore = g_failures;
    int planned = 0;
    for (; planned < kShapes && g_failures - failuresBefore < 20; ++planned) {
        // Keep the exhaustive tile walk affordable: at most ~4M query rows per plan.
        PlanRequest r = RandomProblem(rng, int64_t{1} << 22);
        AddRandomVariant(rng, r);
        const uint32_t cores = RandomCores(rng);
        // Every 8th: MakePlan's own choice of the cube passes (it asks the model for long
        // sequences) and the prediction; the model costs more than the plan, so the
        // others keep the tile whole (no prediction).
        const bool predicted = planned % 8 == 0;
        r.cubePasses = predicted ? 0 : -1;
        CheckPlan(r, cores);
        if (predicted) {
            CheckPrediction(r, cores);
        }
    }
    // After 20 failures the walk stops: say how far it got, not the planned count.
    if (g_failures == failuresBefore) {
        std::printf("random shapes: %d plans (seed %llu) fit and cover every query/key block "
                    "once; every 8th predicted\n", planned,
                    static_cast<unsigned long long>(seed));
    } else {
        std::printf("random shapes: stopped after %d failures in %d of %d plans (seed %llu)\n",
                    g_failures - failuresBefore, planned, kShapes,
                    static_cast<unsigned long long>(seed));
    }
}

// For shapes with at least 4x more query blocks than cores, the busiest core does at
// most 5% more modelled work than the mean.
void TestBalance()
{
    double worst[2] = {0, 0};
    double sum[2] = {0, 0};
    int count[2] = {0, 0};
    for (bool causal : {false, true}) {
        for (uint32_t cores : {20u, 24u, 7u, 48u}) {
            for (int64_t seqlen : {1024, 3000, 4096, 8192, 16384, 65536, 131072}) {
                for (int64_t heads : {1, 3, 8, 32}) {
                    for (int64_t batch : {1, 2, 5}) {
                        PlanRequest r;
                        r.batch = batch;
                        r.headsQ = heads;
                        r.headsKv = 1;
                        r.seqlenQ = seqlen;
                        r.seqlenK = seqlen;
                        r.headDim = 128;
                        r.causal = causal;
                        r.scale = 0.125;
                        r.cubePasses = -1;  // the split, not the model's choice (TestCubePasses)
                        const PlanResult result = MakePlan(r, WithCores(cores));
                        if (!result.ok()) {
                            EXPECT(false, "%s refused: %s", Describe(r, cores).c_str(),
                                   result.error.c_str());
                            continue;
                        }
                        const TilingData& t = result.plan.tiling;
                        const uint64_t queryBlocks = uint64_t{t.batch} * t.headsQ *
                                                     ((t.seqlenQ + t.blockQ - 1) / t.blockQ);
                        if (queryBlocks < 4ull * cores) {
                            continue;
                        }
                        const double imbalance = result.plan.imbalance;
                        EXPECT(imbalance <= 1.05, "%s: max/mean work %.4f",
                               Describe(r, cores).c_str(), imbalance);
                        worst[causal] = std::max(worst[causal], imbalance);
                        sum[causal] += imbalance;
                        count[causal] += 1;
                    }
                }
            }
        }
    }
    for (int causal : {0, 1}) {
        std::printf("balance (%s): %d shapes with >= 4x query blocks per core, max/mean work "
                    "per core: worst %.4f, average %.4f\n",
                    causal ? "causal" : "non-causal", count[causal], worst[causal],
                    sum[causal] / count[causal]);
    }
}

void ExpectRefusal(const PlanRequest& r, const std::string& fragment)
{
    const PlanResult result = MakePlan(r, *FindPlatform("Ascend910B2"));
    EXPECT(!result.ok(), "%s was planned, expected a refusal mentioning '%s'",
           Describe(r, 24).c_str(), fragment.c_str());
    EXPECT(result.error.find(fragment) != std::string::npos, "refusal '%s' lacks '%s'",
           result.error.c_str(), fragment.c_str());
}

void TestRefusals()
{
    PlanRequest ok;
    ok.batch = 2;
    ok.headsQ = 8;
    ok.headsKv = 2;
    ok.seqlenQ = ok.seqlenK = 512;
    ok.headDim = 128;
    ok.scale = 0.1;
    EXPECT(MakePlan(ok, *FindPlatform("Ascend910B2")).ok(), "baseline refused");
    auto with = [&](const std::function<void(PlanRequest&)>& edit) {
        PlanRequest r = ok;
        edit(r);
        return r;
    };
    ExpectRefusal(with([](PlanRequest& r) { r.headDim = 257; }),
                  "head_dim 257 exceeds the kernel's maximum of 256");
    ExpectRefusal(with([](PlanRequest& r) { r.headsKv = 3; }),
                  "heads_q (8) must be a multiple of heads_kv (3)");
    ExpectRefusal(with([](PlanRequest& r) { r.dtype = DType::Float32; }),
                  "dtype float32 is not supported");
    ExpectRefusal(with([](PlanRequest& r) { r.seqlenK = 0; }), "seqlen_k must be >= 1 (got 0)");
    ExpectRefusal(with([](PlanRequest& r) { r.seqlenQ = int64_t{1} << 31; }),
                  "seqlen_q 2147483648 overflows the kernel's 32-bit indices");
    ExpectRefusal(with([](PlanRequest& r) {
                      r.layout = Layout::BSND;
                      r.headsQ = r.headsKv = 512;
                  }),
                  "query row stride 65536 elements");
    ExpectRefusal(with([](PlanRequest& r) {
                      r.batch = int64_t{1} << 30;
                      r.headsQ = r.headsKv = int64_t{1} << 16;
                      r.seqlenQ = r.seqlenK = int64_t{1} << 16;
                  }),
                  "overflows the kernel's 64-bit offsets");
    ExpectRefusal(with([](PlanRequest& r) { r.scale = std::nan(""); }), "scale must be finite");
    std::printf("refusals: 8 unsupported inputs refused with specific messages\n");
}

void TestTilingAndPlatforms()
{
    EXPECT(sizeof(TilingData) <= 2048, "TilingData is %zu bytes, CANN's default buffer is 2048",
           sizeof(TilingData));
    const double expected[][2] = {{0, 363.7}, {1, 353.9}, {2, 294.9}, {3, 245.8}, {4, 353.9}};
    for (const auto& [index, tflops] : expected) {
        const Platform& p = KnownPlatforms()[static_cast<size_t>(index)];
        EXPECT(std::fabs(CubePeakFlops(p) / 1e12 - tflops) < 0.1, "%s peak %.1f, expected %.1f",
               p.name.c_str(), CubePeakFlops(p) / 1e12, tflops);
    }
    EXPECT(std::fabs(VisiblePairs(3, 3, true) - 6) < 1e-9, "causal 3x3 sees 6 pairs");
    EXPECT(std::fabs(VisiblePairs(5, 2, true) - 3) < 1e-9, "causal 5x2 sees 3 pairs");
    EXPECT(std::fabs(VisiblePairs(2, 5, true) - 9) < 1e-9, "causal 2x5 sees 9 pairs");
    std::printf("tiling data: %zu bytes (limit 2048); computed cube peaks (16x16x16 MACs x 2 x "
                "cores x clock) as expected\n", sizeof(TilingData));
}

// The timeline runs each engine in order, honours dependencies and their latency, and
// reports a deadlock instead of looping.
void TestTimeline()
{
    Timeline t;
    const auto a = t.Add(Engine::kCube, 2);
    const auto b = t.Add(Engine::kCube, 3);          // after a on the same engine
    const auto c = t.Add(Engine::kVector, 1);
    t.After(c, a, 0.5);                              // a ends at 2, + 0.5 latency
    const auto d = t.Add(Engine::kFixpipe, 1);
    t.After(d, b);
    EXPECT(std::fabs(t.Run() - 6) < 1e-12, "makespan");
    EXPECT(std::fabs(t.Busy()[static_cast<uint32_t>(Engine::kCube)] - 5) < 1e-12, "cube busy");
    Timeline stuck;
    const auto first = stuck.Add(Engine::kCube, 1);
    const auto second = stuck.Add(Engine::kCube, 1);
    stuck.After(first, second);                      // waits for a later task of its engine
    EXPECT(stuck.Run() < 0, "a deadlock must be reported");
    std::printf("timeline: in-order engines, dependency latency, deadlock detection\n");
}

PlanRequest Square(int64_t heads, int64_t seqlen, bool causal)
{
    PlanRequest r;
    r.batch = 1;
    r.headsQ = r.headsKv = heads;
    r.seqlenQ = r.seqlenK = seqlen;
    r.headDim = 128;
    r.causal = causal;
    r.scale = 0.088;
    return r;
}

// Calibration: the schedule model fed the incumbent's design reproduces the incumbent's
// measured 910B2 figures (torch_npu fused attention, batch 1, 1 head, fp16, D 128,
// non-causal; hw-native-sys/pto-isa kernels/manual/common/flash_atten/README.md) within
// +-15 % (held out of the fit, model_fit.h). A model change that breaks this fails here.
void TestCalibration()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    const double measured[][2] = {{4096, 72.6}, {8192, 97.3}, {16384, 122.9}, {32768, 150.8}};
    for (const auto& [seqlen, tflops] : measured) {
        const Prediction p = PredictIncumbent(Square(1, static_cast<int64_t>(seqlen), false), b2);
        const double modelled = p.usefulFlops / p.seconds / 1e12;
        EXPECT(std::fabs(modelled / tflops - 1) <= 0.15,
               "incumbent at %.0f: modelled %.1f TFLOP/s, measured %.1f", seqlen, modelled, tflops);
        std::printf("calibration: incumbent design at seqlen %5.0f: modelled %6.1f TFLOP/s, "
                    "measured %6.1f (%+.0f%%), bound: %s\n", seqlen, modelled, tflops,
                    100 * (modelled / tflops - 1), p.bound.c_str());
    }
}

// The model follows the design's overlaps: with the O update in step with the softmax
// (no round of delay) and S issued only just in time, the vector cores wait for every
// P.V, so the same rounds take longer; more workspace bytes per score element raise the
// shared-L2 floor until it binds.
void TestScheduleSemantics()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    const PlanRequest r = Square(16, 8192, false);
    const PlanResult plan = MakePlan(r, b2);
    const KernelDesign delayed = DesignFromTiling(plan.plan.tiling, 2);
    KernelDesign serial = delayed;
    serial.outputDelay = 0;
    serial.scoresAhead = 1;
    serial.loadsBeforeProbWait = false;
    const double tSerial = PredictDesign(serial, plan.plan.tiling, r, b2).seconds;
    const double tDelayed = PredictDesign(delayed, plan.plan.tiling, r, b2).seconds;
    EXPECT(tDelayed < 0.9 * tSerial, "delayed O update %g s vs serial %g s", tDelayed, tSerial);
    KernelDesign heavy = delayed;
    heavy.scoreBytes = 16;
    const Prediction p = PredictDesign(heavy, plan.plan.tiling, r, b2);
    EXPECT(p.bound.find("L2") != std::string::npos || p.bound.find("Fixpipe") != std::string::npos,
           "16 bytes of S per score element should bind on L2 or Fixpipe, got %s", p.bound.c_str());
    const EngineRates rates = RatesFor(b2);
    const double exp10 = VecSeconds({{VecOp::kExp, 10, true}}, rates) * rates.clockHz;
    const double issue = rates.vectorIssue * rates.clockHz;
    EXPECT(std::fabs(exp10 - (13 + 9 * 2 + issue)) < 1e-9, "Exp of 10 repeats + barrier: %g cycles", exp10);
    std::printf("schedule model: O-update delay %.2fx faster than the serial chain; "
                "workspace bytes bind the shared L2\n", tSerial / tDelayed);
}

// The issue-10/11 targets as the model predicts them (printed for the log, not asserted:
// the model must not be tuned to a target): 910B2, fp16, D 128, batch 1, 16 heads.
void TestTargetsReport()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    for (bool causal : {false, true}) {
        for (int64_t seqlen : {8192, 16384, 32768}) {
            const PlanRequest r = Square(16, seqlen, causal);
            const PlanResult plan = MakePlan(r, b2);
            const Prediction p = Predict(plan.plan, r, b2);
            EXPECT(p.seconds > 0 && p.cubeUtilization < 1, "forward prediction");
            std::printf("targets: forward %s seqlen %5lld: %.1f%% of cube peak (%.0f TFLOP/s), "
                        "work imbalance %.3f, modelled core time max/mean %.3f; bound: %s\n",
                        causal ? "causal    " : "non-causal", static_cast<long long>(seqlen),
                        100 * p.cubeUtilization, p.usefulFlops / p.seconds / 1e12,
                        plan.plan.imbalance, p.coreSeconds / p.meanCoreSeconds, p.bound.c_str());
            BackwardProblem problem{1, 16, 16, seqlen, seqlen, 128, causal};
            // The grad plan's design (blocks, pieces, L0C scratch copies, steps in flight)
            // on the model's own even split, so that the table compares designs, not splits.
            for (const bool deterministic : {false, true}) {
                const GradPlanResult grad = MakeGradPlan(GradPlanRequest{r, deterministic}, b2);
                EXPECT(grad.ok(), "backward plan: %s", grad.error.c_str());
                const BackwardDesign design = GradDesign(grad.plan, r.dtype, deterministic);
                const BackwardPrediction b =
                    PredictBackward(design, problem, EvenBackwardSplit(design, problem, 24), b2);
                EXPECT(b.seconds > 0 && b.cubeUtilization < 1, "backward prediction");
                std::printf("targets: backward %s seqlen %5lld [%s %ux%u, %u-row pieces, dQ in %u-column "
                            "pieces, %u L0C scratch]: %.1f%% of cube peak (2.5x forward FLOPs); bound: %s\n",
                            causal ? "causal    " : "non-causal", static_cast<long long>(seqlen),
                            deterministic ? "deterministic" : "fast", design.blockQ, design.blockK,
                            design.productRows, design.dqColumns, design.l0cScratchBuffers,
                            100 * b.cubeUtilization, b.bound.c_str());
            }
            BackwardDesign ahead;  // two L0C scratch copies, S/dP one step ahead, 128 x 128
            ahead.stepsAhead = 2;
            ahead.l0cScratchBuffers = 2;
            const BackwardPrediction a =
                PredictBackward(ahead, problem, EvenBackwardSplit(ahead, problem, 24), b2);
            std::printf("targets: backward*%s seqlen %5lld: %.1f%% of cube peak (2.5x forward "
                        "FLOPs); bound: %s\n", causal ? "causal    " : "non-causal",
                        static_cast<long long>(seqlen), 100 * a.cubeUtilization, a.bound.c_str());
        }
    }
}

// The fp16-score fast path (fp16_scores): the forward plans exactly as without it (it keeps
// fp32 S), the backward holds S in fp16. Printed for the log, not asserted (the model must
// not be tuned to a target): the backward's predictions beside the default path's, and the
// forward's fp16-S designs, which are not built (docs/kernel-backward.md, "The fp16-score fast
// path": they fail issue 25's accuracy gate).
void TestFp16ScoresReport()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    for (bool causal : {false, true}) {
        for (int64_t seqlen : {8192, 16384, 32768}) {
            PlanRequest r = Square(16, seqlen, causal);
            const PlanResult base = MakePlan(r, b2);
            r.fp16Scores = true;
            const PlanResult fast = MakePlan(r, b2);
            EXPECT(fast.ok() && PlanToJson(fast, r, b2) == PlanToJson(base, Square(16, seqlen, causal), b2),
                   "fp16 scores changed the forward plan (%s)", fast.error.c_str());
            const Prediction d = Predict(base.plan, r, b2);
            // S written as fp16 and widened on the vector (built once, removed: its out and
            // lse broke the gate), and that with the running max as a per-row offset (never
            // built): kScoresAhead + 1 rounds late, a tile's lead rounds in fp32.
            const TilingData& t = base.plan.tiling;
            KernelDesign widened = DesignFromTiling(t, 2);
            widened.scoreBytes = 2;
            widened.widenScores = true;
            const Prediction w = PredictDesign(widened, t, r, b2);
            KernelDesign offset = widened;
            offset.scoreOffsetColumns = kScoreOffsetColumns;
            offset.fp32LeadRounds = kScoresAhead + 1;
            const Prediction o = PredictDesign(offset, t, r, b2);
            EXPECT(w.seconds > 0 && o.seconds > 0 && o.cubeUtilization < 1, "fp16-S forward designs");
            std::printf("fp16 scores: forward %s seqlen %5lld: %.1f%% of cube peak (the default path's); "
                        "fp16 S widened on the vector (design change, not built) %.1f%%, with the "
                        "running-max offset %.1f%%; bound: %s\n",
                        causal ? "causal    " : "non-causal", static_cast<long long>(seqlen),
                        100 * d.cubeUtilization, 100 * w.cubeUtilization, 100 * o.cubeUtilization,
                        d.bound.c_str());
            const BackwardProblem problem{1, 16, 16, seqlen, seqlen, 128, causal};
            const auto backward = [&](bool fp16Scores) {
                PlanRequest g = r;
                g.fp16Scores = fp16Scores;
                const GradPlanResult grad = MakeGradPlan(GradPlanRequest{g, false}, b2);
                EXPECT(grad.ok(), "backward plan: %s", grad.error.c_str());
                EXPECT(grad.plan.tiling.fp16Scores == (fp16Scores ? 1u : 0u), "grad fp16Scores");
                const BackwardDesign design = GradDesign(grad.plan, g.dtype, false);
                return PredictBackward(design, problem, EvenBackwardSplit(design, problem, 24), b2);
            };
            const BackwardPrediction bd = backward(false);
            const BackwardPrediction bf = backward(true);
            std::printf("fp16 scores: backward %s seqlen %5lld: %.1f%% of "
                        "cube peak (default path %.1f%%); bound: %s\n",
                        causal ? "causal    " : "non-causal", static_cast<long long>(seqlen),
                        100 * bf.cubeUtilization, 100 * bd.cubeUtilization, bf.bound.c_str());
        }
    }
    PlanRequest bf16 = Square(16, 4096, false);
    bf16.dtype = DType::BFloat16;
    bf16.fp16Scores = true;
    EXPECT(!MakePlan(bf16, b2).ok(), "fp16 scores are refused for bfloat16");
}

// Rounds of 1024 keys where the model predicts a gain (long non-causal key sequences at
// head_dim >= 128, when UB allows), 512 elsewhere; likewise 160-row query tiles.
void TestRoundWidth()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    const auto keys = [&](int64_t seqlen, bool causal, int64_t headDim) {
        PlanRequest r = Square(16, seqlen, causal);
        r.headDim = headDim;
        return RoundKeys(MakePlan(r, b2).plan.tiling);
    };
    EXPECT(keys(8192, false, 128) == 1024 && keys(4096, false, 256) == 1024,
           "long non-causal: %u / %u-key rounds", keys(8192, false, 128), keys(4096, false, 256));
    EXPECT(keys(8192, true, 128) == 512 && keys(2048, false, 128) == 512 && keys(8192, false, 64) == 512,
           "causal, short or head_dim 64: %u / %u / %u-key rounds", keys(8192, true, 128),
           keys(2048, false, 128), keys(8192, false, 64));
    // 256-row tiles in two cube passes for long key sequences at head_dim 128 (the 160-row
    // tile's single S buffer in L0C serialises Mmad and Fixpipe), 128 rows below 16k keys.
    const auto rows = [&](int64_t seqlen, bool causal) {
        return MakePlan(Square(16, seqlen, causal), b2).plan.tiling.blockQ;
    };
    EXPECT(rows(16384, false) == 256 && rows(16384, true) == 256 && rows(8192, false) == 128,
           "query tiles at 16k / 16k causal / 8k: %u / %u / %u rows", rows(16384, false),
           rows(16384, true), rows(8192, false));
}

// The 256-row tile in two 128-row cube passes (TilingData cubeRows) at head_dim 128: its
// buffers fit (the L0A ring Q of a pass and P share, O of a pass in L0C, V of a round in
// L1); MakePlan takes it exactly where the schedule model predicts it faster than the
// whole-tile plan, and cubePasses forces it (1) or rules it out (-1). The "cube passes:"
// lines are the predictions at the targets' shapes (printed, not asserted), with V loaded
// into L1 once per pass priced beside the built design (V of a round kept in L1).
void TestCubePasses()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    PlanRequest small = Square(2, 300, true);
    small.cubePasses = 1;
    const PlanResult forced = MakePlan(small, b2);
    EXPECT(forced.ok() && forced.plan.tiling.blockQ == 256 && forced.plan.tiling.cubeRows == 128 &&
               CubePasses(forced.plan.tiling, 256) == 2 && CubePasses(forced.plan.tiling, 44) == 1,
           "forced passes: %s, %u rows in passes of %u", forced.error.c_str(), forced.plan.tiling.blockQ,
           forced.plan.tiling.cubeRows);
    for (const LevelUse& l : forced.plan.levels) {
        EXPECT(l.used <= l.capacity, "passes: %s %llu > %llu", MemLevelName(l.level),
               static_cast<unsigned long long>(l.used), static_cast<unsigned long long>(l.capacity));
    }
    const BufferBytes bytes = ComputeBufferBytes(forced.plan.tiling, 2);
    EXPECT(bytes.qL0a * forced.plan.tiling.l0aBuffers == 64 * 1024 && bytes.pL0a == 0 &&
               bytes.oL0c == 64 * 1024 && bytes.vL1 == RoundKeys(forced.plan.tiling) * 128 * 2,
           "passes: L0A ring %u x %u, O %u, V round %u bytes", bytes.qL0a, forced.plan.tiling.l0aBuffers,
           bytes.oL0c, bytes.vL1);
    PlanRequest never = Square(16, 1024, true);
    never.cubePasses = -1;
    EXPECT(MakePlan(never, b2).plan.tiling.cubeRows == MakePlan(never, b2).plan.tiling.blockQ,
           "cubePasses -1 keeps the tile whole");
    // Packed sequences are compared as the dense problem of their max_seqlen.
    PlanRequest packed = Square(32, 1024, true);
    const bool densePasses = CubeInPasses(MakePlan(packed, b2).plan.tiling);
    packed.layout = Layout::TND;
    packed.tokensQ = packed.tokensK = 1024;
    EXPECT(CubeInPasses(MakePlan(packed, b2).plan.tiling) == densePasses && densePasses,
           "TND causal 1k, 32 heads: passes as the dense plan");
    // Over a sweep of shapes MakePlan takes the passes exactly where the model predicts
    // them faster: at a few (causal 1k with many heads) by under 2 %, and at 16k-32k keys
    // at head_dim 128, where the whole tile is the 160-row one whose single S buffer in
    // L0C serialises Mmad and Fixpipe, by up to 30 %; a larger predicted gain fails here,
    // so that the docs' account of the rule is revisited.
    int faster = 0, swept = 0;
    double bestGain = 0;
    for (const int64_t headDim : {80, 96, 112, 128}) {
        for (const bool causal : {false, true}) {
            for (const int64_t seqlen : {1024, 2048, 4096, 8192, 16384, 32768}) {
                for (const int64_t heads : {1, 8, 32}) {
                    for (const int64_t batch : {1, 4}) {
                        if (seqlen >= 16384 && batch * heads > 16) {
                            continue;  // the target shapes' size at most: keep the sweep short
                        }
                        PlanRequest r = Square(heads, seqlen, causal);
                        r.batch = batch;
                        r.headDim = headDim;
                        const PlanResult whole = PlanBlocks(r, b2, false);
                        const double w = Predict(whole.plan, r, b2).seconds;
                        const double h = Predict(PlanBlocks(r, b2, true).plan, r, b2).seconds;
                        // A tile already of 256 rows needs no passes (MakePlan).
                        const bool gain = h < w && whole.plan.tiling.blockQ < 256;
                        ++swept;
                        faster += gain ? 1 : 0;
                        bestGain = std::max(bestGain, w / h - 1);
                        EXPECT(CubeInPasses(MakePlan(r, b2).plan.tiling) == gain,
                               "D %lld %s %lld keys, %lld heads, batch %lld: passes %s, predicted %g vs %g s",
                               static_cast<long long>(headDim), causal ? "causal" : "non-causal",
                               static_cast<long long>(seqlen), static_cast<long long>(heads),
                               static_cast<long long>(batch), gain ? "predicted faster" : "not", h, w);
                    }
                }
            }
        }
    }
    EXPECT(bestGain < 0.30, "the model now predicts the passes %.1f%% faster: docs/kernel.md's "
           "account of where they are taken is stale", 100 * bestGain);
    std::printf("cube passes: %d shapes swept (head_dim 80-128, 1k-32k, 1-32 heads, batch 1-4): "
                "predicted faster and planned at %d, by at most %.1f%%\n", swept, faster, 100 * bestGain);
    PlanRequest d256 = Square(2, 4096, false);
    d256.headDim = 256;
    d256.cubePasses = 1;
    EXPECT(!MakePlan(d256, b2).ok(), "head_dim 256 has no room for a 128-row pass beside P");
    for (const bool causal : {false, true}) {
        for (const int64_t seqlen : {2048, 8192, 16384, 32768}) {
            PlanRequest r = Square(16, seqlen, causal);
            const PlanResult whole = PlanBlocks(r, b2, false);
            const PlanResult passes = PlanBlocks(r, b2, true);
            const Prediction w = Predict(whole.plan, r, b2);
            const Prediction h = Predict(passes.plan, r, b2);
            KernelDesign twice = DesignFromTiling(passes.plan.tiling, 2);
            twice.valuesPerPass = true;
            const Prediction v = PredictDesign(twice, passes.plan.tiling, r, b2);
            const PlanResult chosen = MakePlan(r, b2);
            const bool tookPasses = CubeInPasses(chosen.plan.tiling);
            EXPECT(tookPasses == (h.seconds < w.seconds), "%s %lld: passes %s, predicted %g vs %g s",
                   causal ? "causal" : "non-causal", static_cast<long long>(seqlen),
                   tookPasses ? "taken" : "not taken", h.seconds, w.seconds);
            std::printf("cube passes: %-10s seqlen %5lld: whole %u-row tile %.1f%% (%s); 256-row tile in "
                        "passes %.1f%% (%s), V loaded per pass %.1f%%; planned: %s\n",
                        causal ? "causal" : "non-causal",
                        static_cast<long long>(seqlen), whole.plan.tiling.blockQ, 100 * w.cubeUtilization,
                        w.bound.c_str(), 100 * h.cubeUtilization, h.bound.c_str(), 100 * v.cubeUtilization,
                        tookPasses ? "passes" : "whole");
            // The same two plans with the Fixpipe or shared-L2 rate scaled (as the
            // SENSITIVITY table): whole / passes, % of cube peak.
            std::string scaled;
            for (const auto& [name, scale] : {std::pair<const char*, std::pair<double, double>>{"Fixpipe x0.77", {0.77, 1}},
                                              {"Fixpipe x1.3", {1.3, 1}}, {"L2 x0.77", {1, 0.77}},
                                              {"L2 x1.3", {1, 1.3}}}) {
                EngineRates rates = RatesFor(b2);
                rates.fixpipe *= scale.first;
                rates.l2Aggregate *= scale.second;
                const Platform p = WithRates(b2, rates);
                char cell[64];
                std::snprintf(cell, sizeof(cell), "; %s %.1f / %.1f%%", name,
                              100 * Predict(whole.plan, r, p).cubeUtilization,
                              100 * Predict(passes.plan, r, p).cubeUtilization);
                scaled += cell;
            }
            std::printf("cube passes: %-10s seqlen %5lld at scaled rates, whole / passes%s\n",
                        causal ? "causal" : "non-causal",
                        static_cast<long long>(seqlen), scaled.c_str());
        }
    }
}

// What the model says would close the gap: the kernel's design with one change after
// another (printed for the log; a change may well cost, e.g. longer causal rounds).
void TestDesignChangesReport()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    for (bool causal : {false, true}) {
        const PlanRequest r = Square(16, 16384, causal);
        TilingData t = MakePlan(r, b2).plan.tiling;
        KernelDesign d = DesignFromTiling(t, 2);
        const auto report = [&](const char* change) {
            const Prediction p = PredictDesign(d, t, r, b2);
            std::printf("design change (%s, 16k): %-44s %.1f%% of peak; bound: %s\n",
                        causal ? "causal" : "non-causal", change, 100 * p.cubeUtilization,
                        p.bound.c_str());
            return p.cubeUtilization;
        };
        report("as committed");
        const auto step = [&](const char* change) {
            EXPECT(report(change) > 0, "%s: no prediction", change);
        };
        d.scoreBytes = 2;
        step("+ S written as fp16 by Fixpipe");
        // Q of 256 rows fills L0A at head_dim 128, O of 256 rows L0C: the 256-row tile as
        // built, in two 128-row cube passes (docs/kernel.md, "The cube in row passes").
        t = PlanBlocks(r, b2, true).plan.tiling;
        d = DesignFromTiling(t, 2);
        d.scoreBytes = 2;
        step("+ 256-row query tiles in cube passes");
        t.keyStack = kMaxRoundKeys / t.blockK;
        d = [&] {
            KernelDesign n = DesignFromTiling(t, 2);
            n.scoreBytes = 2;
            return n;
        }();
        step("+ 1024-key rounds");
        d.outputAcrossTiles = true;
        step("+ the vector's O updates across tiles");
        d.vectorBarriers = false;
        step("+ no vector barrier between dependent steps");
    }
}

// The backward model: a pipelined order with a second L0C scratch is faster than the
// serial chain; the deterministic variant's query pass costs main-loop time; the even
// split covers every unit and step once.
void TestBackwardModel()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    const BackwardProblem problem{1, 8, 2, 4096, 4096, 128, true};
    BackwardDesign serial;
    serial.blockK = 64;
    const std::vector<BackwardCoreWork> work = EvenBackwardSplit(serial, problem, 24);
    uint64_t units = 0, steps = 0;
    for (const BackwardCoreWork& w : work) {
        units += w.units;
        steps += w.steps;
    }
    EXPECT(units == 2 * 64 && steps == 4 * 2 * (64 * 32 - 2 * (31 * 32 / 2)), "split covers %llu units, "
           "%llu steps", static_cast<unsigned long long>(units), static_cast<unsigned long long>(steps));
    // Sequences that end in a partial block: non-causal, 1000 query rows are 8 blocks of 128
    // (the last one partial) for each of the 10 key blocks of 600 keys, per query head.
    const BackwardProblem ragged{1, 8, 2, 1000, 600, 128, false};
    uint64_t raggedSteps = 0;
    for (const BackwardCoreWork& w : EvenBackwardSplit(serial, ragged, 24)) {
        raggedSteps += w.steps;
    }
    EXPECT(raggedSteps == 8 * 10 * 8, "a ragged split covers %llu steps, not 640",
           static_cast<unsigned long long>(raggedSteps));
    BackwardDesign pipelined = serial;
    pipelined.stepsAhead = 2;
    pipelined.l0cScratchBuffers = 2;
    const BackwardPrediction a = PredictBackward(serial, problem, work, b2);
    const BackwardPrediction b = PredictBackward(pipelined, problem, work, b2);
    EXPECT(b.mainSeconds < 0.95 * a.mainSeconds, "pipelined %g s vs serial %g s", b.mainSeconds,
           a.mainSeconds);
    // The deterministic dQ's query pass recomputes S, dP and dS: main-loop time (its key
    // pass, without the dQ product, is cheaper than the fast variant's).
    BackwardDesign deterministic = serial;
    deterministic.deterministic = true;
    const BackwardPrediction det =
        PredictBackward(deterministic, problem, EvenBackwardSplit(deterministic, problem, 24), b2);
    EXPECT(det.queryPassSeconds > 0 && det.mainSeconds > a.mainSeconds,
           "the query pass must cost main-loop time: %g s (query pass %g s) vs %g s", det.mainSeconds,
           det.queryPassSeconds, a.mainSeconds);
    std::printf("backward model: split covers every step, a second L0C scratch %.2fx faster\n",
                a.mainSeconds / b.mainSeconds);
}

// Dropout's predicted cost (issue 23's target: <= 10 % over plain) for fp16, D 128, 16k,
// B1 H16, non-causal on 910B2, forward and backward, with the generator the kernels have
// (Philox4x32-10, one call per element) and with the contract changes that would cut it.
// Printed for the log; the checks hold the program to the header's instruction count and
// the alternatives to their order.
void TestDropoutCost()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    // flash_attention_philox.h issues, per pass of one row: 4 counter instructions, 9
    // rounds of 48, a last round of 24 (first output only), 10 for the threshold compare.
    double instructions = 0;
    for (const VecInstr& i : DropoutMaskProgram(1, 512, 512)) {
        instructions += i.times;
    }
    EXPECT(instructions == 470, "%g instructions", instructions);
    const PlanRequest r = Square(16, 16384, false);
    const TilingData t = MakePlan(r, b2).plan.tiling;
    const double plainForward = PredictDesign(DesignFromTiling(t, 2), t, r, b2).seconds;
    GradPlanRequest gr;
    gr.problem = r;
    const GradPlan g = MakeGradPlan(gr, b2).plan;
    const BackwardProblem problem{r.batch, r.headsQ, r.headsKv, r.seqlenQ, r.seqlenK, r.headDim, r.causal};
    const double plainBackward = PredictGradPlan(g, gr, b2).seconds;
    struct Option {
        const char* name;
        DropoutDraw draw;
    };
    const Option options[] = {
        {"Philox4x32-10, 1 draw per call (the contract)", {10, 1}},
        {"Philox4x32-10, 4 draws per call", {10, 4}},
        {"Philox4x32-7, 4 draws per call", {7, 4}},
        {"Philox4x32-10, 16 byte draws per call", {10, 16}},
        {"Philox4x32-7, 16 byte draws per call", {7, 16}},
    };
    // What 10 % of the plain forward buys: vector cycles per 64 elements on each AIV.
    const EngineRates rates = RatesFor(b2);
    const double elementsPerAiv = double(r.batch) * r.headsQ * r.seqlenQ * r.seqlenK / (2.0 * b2.aicCores);
    std::printf("dropout budget (10%% of the plain forward, %.3f ms): %.2f vector cycles per 64 elements "
                "per AIV\n", 1e3 * plainForward, 0.1 * plainForward * rates.clockHz / (elementsPerAiv / 64));
    double previous[2] = {1e30, 1e30};
    for (const Option& o : options) {
        // The same scratch (Philox words per pass) for every option: one row of the round.
        const uint32_t words = RoundKeys(t);
        KernelDesign d = DesignFromTiling(t, 2);
        d.dropoutPassElements = words * o.draw.drawsPerCall;
        d.dropoutDraw = o.draw;
        const double forward = PredictDesign(d, t, r, b2).seconds;
        BackwardDesign bd = GradDesign(g, r.dtype, false);
        bd.dropoutPassElements = std::max<uint32_t>(256, bd.blockK * 4) * o.draw.drawsPerCall;
        bd.dropoutDraw = o.draw;
        const double backward = PredictBackward(bd, problem, GradModelWork(g), b2).seconds;
        const double cycles = VecSeconds(DropoutMaskProgram(1, words * o.draw.drawsPerCall,
                                                            words * o.draw.drawsPerCall, o.draw), rates) *
                              rates.clockHz / (words * o.draw.drawsPerCall / 64.0);
        std::printf("dropout (fp16 D128 16k B1 H16, 910B2): %-46s %6.1f cycles/64 elements; forward "
                    "+%.0f%%, backward +%.0f%%\n", o.name, cycles, 100 * (forward / plainForward - 1),
                    100 * (backward / plainBackward - 1));
        EXPECT(forward > plainForward && backward > plainBackward, "%s costs nothing", o.name);
        if (o.draw.rounds == 10) {
            EXPECT(forward < previous[0] && backward < previous[1], "%s not cheaper", o.name);
            previous[0] = forward;
            previous[1] = backward;
        }
    }
}

}  // namespace

// The features' predicted cost (issue 23; printed for the log and docs/schedule-model.md's
// FEATURES table, not asserted against the targets: the model must not be tuned to them):
// 910B2, fp16, D 128, batch 1, 16 heads, 16k non-causal, each feature alone against the
// plain kernel; a 4k sliding window at 32k against full attention; D 256. Asserted: the
// window split stays balanced on the kernel's real (band) work, as the schedule model
// walks it, and skipping buys at least the band's share of the work.
void TestFeaturesReport()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    const auto predict = [&](PlanRequest r) {
        const PlanResult plan = MakePlan(r, b2);
        EXPECT(plan.ok(), "features plan refused: %s", plan.error.c_str());
        return plan.ok() ? Predict(plan.plan, r, b2) : Prediction{};
    };
    const PlanRequest plain = Square(16, 16384, false);
    const Prediction base = predict(plain);
    std::printf("features: 16k plain                %8.3f ms  overhead %5.1f%%  (%.1f%% of cube peak)\n",
                base.seconds * 1e3, 0.0, 100 * base.cubeUtilization);
    const std::pair<const char*, VariantTiling> features[] = {
        {"ALiBi (per head)", MakeVariant(-1, -1, 0, 0, Alibi::kPerHead, false)},
        {"sinks", MakeVariant(-1, -1, 0, 0, Alibi::kNone, true)},
        {"softcap", MakeVariant(-1, -1, 30, 0, Alibi::kNone, false)},
        {"dropout", MakeVariant(-1, -1, 0, 0.1, Alibi::kNone, false)},
    };
    for (const auto& [name, variant] : features) {
        PlanRequest r = plain;
        r.variant = variant;
        const Prediction p = predict(r);
        EXPECT(p.seconds >= base.seconds * 0.999, "%s predicted faster than plain", name);
        std::printf("features: 16k %-20s %8.3f ms  overhead %5.1f%%  (%.1f%% of cube peak)\n",
                    name, p.seconds * 1e3, 100 * (p.seconds / base.seconds - 1),
                    100 * p.cubeUtilization);
    }
    const Prediction full = predict(Square(16, 32768, false));
    for (const auto& [left, right, causal] :
         {std::tuple<int64_t, int64_t, bool>{4096, -1, true}, {2048, 2048, false}}) {
        PlanRequest r = Square(16, 32768, causal);
        r.variant = MakeVariant(left, right, 0, 0, Alibi::kNone, false);
        const Prediction p = predict(r);
        const double ratio = p.coreSeconds / p.meanCoreSeconds;
        EXPECT(ratio < 1.05, "window (%lld, %lld): modelled core time max/mean %.3f",
               static_cast<long long>(left), static_cast<long long>(right), ratio);
        // The band holds 1/8 of the keys: anything under 4x means blocks are not skipped.
        EXPECT(full.seconds > 4 * p.seconds, "window (%lld, %lld) %g s vs full %g s",
               static_cast<long long>(left), static_cast<long long>(right), p.seconds,
               full.seconds);
        std::printf("features: 32k window (%lld, %lld)%s %8.3f ms  %.2fx faster than full "
                    "(%.3f ms); modelled core time max/mean %.3f\n",
                    static_cast<long long>(left), static_cast<long long>(right),
                    causal ? " causal" : "", p.seconds * 1e3, full.seconds / p.seconds,
                    full.seconds * 1e3, ratio);
    }
    for (bool all : {false, true}) {
        PlanRequest r = Square(16, 16384, false);
        r.headDim = 256;
        if (all) {
            r.variant = MakeVariant(-1, -1, 30, 0, Alibi::kPerHead, true);
        }
        const Prediction p = predict(r);
        std::printf("features: 16k D 256 %-14s %8.3f ms  %.1f%% of cube peak\n",
                    all ? "ALiBi+softcap+sinks" : "plain", p.seconds * 1e3, 100 * p.cubeUtilization);
    }
}

// The headline predictions at the fitted rates and with the Fixpipe or the shared-L2 rate
// scaled by 0.77 and 1.3 (docs/schedule-model.md's SENSITIVITY table; printed, not asserted):
// 910B2, fp16, D 128, batch 1, 16 heads. Each cell: % of cube peak, then the binding
// engine and its busy share of the slowest core (the shared L2 first when its floor sets
// the time).
std::string ShortEngine(const std::string& name)
{
    return name.substr(0, name.find(" ("));
}

template <typename Busy>
std::string Binding(const std::string& bound, const Busy& busy, double seconds)
{
    auto busiest = busy.front();
    for (const auto& e : busy) {
        if (e.second > busiest.second) {
            busiest = e;
        }
    }
    char text[96];
    std::snprintf(text, sizeof(text), "%s%s %.0f%%", bound.rfind("shared L2", 0) == 0 ? "L2; " : "",
                  ShortEngine(busiest.first).c_str(), 100 * busiest.second / seconds);
    return text;
}

void TestSensitivityReport()
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    const EngineRates fitted = RatesFor(b2);
    const std::pair<const char*, EngineRates> columns[] = {
        {"fitted", fitted},
        {"Fixpipe x0.77", [&] { EngineRates r = fitted; r.fixpipe *= 0.77; return r; }()},
        {"Fixpipe x1.3", [&] { EngineRates r = fitted; r.fixpipe *= 1.3; return r; }()},
        {"L2 x0.77", [&] { EngineRates r = fitted; r.l2Aggregate *= 0.77; return r; }()},
        {"L2 x1.3", [&] { EngineRates r = fitted; r.l2Aggregate *= 1.3; return r; }()},
    };
    const auto row = [](const char* name, const char* column, double utilization, const std::string& binding) {
        EXPECT(utilization > 0 && utilization < 1, "%s at %s: %g", name, column, utilization);
        std::printf("sensitivity: %s | %s | %.1f%% | %s\n", name, column, 100 * utilization, binding.c_str());
    };
    for (const auto& [column, rates] : columns) {
        const Platform p = WithRates(b2, rates);
        const auto forward = [&](const char* name, const Prediction& f) {
            row(name, column, f.cubeUtilization, Binding(f.bound, f.engineBusySeconds, f.coreSeconds));
        };
        for (bool causal : {false, true}) {
            for (int64_t seqlen : {8192, 16384, 32768}) {
                const PlanRequest r = Square(16, seqlen, causal);
                const std::string name = std::string("ours, forward, ") + (causal ? "causal" : "non-causal") +
                                         ", " + std::to_string(seqlen / 1024) + "k";
                forward(name.c_str(), Predict(MakePlan(r, b2).plan, r, p));
            }
        }
        for (bool causal : {false, true}) {
            const PlanRequest r = Square(16, 16384, causal);
            const char* mode = causal ? "causal" : "non-causal";
            for (bool deterministic : {false, true}) {
                const GradPlanRequest gr{r, deterministic};
                const BackwardPrediction b = PredictGradPlan(MakeGradPlan(gr, b2).plan, gr, p);
                const std::string name = std::string("ours, backward") + (deterministic ? " deterministic" : "") +
                                         ", " + mode + ", 16k";
                row(name.c_str(), column, b.cubeUtilization, Binding(b.bound, b.engineBusySeconds, b.mainSeconds));
            }
            const TilingData t = MakePlan(r, b2).plan.tiling;
            KernelDesign fast = DesignFromTiling(t, 2);
            fast.scoreBytes = 2;
            forward((std::string("design change: S written as fp16, ") + mode + ", 16k").c_str(),
                    PredictDesign(fast, t, r, p));
            forward((std::string("incumbent design, ") + mode + ", 16k").c_str(), PredictIncumbent(r, p));
            forward((std::string("256-row tile in cube passes, ") + mode + ", 16k").c_str(),
                    Predict(PlanBlocks(r, b2, true).plan, r, p));
        }
        for (int64_t seqlen : {16384, 32768}) {
            forward(("PTO design, non-causal, " + std::to_string(seqlen / 1024) + "k").c_str(),
                    PredictPto(Square(16, seqlen, false), p));
        }
    }
}

int main(int argc, char** argv)
{
    uint64_t seed = 20261121;
    if (argc == 3 && std::string(argv[1]) == "--seed") {
        seed = std::strtoull(argv[2], nullptr, 10);
    }
    TestTilingAndPlatforms();
    TestTimeline();
    TestCalibration();
    TestScheduleSemantics();
    TestBackwardModel();
    TestTargetsReport();
    TestFeaturesReport();
    TestRoundWidth();
    TestDesignChangesReport();
    TestCubePasses();
    TestSensitivityReport();
    TestFp16ScoresReport();
    TestDropoutCost();
    TestRefusals();
    TestBalance();
    TestRandomShapes(seed);
    if (g_failures != 0) {
        std::fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    std::printf("all planner tests passed\n");
    return 0;
}
