// Planner tests: every plan fits and covers the work exactly once (10,000 random
// shapes), the split is balanced, refusals say what is wrong, the tiling data fits
// CANN's buffer. Exit status 0 = all passed. `planner_tests --seed N` reruns a draw.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cost_model.h"
#include "planner.h"
#include "work_model.h"

using namespace flash_cann;

namespace {

int g_failures = 0;

#define EXPECT(cond, ...)                                                        \
    do {                                                                         \
        if (!(cond)) {                                                           \
            ++g_failures;                                                        \
            std::fprintf(stderr, "%s:%d: EXPECT(%s) failed: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                   \
            std::fprintf(stderr, "\n");                                          \
        }                                                                        \
    } while (0)

std::string Describe(const PlanRequest& r, uint32_t cores)
{
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld dtype=%u layout=%u causal=%d "
                  "mask=%d cores=%u",
                  static_cast<long long>(r.batch), static_cast<long long>(r.headsQ),
                  static_cast<long long>(r.headsKv), static_cast<long long>(r.seqlenQ),
                  static_cast<long long>(r.seqlenK), static_cast<long long>(r.headDim),
                  static_cast<unsigned>(r.dtype), static_cast<unsigned>(r.layout), r.causal,
                  r.hasMask, cores);
    return buf;
}

Platform WithCores(uint32_t cores)
{
    return WithAiCores(*FindPlatform("Ascend910B2"), cores);
}

// Visible keys of query row `row` (bottom-right causal).
uint32_t VisibleKeys(const TilingData& t, bool causal, uint32_t row)
{
    if (!causal) {
        return t.seqlenK;
    }
    const int64_t v = static_cast<int64_t>(row) + 1 + t.causalOffset;
    return v <= 0 ? 0 : static_cast<uint32_t>(std::min<int64_t>(v, t.seqlenK));
}

// Every buffer fits its level; the row ranges partition all rows; walking each core's
// tiles with the kernel's NextTile visits every query row exactly once, each tile lies
// in one (batch, head) pair and spans at most blockQ rows, and the key blocks a tile
// visits ([0, KeyEnd)) are exactly those holding a key visible to some of its rows.
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
            const uint32_t keyEnd = r.causal ? KeyEnd<true>(t, tile) : KeyEnd<false>(t, tile);
            const uint32_t last = VisibleKeys(t, r.causal, tile.row0 + tile.rows - 1);
            EXPECT(keyEnd == last, "%s: tile visits keys [0, %u) but its rows see [0, %u)",
                   what.c_str(), keyEnd, last);
            covered += tile.rows;
        }
    }
    EXPECT(covered == totalRows, "%s: covered %llu of %llu rows", what.c_str(),
           static_cast<unsigned long long>(covered), static_cast<unsigned long long>(totalRows));
    EXPECT(plan.userWorkspaceBytes == t.workspacePerCore * t.usedCores, "%s: workspace",
           what.c_str());
    EXPECT(plan.prediction.seconds > 0 && plan.prediction.cubeUtilization > 0 &&
               plan.prediction.cubeUtilization <= 1.0,
           "%s: prediction %g s, utilisation %g", what.c_str(), plan.prediction.seconds,
           plan.prediction.cubeUtilization);
}

int64_t LogUniform(std::mt19937_64& rng, int64_t lo, int64_t hi)
{
    std::uniform_real_distribution<double> u(std::log(double(lo)), std::log(double(hi) + 1));
    return std::min<int64_t>(hi, static_cast<int64_t>(std::exp(u(rng))));
}

void TestRandomShapes(uint64_t seed)
{
    std::mt19937_64 rng(seed);
    const int kShapes = 10000;
    const int failuresBefore = g_failures;
    int planned = 0;
    for (; planned < kShapes && g_failures - failuresBefore < 20; ++planned) {
        PlanRequest r;
        r.headsKv = LogUniform(rng, 1, 16);
        r.headsQ = r.headsKv * LogUniform(rng, 1, 8);
        r.seqlenQ = LogUniform(rng, 1, 128 * 1024);
        r.seqlenK = LogUniform(rng, 1, 128 * 1024);
        // Keep the exhaustive tile walk affordable: at most ~4M query rows per plan.
        const int64_t maxBatch = std::max<int64_t>(1, (int64_t{1} << 22) / (r.headsQ * r.seqlenQ));
        r.batch = LogUniform(rng, 1, std::min<int64_t>(64, maxBatch));
        r.headDim = 1 + static_cast<int64_t>(rng() % 256);
        r.dtype = (rng() & 1) ? DType::BFloat16 : DType::Float16;
        r.layout = (rng() & 1) ? Layout::BSND : Layout::BNSD;
        r.causal = rng() & 1;
        r.hasMask = rng() & 1;
        r.scale = 1.0 / std::sqrt(double(r.headDim));
        const uint32_t cores = (rng() % 4 == 0) ? 1 + rng() % kMaxCores : (rng() & 1 ? 20 : 24);
        CheckPlan(r, cores);
    }
    // After 20 failures the walk stops: say how far it got, not the planned count.
    if (g_failures == failuresBefore) {
        std::printf("random shapes: %d plans (seed %llu) fit and cover every query/key block "
                    "once\n", planned, static_cast<unsigned long long>(seed));
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

}  // namespace

int main(int argc, char** argv)
{
    uint64_t seed = 20261121;
    if (argc == 3 && std::string(argv[1]) == "--seed") {
        seed = std::strtoull(argv[2], nullptr, 10);
    }
    TestTilingAndPlatforms();
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
