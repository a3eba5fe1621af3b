#include "grad_planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <type_traits>

#include "balanced_split.h"
#include "plan_parts.h"

namespace flash_cann {
namespace {

// Block shapes: blockQ and blockK multiples of the cube block (the kernel pads per-key
// vector rows to kKeyLanes itself; blockQ / 2, each vector core's half, is then a
// multiple of 8 rows), up to kMaxGradBlock. L0C holds the product scratch copies and the
// fp32 dK and dV accumulators of a key block, so the shapes compete for it; the products
// leave L0C in pieces (productRows rows, and the fast dQ dqColumns columns), so a piece
// and not a whole product must fit beside the accumulators. Per (blockQ, blockK) the
// planner takes two scratch copies if any piecing fits (with one, the cube waits for
// every piece to leave L0C through Fixpipe), the largest pieces that fit (fewest Mmads
// and Fixpipes); among those shapes the backward schedule model decides
// (BackwardSecondsPerScore: the main loop's steady state per score element, both passes
// with the deterministic dQ), ties (within kModelTie) to the fewer pieces per score.
// The model is asked on kRankingSoc's figures and kRankingCores cores, never the platform's
// core count: the deterministic dQ's bits may not depend on it.
constexpr uint32_t kMaxGradBlock = 128;
constexpr double kModelTie = 0.005;
constexpr uint32_t kRankingCores = 24;
constexpr int64_t kRankingSeqlen = 8192;
constexpr const char* kRankingSoc = "Ascend910B2";
// Rows per pre/post-pass chunk, largest first (multiples of 8).
constexpr uint32_t kPassRowCandidates[] = {128, 64, 32, 16, 8};
// The split's table of one (batch, head) segment stays at most this long.
constexpr uint64_t kMaxSplitUnitsPerSegment = 65536;
// fp32 holds every integer distance up to 2^24 exactly (ALiBi).
constexpr int64_t kMaxAlibiDistance = int64_t{1} << 24;
// The workspace's byte offsets are 64-bit; refuse far before they could wrap.
constexpr double kMaxWorkspaceBytes = 9.0e18;

std::string DescribeOverflow(const std::vector<LevelUse>& levels)
{
    for (const LevelUse& l : levels) {
        if (l.used > l.capacity) {
            return Message(MemLevelName(l.level), " ", l.used, " of ", l.capacity, " bytes");
        }
    }
    return "";
}

BackwardProblem ModelProblem(const PlanRequest& r)
{
    return BackwardProblem{r.batch, r.headsQ, r.headsKv, r.seqlenQ, r.seqlenK, r.headDim, r.causal, r.variant};
}

// The first piecing of blockQ x blockK (two scratch copies first, then one; the largest
// pieces first) whose buffers all fit, with the largest pass chunk that fits.
bool FitPieces(GradTilingData& t, uint32_t elemBytes, bool hasMask, bool deterministic, const Platform& p)
{
    // The deterministic query pass accumulates dQ (blockQ x D) where dK and dV were.
    if (deterministic && t.blockQ > 2 * t.blockK) {
        return false;
    }
    // Every level but L0C is the same for every piecing: the pass chunk with the least L0C.
    t.l0cScratchBuffers = 1;
    t.productRows = t.dqColumns = kCubeBlock;
    bool fits = false;
    for (uint32_t passRows : kPassRowCandidates) {
        t.passRows = passRows;
        if (Fits(SumLevels(ListGradBuffers(t, elemBytes, hasMask), p))) {
            fits = true;
            break;
        }
    }
    // Then L0C (its buffers are multiples of 32 bytes: no rounding) for the piecings.
    const uint64_t l0c = Capacity(MemLevel::L0C, p);
    for (uint32_t copies = kGradMaxL0cScratch; fits && copies >= 1; --copies) {
        t.l0cScratchBuffers = copies;
        for (uint32_t rows = t.blockQ;; rows = AlignUp(rows / 2, kCubeBlock)) {
            t.productRows = rows;
            for (uint32_t cols = t.headDimPad;; cols = AlignUp(cols / 2, kCubeBlock)) {
                t.dqColumns = cols;
                const GradBufferBytes bytes = ComputeGradBufferBytes(t, elemBytes);
                if (uint64_t{copies} * bytes.l0c + bytes.dkL0c + bytes.dvL0c <= l0c) {
                    return true;
                }
                if (cols == kCubeBlock) {
                    break;
                }
            }
            if (rows == kCubeBlock) {
                break;
            }
        }
    }
    return false;
}

struct Candidate {
    GradTilingData tiling;
    double bound;   // the model's shared-L2 seconds per score: a lower bound of its figure
    double pieces;  // Mmad + Fixpipe pieces per score element
};

// The candidate the model ranks first (above) on the problem of the ranking: the
// request's head_dim, dtype, causal, dQ variant and which features are on, at batch 1, 16
// heads, 8k (issue 11's reference shape; no window). Candidates are simulated in the order
// of their L2 bound until no later one can come within a tie. Kept per those inputs and
// candidates: requests that differ only in what fits (a key mask, a window's buffers)
// mostly share their candidates.
size_t RankedFirst(std::vector<Candidate>& candidates, const BackwardProblem& request, DType dtype,
                   bool deterministic)
{
    static std::mutex mutex;
    static std::map<std::vector<uint64_t>, size_t> ranked;
    std::vector<uint64_t> key = {uint64_t(request.headDim), uint64_t(dtype), request.causal, deterministic,
                                 request.variant.softcap > 0, request.variant.alibi != 0,
                                 request.variant.dropoutP > 0};
    for (const Candidate& c : candidates) {
        const GradTilingData& t = c.tiling;
        key.insert(key.end(), {t.blockQ, t.blockK, t.l0cScratchBuffers, t.productRows, t.dqColumns, t.fp16Scores});
    }
    {
        const std::lock_guard<std::mutex> lock(mutex);
        const auto known = ranked.find(key);
        if (known != ranked.end()) {
            return known->second;
        }
    }
    // The engine figures of one reference SoC: an AI-core count given for a launch changes
    // the rates and must not change the blocks, and the TilingFunc's platform (read from
    // the device) has no clock; which shapes fit is the platform's own.
    const Platform& ranking = *FindPlatform(kRankingSoc);
    BackwardProblem problem = request;
    problem.batch = 1;
    problem.headsQ = problem.headsKv = 16;
    problem.seqlenQ = problem.seqlenK = kRankingSeqlen;
    problem.variant.windowLeft = problem.variant.windowRight = -1;
    std::vector<size_t> order(candidates.size());
    for (size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
        candidates[i].bound = BackwardL2SecondsPerScore(GradDesign(candidates[i].tiling, dtype, deterministic), problem,
                                                        kRankingCores, ranking);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return candidates[a].bound < candidates[b].bound; });
    size_t best = order[0];
    double bestSeconds = 0;
    for (const size_t i : order) {
        const Candidate& c = candidates[i];
        if (bestSeconds > 0 && c.bound > bestSeconds * (1 + kModelTie)) {
            break;
        }
        const double seconds = BackwardSecondsPerScore(GradDesign(c.tiling, dtype, deterministic), problem,
                                                       kRankingCores, ranking);
        const bool tie = bestSeconds > 0 && std::fabs(seconds - bestSeconds) <= kModelTie * bestSeconds;
        if (bestSeconds == 0 || (!tie && seconds < bestSeconds) || (tie && c.pieces < candidates[best].pieces)) {
            best = i;
            bestSeconds = seconds;
        }
    }
    const std::lock_guard<std::mutex> lock(mutex);
    ranked.emplace(key, best);
    return best;
}

// What the block choice depends on: the buffers' sizes (head_dim, dtype, the key mask,
// the features that own buffers), the ranking's problem (causal, the dQ variant, the
// features that cost vector work) and the platform's capacities. The choice is kept per
// key, since the planner runs per call and the choice is most of its work.
std::vector<uint64_t> BlockChoiceKey(const GradTilingData& t, const GradPlanRequest& request, uint32_t elemBytes,
                                     const Platform& p)
{
    const PlanRequest& r = request.problem;
    std::vector<uint64_t> key = {t.headDimPad, elemBytes, uint64_t(r.dtype), r.causal, r.hasMask,
                                 request.deterministic, r.variant.softcap > 0, r.variant.alibi != 0,
                                 IsWindowed(r.variant), r.variant.dropoutP > 0, r.fp16Scores};
    for (const MemLevel level : {MemLevel::L1, MemLevel::L0A, MemLevel::L0B, MemLevel::L0C, MemLevel::UB}) {
        key.push_back(Capacity(level, p));
    }
    return key;
}

// The block shape and pieces the model ranks first (above); otherwise the refusal, naming
// what the smallest shape would need.
std::string ChooseGradBlocks(GradTilingData& t, const GradPlanRequest& request, uint32_t elemBytes,
                             const Platform& p)
{
    static std::mutex mutex;
    static std::map<std::vector<uint64_t>, GradTilingData> chosen;
    const std::vector<uint64_t> key = BlockChoiceKey(t, request, elemBytes, p);
    const PlanRequest& r = request.problem;
    const auto apply = [&](const GradTilingData& c) {
        t.blockQ = c.blockQ;
        t.blockK = c.blockK;
        t.l0cScratchBuffers = c.l0cScratchBuffers;
        t.productRows = c.productRows;
        t.dqColumns = c.dqColumns;
        t.passRows = c.passRows;
        t.keyBlocks = (t.seqlenK + t.blockK - 1) / t.blockK;
        t.queryBlocks = (t.seqlenQ + t.blockQ - 1) / t.blockQ;
    };
    {
        const std::lock_guard<std::mutex> lock(mutex);
        const auto known = chosen.find(key);
        if (known != chosen.end()) {
            apply(known->second);
            return "";
        }
    }
    std::vector<Candidate> candidates;
    for (uint32_t bk = kMaxGradBlock; bk >= kCubeBlock; bk -= kCubeBlock) {
        for (uint32_t bq = kMaxGradBlock; bq >= kCubeBlock; bq -= kCubeBlock) {
            t.blockQ = bq;
            t.blockK = bk;
            if (FitPieces(t, elemBytes, r.hasMask, request.deterministic, p)) {
                candidates.push_back({t, 0, double(bq / t.productRows) * (1 + t.headDimPad / t.dqColumns) / (bq * bk)});
            }
        }
    }
    if (candidates.empty()) {
        t.blockQ = t.blockK = t.productRows = t.dqColumns = kCubeBlock;
        t.l0cScratchBuffers = 1;
        return Message("head_dim ", t.headDim, ": no block shape of the backward fits ", p.name,
                       "'s buffers (the smallest, ", t.blockQ, "x", t.blockK, ", needs ",
                       DescribeOverflow(SumLevels(ListGradBuffers(t, elemBytes, r.hasMask), p)),
                       "; dK and dV of a key block stay in L0C)");
    }
    BackwardProblem problem = ModelProblem(r);
    problem.headDim = t.headDimPad;  // the key's
    const GradTilingData best =
        candidates[RankedFirst(candidates, problem, r.dtype, request.deterministic)].tiling;
    apply(best);
    const std::lock_guard<std::mutex> lock(mutex);
    chosen.emplace(key, best);
    return "";
}

// The work of one segment -- every segment's is the same: a (batch, head_kv) pair's key
// blocks (key pass) or a (batch, head_q) pair's query blocks (query pass) -- as prefix
// sums over split units of `splitBlocks` blocks, coarsened for very long sequences so
// that the tables stay small. Core boundaries fall on split units, so the prefixes
// measure any core exactly.
struct SegmentProfile {
    uint64_t blocks = 0;
    uint64_t splitBlocks = 1;
    std::vector<double> macs{0.0};   // macs[k]: modelled MACs of the first k split units
    std::vector<uint64_t> steps{0};  // steps[k]: the kernel's UnitCost / QueryUnitCost over them

    template <typename Macs, typename Steps>
    SegmentProfile(uint64_t blocksPerSegment, Macs macsOf, Steps stepsOf) : blocks(blocksPerSegment)
    {
        while ((blocks + splitBlocks - 1) / splitBlocks > kMaxSplitUnitsPerSegment) {
            splitBlocks *= 2;
        }
        const uint64_t units = (blocks + splitBlocks - 1) / splitBlocks;
        macs.resize(units + 1, 0.0);
        steps.resize(units + 1, 0);
        for (uint64_t block = 0; block < blocks; ++block) {
            macs[block / splitBlocks + 1] += macsOf(block);
            steps[block / splitBlocks + 1] += stepsOf(block);
        }
        for (uint64_t k = 0; k < units; ++k) {
            macs[k + 1] += macs[k];
            steps[k + 1] += steps[k];
        }
    }

    uint64_t Units() const { return macs.size() - 1; }

    // Split `segments` segments over at most `cores` AI cores into `start` (block units,
    // cores + 1 entries): the prefix is the exact modelled work of any range of split
    // units, so the split minimises the busiest core's work exactly. Returns the cores
    // used.
    uint32_t Split(uint64_t segments, uint32_t cores, uint64_t* start) const
    {
        const std::vector<uint64_t> starts = SplitPeriodicMinMax(macs, segments, cores);
        for (size_t c = 0; c <= kMaxCores; ++c) {  // split units -> block units; past the
            const uint64_t at = starts[std::min(c, starts.size() - 1)];  // last: empty ranges
            start[c] = at / Units() * blocks + at % Units() * splitBlocks;
        }
        return static_cast<uint32_t>(starts.size() - 1);
    }

    // Cumulative work of the block units [0, unit), `unit` on a split-unit boundary.
    template <typename Prefix>
    typename Prefix::value_type UpTo(const Prefix& prefix, uint64_t unit) const
    {
        using Value = typename Prefix::value_type;
        return static_cast<Value>(unit / blocks) * prefix[Units()] + prefix[unit % blocks / splitBlocks];
    }
};

// What the backward kernel cannot compute, by name and reason.
std::string CheckGradVariant(const PlanRequest& r)
{
    const VariantTiling& v = r.variant;
    // ALiBi's distances |i + offset - j| are formed in fp32 on the vector unit: exact up
    // to 2^24 only.
    if (v.alibi != 0u && std::max(r.seqlenQ, r.seqlenK) > kMaxAlibiDistance) {
        return Message("ALiBi at seqlen ", std::max(r.seqlenQ, r.seqlenK), ": the kernel forms the ",
                       "distance |i + seqlen_k - seqlen_q - j| in fp32, exact only up to ",
                       kMaxAlibiDistance);
    }
    return "";
}

}  // namespace

std::vector<BufferUse> ListGradBuffers(const GradTilingData& t, uint32_t elemBytes, bool hasMask)
{
    const GradBufferBytes b = ComputeGradBufferBytes(t, elemBytes);
    std::vector<BufferUse> buffers = {
        {t.fp16Scores ? "cube: Q block and its score offset panel" : "cube: Q block", "q_l1", MemLevel::L1,
         b.qL1, kGradStepsInFlight},
        {"cube: dO block", "do_l1", MemLevel::L1, b.doL1, kGradStepsInFlight},
        {t.fp16Scores ? "cube: K block and a ones panel, resident for a unit" : "cube: K block, resident for a unit",
         "k_l1", MemLevel::L1, b.kL1, kGradStepsInFlight},
        {"cube: V block, resident for a unit", "v_l1", MemLevel::L1, b.vL1, kGradStepsInFlight},
        {"cube: P block", "p_l1", MemLevel::L1, b.pL1, 1},
        {"cube: dS block", "ds_l1", MemLevel::L1, b.dsL1, 1},
        {"cube: A operand (Q, dO, dS, P^T, dS^T)", "a_l0a", MemLevel::L0A, b.l0a, 1},
        {"cube: B operand (K^T, V^T, dO, Q, K)", "b_l0b", MemLevel::L0B, b.l0b, 1},
        {"cube: product (S, dP or dQ), fp32", "c_l0c", MemLevel::L0C, b.l0c,
         t.l0cScratchBuffers},
        {"cube: dK accumulator of a unit, fp32", "dk_l0c", MemLevel::L0C, b.dkL0c, 1},
        {"cube: dV accumulator of a unit, fp32", "dv_l0c", MemLevel::L0C, b.dvL0c, 1},
        {t.fp16Scores ? "vector: S rows, fp16" : "vector: S rows, fp32 (becomes P)", "s_ub",
         MemLevel::UB, b.sUb, 1},
        {"vector: dP rows, fp32 (becomes dS)", "dp_ub", MemLevel::UB, b.dpUb, 1},
        {"vector: P rows", "p_ub", MemLevel::UB, b.pUb, 1},
        {"vector: dS rows", "ds_ub", MemLevel::UB, b.dsUb, 1},
        {"vector: row statistics (lse, D)", "rows_ub", MemLevel::UB, b.rowUb, kGradRowStats},
        {"vector: row statistic broadcast", "brc_ub", MemLevel::UB, b.brcUb, 1},
        {"vector: key bias, column index, scratch", "keys_ub", MemLevel::UB, b.keyUb,
         kGradKeyRows},
        {"vector: comparison bits", "bits_ub", MemLevel::UB, b.bitsUb, 1},
        {"pre/post-pass: dO and O rows in", "pass_in_ub", MemLevel::UB, b.passInUb, 2},
        {"pre/post-pass: fp32 rows (accumulator, operand, load from GM)", "pass_acc_ub",
         MemLevel::UB, b.passAccUb, 3},
        {"post-pass: gradient rows out", "pass_out_ub", MemLevel::UB, b.passOutUb, 1},
        {"pre-pass: D and partial row sums", "pass_row_ub", MemLevel::UB, b.passRowUb, 2},
    };
    // The features' buffers, only where the call uses the feature (GradBufferBytes), and
    // the fp16-score path's widened S.
    const std::vector<BufferUse> features = {
        {"vector: S rows widened to fp32 (becomes P)", "s_f32_ub", MemLevel::UB, b.sF32Ub, 1},
        {"vector: tanh(S / softcap), fp32 (the softcap chain rule)", "softcap_tanh_ub", MemLevel::UB,
         b.tanhUb, 1},
        {"vector: feature scratch rows, fp32 (softcap, ALiBi)", "feature_ub", MemLevel::UB, b.featureUb, 1},
        {"vector: ALiBi column-minus-row template, fp32", "alibi_ub", MemLevel::UB, b.alibiUb, 1},
        {"vector: window column index", "band_keys_ub", MemLevel::UB, b.bandKeyUb, 1},
        {"vector: window comparison bits", "band_bits_ub", MemLevel::UB, b.bandBitsUb, 1},
        {"vector: dropout's Philox scratch", "philox_ub", MemLevel::UB, b.philoxUb, 1},
        {"vector: dropout's keep bits", "keep_ub", MemLevel::UB, b.keepUb, 1},
    };
    for (const BufferUse& feature : features) {
        if (feature.bytes > 0) {
            buffers.push_back(feature);
        }
    }
    if (hasMask) {
        buffers.push_back({"vector: key mask bytes", "mask_ub", MemLevel::UB, b.maskUb, 1});
        buffers.push_back({"vector: key mask as half", "mask_half_ub", MemLevel::UB,
                           b.maskHalfUb, 1});
    }
    return buffers;
}

BackwardDesign GradDesign(const GradTilingData& t, DType dtype, bool deterministic)
{
    BackwardDesign d;
    d.blockQ = t.blockQ;
    d.blockK = t.blockK;
    d.headDimPad = t.headDimPad;
    d.elemBytes = ElementBytes(dtype);
    d.stepsAhead = kGradStepsInFlight;  // S, dP of the next step issue before this one's products
    d.kvL1Buffers = kGradStepsInFlight;  // K and V of the unit in flight and of the next
    d.exchangeSlots = kGradExchangeSlots;
    d.l0cScratchBuffers = t.l0cScratchBuffers;  // the kernel's product buffers (c_l0c)
    d.productRows = t.productRows;
    d.dqColumns = t.dqColumns;
    d.deterministic = deterministic;
    d.dropoutPassElements = t.variant.dropoutP > 0.0f ? GradDropoutPass(t.blockK) : 0;
    d.scoreBytes = t.fp16Scores != 0 ? 2 : 4;
    d.scoreOffsetColumns = ScoreDepth(t) - t.headDimPad;
    return d;
}

BackwardDesign GradDesign(const GradPlan& plan, DType dtype, bool deterministic)
{
    return GradDesign(plan.tiling, dtype, deterministic);
}

std::vector<BackwardCoreWork> GradModelWork(const GradPlan& plan)
{
    std::vector<BackwardCoreWork> work;
    for (const GradCoreWork& c : plan.cores) {
        work.push_back({c.unitEnd - c.unitBegin, c.steps, c.queryEnd - c.queryBegin, c.querySteps});
    }
    return work;
}

uint64_t GradUnitSteps(const GradTilingData& t, bool causal, uint64_t unit)
{
    return causal ? UnitCost<true>(t, unit) : UnitCost<false>(t, unit);
}

double GradUnitMacs(const GradTilingData& t, bool causal, bool deterministic, uint64_t unit)
{
    const GradUnit u = causal ? UnitAt<true>(t, unit) : UnitAt<false>(t, unit);
    const uint32_t blocks = u.endQueryBlock - u.firstQueryBlock;
    if (blocks == 0) {
        return 0;
    }
    const uint32_t lastRows = MinU32(t.blockQ, t.seqlenQ - (u.endQueryBlock - 1) * t.blockQ);
    const double rows = static_cast<double>(blocks - 1) * t.blockQ + AlignUp(lastRows, kCubeBlock);
    const double products = deterministic ? 4 : 5;  // S, dP, dV, dK (, dQ)
    return products * t.group * rows * AlignUp(u.keys, kCubeBlock) * t.headDimPad;
}

uint64_t GradQueryUnitSteps(const GradTilingData& t, bool causal, uint64_t unit)
{
    return causal ? QueryUnitCost<true>(t, unit) : QueryUnitCost<false>(t, unit);
}

double GradQueryUnitMacs(const GradTilingData& t, bool causal, uint64_t unit)
{
    const GradQueryUnit q = causal ? QueryUnitAt<true>(t, unit) : QueryUnitAt<false>(t, unit);
    if (q.endKeyBlock == q.firstKeyBlock) {
        return 0;
    }
    const uint32_t lastKeys = MinU32(t.blockK, t.seqlenK - (q.endKeyBlock - 1) * t.blockK);
    const double keys = static_cast<double>(q.endKeyBlock - q.firstKeyBlock - 1) * t.blockK +
                        AlignUp(lastKeys, kCubeBlock);
    return 3.0 * AlignUp(q.rows, kCubeBlock) * keys * t.headDimPad;  // S, dP, dQ
}

GradPlanResult MakeGradPlan(const GradPlanRequest& request, const Platform& platform)
{
    GradPlanResult result;
    const PlanRequest& r = request.problem;
    result.error = CheckRequest(r, platform);
    if (result.ok()) {
        result.error = CheckGradVariant(r);
    }
    if (!result.ok()) {
        return result;
    }
    GradPlan& plan = result.plan;
    GradTilingData& t = plan.tiling;
    const uint32_t elemBytes = ElementBytes(r.dtype);
    SetProblem(t, r);
    t.fp16Scores = r.fp16Scores ? 1 : 0;
    result.error = ChooseGradBlocks(t, request, elemBytes, platform);
    if (!result.ok()) {
        return result;
    }
    plan.buffers = ListGradBuffers(t, elemBytes, r.hasMask);
    plan.levels = SumLevels(plan.buffers, platform);
    result.error = CheckPipeBuffers(plan.buffers);
    if (!result.ok()) {
        return result;
    }
    t.dqChunkBlocks = t.keyBlocks;  // retired fields (GradTilingData)
    t.dqSlots = 1;
    const double queryRows = static_cast<double>(GradQueryRows(t));
    const double keyRows = static_cast<double>(GradKeyRows(t));
    const double fp32Bytes = (queryRows + 2 * keyRows) * t.headDimPad * 4.0;
    if (fp32Bytes > kMaxWorkspaceBytes) {
        result.error = Message("the backward's fp32 workspace (dQ, dK, dV: ", fp32Bytes,
                               " bytes) overflows the kernel's 64-bit offsets");
        return result;
    }

    const uint32_t cores = std::min(platform.aicCores, kMaxCores);
    const bool queryPass = request.deterministic;
    std::fill(std::begin(t.unitStart), std::end(t.unitStart), 0);
    std::fill(std::begin(t.queryStart), std::end(t.queryStart), 0);
    if (IsPacked(t)) {
        // The units and their split are the kernel's, on the device (flash_cann_packed.h):
        // every core it can use, no more than there can be units (each sequence adds at
        // most one partial key block per kv head, one partial query block per query head).
        uint64_t units = uint64_t{t.headsKv} * ((t.tokensK + t.blockK - 1) / t.blockK + t.batch);
        if (queryPass) {
            units = std::max(units, uint64_t{t.headsQ} * ((t.tokensQ + t.blockQ - 1) / t.blockQ + t.batch));
        }
        t.units = 0;
        t.queryUnits = 0;
        t.usedCores = static_cast<uint32_t>(std::min<uint64_t>(cores, units));
    } else {
        const SegmentProfile keys(
            t.keyBlocks, [&](uint64_t b) { return GradUnitMacs(t, r.causal, queryPass, b); },
            [&](uint64_t b) { return GradUnitSteps(t, r.causal, b); });
        const uint64_t keySegments = uint64_t{t.batch} * t.headsKv;
        t.units = keySegments * t.keyBlocks;
        t.usedCores = keys.Split(keySegments, cores, t.unitStart);
        const SegmentProfile queries(
            queryPass ? t.queryBlocks : 0, [&](uint64_t b) { return GradQueryUnitMacs(t, r.causal, b); },
            [&](uint64_t b) { return GradQueryUnitSteps(t, r.causal, b); });
        if (queryPass) {
            const uint64_t querySegments = uint64_t{t.batch} * t.headsQ;
            t.queryUnits = querySegments * t.queryBlocks;
            t.usedCores = std::max(t.usedCores, queries.Split(querySegments, cores, t.queryStart));
        } else {
            t.queryBlocks = 0;
            t.queryUnits = 0;
        }
        for (uint32_t c = 0; c < t.usedCores; ++c) {
            GradCoreWork w{t.unitStart[c], t.unitStart[c + 1], 0, t.queryStart[c], t.queryStart[c + 1], 0, 0, 0};
            w.steps = keys.UpTo(keys.steps, w.unitEnd) - keys.UpTo(keys.steps, w.unitBegin);
            w.macs = keys.UpTo(keys.macs, w.unitEnd) - keys.UpTo(keys.macs, w.unitBegin);
            if (queryPass) {
                w.querySteps = queries.UpTo(queries.steps, w.queryEnd) - queries.UpTo(queries.steps, w.queryBegin);
                w.queryMacs = queries.UpTo(queries.macs, w.queryEnd) - queries.UpTo(queries.macs, w.queryBegin);
            }
            plan.cores.push_back(w);
        }
    }
    double total = 0;
    double busiest = 0;
    for (const GradCoreWork& c : plan.cores) {  // a core runs its key pass, then its query pass
        total += c.macs + c.queryMacs;
        busiest = std::max(busiest, c.macs + c.queryMacs);
    }
    plan.imbalance = total > 0 ? busiest / (total / platform.aicCores) : 1.0;
    plan.blockDim = t.usedCores;
    const std::string launchError = CheckAllCoreLaunch(plan.blockDim, platform);
    if (!launchError.empty()) {
        result.error = launchError;
        return result;
    }

    const GradWorkspace ws(t, elemBytes);
    plan.userWorkspaceBytes = ws.total;
    plan.workspace = {ws.dq - ws.delta, ws.dk - ws.dq, ws.exchange - ws.dk, ws.offsets - ws.exchange,
                      ws.total - ws.offsets};
    plan.tilingKey = GradTilingKey(r.dtype == DType::BFloat16, r.causal, r.hasMask,
                                   request.deterministic, t.fp16Scores);
    return result;
}

BackwardPrediction PredictGradPlan(const GradPlan& plan, const GradPlanRequest& request,
                                   const Platform& platform)
{
    const PlanRequest& r = request.problem;
    return PredictBackward(GradDesign(plan, r.dtype, request.deterministic), ModelProblem(r),
                           GradModelWork(plan), platform);
}

}  // namespace flash_cann
