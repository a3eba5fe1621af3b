// Tests of the device-side walk and split of packed sequences (op_kernel/
// flash_cann_packed.h), which the kernels run on every core from cu_seqlens in GM: here
// from host vectors, with the planner's real tilings. For random batches (lengths 0, 1,
// unequal q/k, causal, windows) and core counts 1-48:
//   - the cores' tiles (forward) and steps (backward) are the whole walk, each exactly
//     once, every core's a contiguous run of it, in order;
//   - the deterministic backward's query pass walks the key pass's steps, query block first;
//   - the work per core is balanced: the busiest core within one item of the mean;
//   - tokens outside the batch (malformed offsets) are never addressed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include "../../../op_kernel/flash_cann_packed.h"
#include "cost_model.h"
#include "grad_planner.h"
#include "planner_test_support.h"

using namespace flash_cann;
using flash_cann_test::g_failures;

namespace {

// cu_seqlens from host vectors: the Offsets reader of the walks.
struct HostSeqlens {
    std::vector<int32_t> q, k;
    int64_t Query(uint32_t b) const { return q[b]; }
    int64_t Key(uint32_t b) const { return k[b]; }
};

struct Batch {
    HostSeqlens cu;
    int64_t maxQ = 1, maxK = 1;
};

Batch RandomBatch(std::mt19937_64& rng, uint32_t sequences, int64_t longest)
{
    Batch b;
    b.cu.q = {0};
    b.cu.k = {0};
    std::uniform_int_distribution<int> kind(0, 5);
    for (uint32_t i = 0; i < sequences; ++i) {
        auto length = [&]() -> int64_t {
            switch (kind(rng)) {
                case 0: return 0;
                case 1: return 1;
                default: return flash_cann_test::LogUniform(rng, 1, longest);
            }
        };
        const int64_t lq = length();
        const int64_t lk = length();
        b.cu.q.push_back(b.cu.q.back() + static_cast<int32_t>(lq));
        b.cu.k.push_back(b.cu.k.back() + static_cast<int32_t>(lk));
        b.maxQ = std::max(b.maxQ, lq);
        b.maxK = std::max(b.maxK, lk);
    }
    return b;
}

PlanRequest PackedRequest(const Batch& b, int64_t headsQ, int64_t headsKv, bool causal,
                          int64_t windowLeft, int64_t windowRight)
{
    PlanRequest r;
    r.batch = static_cast<int64_t>(b.cu.q.size()) - 1;
    r.headsQ = headsQ;
    r.headsKv = headsKv;
    r.seqlenQ = b.maxQ;
    r.seqlenK = b.maxK;
    r.headDim = 64;
    r.layout = Layout::TND;
    r.causal = causal;
    r.scale = 0.125;
    r.tokensQ = std::max<int64_t>(1, b.cu.q.back());
    r.tokensK = std::max<int64_t>(1, b.cu.k.back());
    r.variant = MakeVariant(windowLeft, causal ? -1 : windowRight, 0, 0, Alibi::kNone, false);
    return r;
}

bool SameTile(const QueryTile& a, const QueryTile& b)
{
    return a.batch == b.batch && a.headQ == b.headQ && a.row0 == b.row0 && a.rows == b.rows;
}

template <bool CAUSAL>
void CheckForward(const TilingData& t, const HostSeqlens& cu, uint32_t cores, double& worst)
{
    std::vector<QueryTile> all;
    std::vector<uint64_t> work;
    PackedTiles<CAUSAL, HostSeqlens> tiles(t, cu);
    QueryTile tile{};
    uint64_t total = 0, largest = 0;
    while (tiles.Next(tile)) {
        all.push_back(tile);
        work.push_back(PackedTileWork<CAUSAL>(t, tile));
        total += work.back();
        largest = std::max(largest, work.back());
        EXPECT(tile.qBase / t.qStrideRow + tile.row0 + tile.rows <= t.tokensQ &&
                   tile.kvBase / t.kvStrideRow + tile.seqlenK <= t.tokensK,
               "tile outside the tokens");
    }
    size_t next = 0;
    uint64_t busiest = 0;
    for (uint32_t c = 0; c < cores; ++c) {
        PackedTileWalk<CAUSAL, HostSeqlens> walk;
        walk.Start(t, cu, c, cores);
        uint64_t mine = 0;
        while (walk.Next(tile)) {
            EXPECT(next < all.size() && SameTile(tile, all[next]),
                   "core %u's tile %zu is not the walk's next", c, next);
            if (next < all.size()) {
                mine += work[next];
            }
            ++next;
        }
        busiest = std::max(busiest, mine);
    }
    EXPECT(next == all.size(), "the cores took %zu of %zu tiles", next, all.size());
    if (total > 0) {
        // Within one item of an equal share (the midpoint rule).
        EXPECT(busiest <= total / cores + largest, "busiest %llu, share %llu, largest item %llu",
               static_cast<unsigned long long>(busiest),
               static_cast<unsigned long long>(total / cores),
               static_cast<unsigned long long>(largest));
        if (total >= 16 * cores * largest) {  // enough items for the ratio to say something
            worst = std::max(worst, static_cast<double>(busiest) / (static_cast<double>(total) / cores));
        }
    }
}

// One step of a backward walk: (sequence, query head, query row, key block).
using GradStepKey = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;

// The steps of one pass's walk on each of `cores` cores: each core's run is the next
// stretch of the one-core walk, and the runs tile it. Returns the one-core walk's steps.
template <bool CAUSAL, bool QUERY_PASS>
std::vector<GradStepKey> CheckBackwardPass(const GradTilingData& t, const HostSeqlens& cu, uint32_t cores)
{
    using Walk = PackedStepWalk<CAUSAL, QUERY_PASS, HostSeqlens>;
    using Items = PackedOwnedItems<CAUSAL, QUERY_PASS, HostSeqlens>;
    std::vector<GradStepKey> all;
    Walk whole(t, Items(t, cu, 0, 1));
    while (whole.Next()) {
        all.emplace_back(whole.unit.batch, whole.step.headQ, whole.step.row0, whole.unit.keyBlock);
        EXPECT(whole.unit.k0 + whole.unit.key0 + whole.unit.keys <= t.tokensK &&
                   whole.unit.q0 + whole.step.row0 + whole.step.rows <= t.tokensQ &&
                   whole.step.headQ / t.group == whole.unit.headKv,
               "step outside the tokens");
    }
    size_t next = 0;
    for (uint32_t c = 0; c < cores; ++c) {
        Walk cursor(t, Items(t, cu, c, cores));
        while (cursor.Next()) {
            const GradStepKey got(cursor.unit.batch, cursor.step.headQ, cursor.step.row0, cursor.unit.keyBlock);
            EXPECT(next < all.size() && got == all[next], "%s pass: core %u's step %zu is not the walk's next",
                   QUERY_PASS ? "query" : "key", c, next);
            ++next;
        }
    }
    EXPECT(next == all.size(), "the cores took %zu of %zu steps", next, all.size());
    return all;
}

// The key pass's walk; with the deterministic dQ also the query pass's, which must visit
// exactly the key pass's (query block, key block) steps.
template <bool CAUSAL>
void CheckBackward(const GradTilingData& t, const HostSeqlens& cu, uint32_t cores, bool deterministic)
{
    std::vector<GradStepKey> keys = CheckBackwardPass<CAUSAL, false>(t, cu, cores);
    if (deterministic) {
        std::vector<GradStepKey> queries = CheckBackwardPass<CAUSAL, true>(t, cu, cores);
        std::sort(keys.begin(), keys.end());
        std::sort(queries.begin(), queries.end());
        EXPECT(keys == queries, "the query pass walks %zu steps, the key pass %zu (or others)", queries.size(),
               keys.size());
    }
}

// The schedule model's prediction (910B2, fp16, head_dim 128, causal, 16 query heads, 16
// kv heads) for a packed batch of documents (lengths summing to the tokens), against the
// dense batch with the same tokens: `dense` sequences of tokens / dense rows each.
// Printed as report lines for docs/schedule-model.md: PREDICTIONS, not measurements.
void ReportVarlenPrediction(const char* name, const std::vector<int32_t>& lengths, int64_t denseBatch)
{
    const Platform b2 = *FindPlatform("Ascend910B2");
    Batch packed;
    packed.cu.q = {0};
    for (int32_t l : lengths) {
        packed.cu.q.push_back(packed.cu.q.back() + l);
        packed.maxQ = std::max<int64_t>(packed.maxQ, l);
    }
    packed.cu.k = packed.cu.q;
    packed.maxK = packed.maxQ;
    PlanRequest r = PackedRequest(packed, 16, 16, true, -1, -1);
    r.headDim = 128;
    r.scale = 1.0 / std::sqrt(128.0);
    const PlanResult plan = MakePlan(r, b2);
    EXPECT(plan.ok(), "%s: refused: %s", name, plan.error.c_str());
    PlanRequest dense;
    dense.batch = denseBatch;
    dense.headsQ = dense.headsKv = 16;
    dense.seqlenQ = dense.seqlenK = r.tokensQ / denseBatch;
    dense.headDim = 128;
    dense.layout = Layout::BSND;
    dense.causal = true;
    dense.scale = r.scale;
    const PlanResult densePlan = MakePlan(dense, b2);
    EXPECT(densePlan.ok(), "%s: dense refused: %s", name, densePlan.error.c_str());
    if (!plan.ok() || !densePlan.ok()) {
        return;
    }
    const Prediction p = PredictPacked(plan.plan, r, b2, packed.cu.q, packed.cu.k);
    const Prediction d = Predict(densePlan.plan, dense, b2);
    const double tflops = p.usefulFlops / p.seconds / 1e12;
    const double denseTflops = d.usefulFlops / d.seconds / 1e12;
    std::printf("varlen prediction | %s | %lld tokens | %.1f us | %.1f TFLOP/s | dense %lld x %lld: "
                "%.1f us, %.1f TFLOP/s | varlen / dense throughput %.3f | busiest core / mean "
                "%.3f | bound %s\n",
                name, static_cast<long long>(r.tokensQ), p.seconds * 1e6, tflops,
                static_cast<long long>(denseBatch), static_cast<long long>(dense.seqlenQ),
                d.seconds * 1e6, denseTflops, tflops / denseTflops,
                p.meanCoreSeconds > 0 ? p.coreSeconds / p.meanCoreSeconds : 0.0, p.bound.c_str());
}

}  // namespace

int main()
{
    std::mt19937_64 rng(24);
    const Platform platform = flash_cann_test::WithCores(24);
    double worst = 1.0;
    int cases = 0;
    for (int i = 0; i < 300; ++i) {
        const uint32_t sequences = static_cast<uint32_t>(flash_cann_test::LogUniform(rng, 1, 40));
        const Batch b = RandomBatch(rng, sequences, i % 3 == 0 ? 3000 : 300);
        const int64_t headsKv = flash_cann_test::LogUniform(rng, 1, 4);
        const int64_t headsQ = headsKv * flash_cann_test::LogUniform(rng, 1, 4);
        const bool causal = i % 2 == 0;
        const int64_t left = i % 5 == 1 ? flash_cann_test::LogUniform(rng, 1, 500) - 1 : -1;
        const int64_t right = i % 7 == 3 ? flash_cann_test::LogUniform(rng, 1, 100) - 1 : -1;
        const PlanRequest r = PackedRequest(b, headsQ, headsKv, causal, left, right);
        const PlanResult forward = MakePlan(r, platform);
        EXPECT(forward.ok(), "forward refused: %s", forward.error.c_str());
        const bool deterministic = i % 4 < 2;
        const GradPlanResult backward = MakeGradPlan({r, deterministic}, platform);
        EXPECT(backward.ok(), "backward refused: %s", backward.error.c_str());
        if (!forward.ok() || !backward.ok()) {
            continue;
        }
        for (uint32_t cores : {1u, 3u, 24u, 48u}) {
            if (causal) {
                CheckForward<true>(forward.plan.tiling, b.cu, cores, worst);
                CheckBackward<true>(backward.plan.tiling, b.cu, cores, deterministic);
            } else {
                CheckForward<false>(forward.plan.tiling, b.cu, cores, worst);
                CheckBackward<false>(backward.plan.tiling, b.cu, cores, deterministic);
            }
            ++cases;
        }
    }
    // Malformed offsets (decreasing, past the tokens) are clamped: nothing outside.
    Batch bad;
    bad.cu.q = {0, 50, 20, 400};
    bad.cu.k = {0, 30, 10, 999};
    bad.maxQ = bad.maxK = 400;
    PlanRequest r = PackedRequest(bad, 2, 1, true, -1, -1);
    r.tokensQ = 100;
    r.tokensK = 60;
    const PlanResult forward = MakePlan(r, platform);
    const GradPlanResult backward = MakeGradPlan({r, true}, platform);
    EXPECT(forward.ok() && backward.ok(), "malformed offsets: planner refused");
    if (forward.ok() && backward.ok()) {
        CheckForward<true>(forward.plan.tiling, bad.cu, 5, worst);
        CheckBackward<true>(backward.plan.tiling, bad.cu, 5, true);
    }
    // Negative offsets (a first entry below 0, one inside) clamp to token 0.
    Batch negative;
    negative.cu.q = {-7, 30, -2, 100};
    negative.cu.k = {-9, 20, 40, 60};
    negative.maxQ = negative.maxK = 110;
    PlanRequest n = PackedRequest(negative, 2, 1, true, -1, -1);
    n.tokensQ = 100;
    n.tokensK = 60;
    const PlanResult forwardN = MakePlan(n, platform);
    const GradPlanResult backwardN = MakeGradPlan({n, true}, platform);
    EXPECT(forwardN.ok() && backwardN.ok(), "negative offsets: planner refused");
    if (forwardN.ok() && backwardN.ok()) {
        CheckForward<true>(forwardN.plan.tiling, negative.cu, 5, worst);
        CheckBackward<true>(backwardN.plan.tiling, negative.cu, 5, true);
    }
    // Same tokens, same work: 8 documents of 2048 vs the dense batch 8 x 2048.
    ReportVarlenPrediction("8 x 2048 (equal)", std::vector<int32_t>(8, 2048), 8);
    // The case: 7 documents, 16k tokens, causal (lengths drawn once, fixed here).
    ReportVarlenPrediction("7 documents", {5120, 3072, 2560, 2048, 1536, 1024, 1024}, 8);
    ReportVarlenPrediction("7 documents, skewed", {9000, 3000, 1500, 1200, 800, 500, 384}, 8);
    ReportVarlenPrediction("64 x 256 (short)", std::vector<int32_t>(64, 256), 64);
    std::printf("packed walks: %d (batch, core count) cases; forward busiest core / mean <= %.3f "
                "where the work is >= 16 items per core\n",
                cases, worst);
    if (g_failures == 0) {
        std::printf("all packed walk tests passed\n");
    }
    return g_failures == 0 ? 0 : 1;
}
