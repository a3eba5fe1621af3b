#include "grad_planner.h"

#include <algorithm>
#include <type_traits>

#include "balanced_split.h"
#include "plan_parts.h"

namespace flash_cann {
namespace {

// Block shapes: blockQ and blockK multiples of the cube block (the kernel pads per-key
// vector rows to kKeyLanes itself; blockQ / 2, each vector core's half, is then a
// multiple of 8 rows), up to kMaxGradBlock. L0C holds the product scratch copies and the
// fp32 dK and dV accumulators of a key block, so the shapes compete for it. Preferred
// first (the order the backward schedule model ranks them in, docs/planner.md):
//   1. two L0C scratch copies (with one, the cube waits for every S, dP and dQ to leave
//      L0C through Fixpipe: at head_dim 128, 128x64 with one copy 29 % of peak);
//   2. the longest key block (dQ's Fixpipe and L2 bytes per score are 4 D / blockK);
//   3. the tallest query block of at least kMinPreferredBlockQ rows (16-row blocks leave
//      the cube waiting on L1 -> L0 loads): at head_dim 128, 32x96 with two copies 40 %.
// Then the same with one copy, then 16-row query blocks. Deterministic dQ takes only
// power-of-two key blocks: its split cannot cut a dQ chunk (at most kMaxDqSlots per
// (batch, head_kv)), and equal chunks of a power-of-two sequence balance where ragged
// ones do not (1x16x8192x128 causal on 24 cores: 32x96 1.069 max/mean, 64x64 1.023).
// The choice depends on the problem alone, never the core count (determinism).
constexpr uint32_t kMaxGradBlock = 128;
constexpr uint32_t kMinPreferredBlockQ = 32;
// Rows per pre/post-pass chunk, largest first (multiples of 8).
constexpr uint32_t kPassRowCandidates[] = {128, 64, 32, 16, 8};
// The split's table of one (batch, head_kv) segment stays at most this long.
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

// The first shape (in the order above) whose buffers fit, with the largest pass chunk
// that still fits; otherwise the refusal, naming what the smallest shape would need.
std::string ChooseGradBlocks(GradTilingData& t, uint32_t elemBytes, bool hasMask,
                             bool deterministic, const Platform& p)
{
    auto levels = [&] { return SumLevels(ListGradBuffers(t, elemBytes, hasMask), p); };
    auto tryShapes = [&](uint32_t copies, uint32_t maxBlockQ, uint32_t minBlockQ) {
        t.l0cScratchBuffers = copies;
        for (uint32_t bk = kMaxGradBlock; bk >= kCubeBlock; bk -= kCubeBlock) {
            if (deterministic && (bk & (bk - 1)) != 0) {
                continue;
            }
            for (uint32_t bq = maxBlockQ; bq >= minBlockQ; bq -= kCubeBlock) {
                t.blockQ = bq;
                t.blockK = bk;
                for (uint32_t rows : kPassRowCandidates) {
                    t.passRows = rows;
                    if (Fits(levels())) {
                        t.keyBlocks = (t.seqlenK + t.blockK - 1) / t.blockK;
                        return true;
                    }
                }
            }
        }
        return false;
    };
    for (uint32_t copies = kGradMaxL0cScratch; copies >= 1; --copies) {
        if (tryShapes(copies, kMaxGradBlock, kMinPreferredBlockQ)) {
            return "";
        }
    }
    for (uint32_t copies = kGradMaxL0cScratch; copies >= 1; --copies) {
        if (tryShapes(copies, kCubeBlock, kCubeBlock)) {
            return "";
        }
    }
    return Message("head_dim ", t.headDim, ": no block shape of the backward fits ", p.name,
                   "'s buffers (the smallest, ", t.blockQ, "x", t.blockK, ", needs ",
                   DescribeOverflow(levels()), "; dK and dV of a key block stay in L0C)");
}

// Deterministic dQ: chunks of dqChunkBlocks key blocks, one fp32 dQ slot each. Chosen
// from the problem alone (never the core count), so every split sums in the same order.
void ChooseDqChunks(GradTilingData& t, bool deterministic)
{
    if (!deterministic) {
        t.dqChunkBlocks = t.keyBlocks;
        t.dqSlots = 1;
        return;
    }
    const uint64_t pairs = uint64_t{t.batch} * t.headsKv;
    const uint64_t wanted = std::max<uint64_t>(1, (kTargetDqChunks + pairs - 1) / pairs);
    const uint64_t slots = std::min<uint64_t>({wanted, kMaxDqSlots, t.keyBlocks});
    t.dqChunkBlocks = static_cast<uint32_t>((t.keyBlocks + slots - 1) / slots);
    t.dqSlots = (t.keyBlocks + t.dqChunkBlocks - 1) / t.dqChunkBlocks;
}

// The work of one (batch, head_kv) segment -- every segment's is the same -- as prefix
// sums over split units of `splitBlocks` key blocks: a multiple of the dQ chunk when
// deterministic (the split must not cut a chunk), coarsened for very long sequences so
// that the tables stay small. Core boundaries fall on split units, so the prefixes
// measure any core exactly.
struct SegmentProfile {
    uint64_t splitBlocks = 1;
    std::vector<double> macs{0.0};   // macs[k]: modelled MACs of the first k split units
    std::vector<uint64_t> steps{0};  // steps[k]: the kernel's UnitCost over them

    SegmentProfile(const GradTilingData& t, bool causal, bool deterministic)
    {
        splitBlocks = deterministic ? t.dqChunkBlocks : 1;
        while ((t.keyBlocks + splitBlocks - 1) / splitBlocks > kMaxSplitUnitsPerSegment) {
            splitBlocks *= 2;
        }
        const uint64_t units = (t.keyBlocks + splitBlocks - 1) / splitBlocks;
        macs.resize(units + 1, 0.0);
        steps.resize(units + 1, 0);
        for (uint64_t block = 0; block < t.keyBlocks; ++block) {
            macs[block / splitBlocks + 1] += GradUnitMacs(t, causal, block);
            steps[block / splitBlocks + 1] += GradUnitSteps(t, causal, block);
        }
        for (uint64_t k = 0; k < units; ++k) {
            macs[k + 1] += macs[k];
            steps[k + 1] += steps[k];
        }
    }

    uint64_t Units() const { return macs.size() - 1; }
};

// Split the units over at most `cores` AI cores: the prefix is the exact modelled work of
// any range of split units, so the split minimises the busiest core's work exactly.
void SplitUnits(GradTilingData& t, const SegmentProfile& profile, uint32_t cores)
{
    const uint64_t segments = uint64_t{t.batch} * t.headsKv;
    const uint64_t perSegment = profile.Units();
    const std::vector<uint64_t> starts = SplitPeriodicMinMax(profile.macs, segments, cores);
    t.units = segments * t.keyBlocks;
    t.usedCores = static_cast<uint32_t>(starts.size() - 1);
    std::fill(std::begin(t.unitStart), std::end(t.unitStart), 0);
    for (size_t c = 0; c < starts.size(); ++c) {  // split units -> key-block units
        t.unitStart[c] = starts[c] / perSegment * t.keyBlocks +
                         starts[c] % perSegment * profile.splitBlocks;
    }
}

std::vector<GradCoreWork> MeasureGradCores(const GradTilingData& t, const SegmentProfile& profile)
{
    const uint64_t perSegment = profile.Units();
    // Cumulative work of the units [0, unit), `unit` on a split-unit boundary.
    auto upTo = [&](const auto& prefix, uint64_t unit) {
        using Value = typename std::decay_t<decltype(prefix)>::value_type;
        return static_cast<Value>(unit / t.keyBlocks) * prefix[perSegment] +
               prefix[unit % t.keyBlocks / profile.splitBlocks];
    };
    std::vector<GradCoreWork> cores;
    for (uint32_t c = 0; c < t.usedCores; ++c) {
        const uint64_t begin = t.unitStart[c];
        const uint64_t end = t.unitStart[c + 1];
        cores.push_back({begin, end, upTo(profile.steps, end) - upTo(profile.steps, begin),
                         upTo(profile.macs, end) - upTo(profile.macs, begin)});
    }
    return cores;
}

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
        {"cube: Q block", "q_l1", MemLevel::L1, b.qL1, kGradStepsInFlight},
        {"cube: dO block", "do_l1", MemLevel::L1, b.doL1, kGradStepsInFlight},
        {"cube: K block, resident for a unit", "k_l1", MemLevel::L1, b.kL1, kGradStepsInFlight},
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

BackwardDesign GradDesign(const GradPlan& plan, DType dtype, bool deterministic)
{
    const GradTilingData& t = plan.tiling;
    BackwardDesign d;
    d.blockQ = t.blockQ;
    d.blockK = t.blockK;
    d.headDimPad = t.headDimPad;
    d.elemBytes = ElementBytes(dtype);
    d.stepsAhead = kGradStepsInFlight;  // S, dP of the next step issue before this one's products
    d.kvL1Buffers = kGradStepsInFlight;  // K and V of the unit in flight and of the next
    d.exchangeSlots = kGradExchangeSlots;
    d.l0cScratchBuffers = t.l0cScratchBuffers;  // the kernel's product buffers (c_l0c)
    d.deterministic = deterministic;
    d.dqSlots = t.dqSlots;
    d.dropoutPassElements = t.variant.dropoutP > 0.0f ? GradDropoutPass(t.blockK) : 0;
    d.scoreBytes = t.fp16Scores != 0 ? 2 : 4;
    return d;
}

std::vector<BackwardCoreWork> GradModelWork(const GradPlan& plan)
{
    std::vector<BackwardCoreWork> work;
    for (const GradCoreWork& c : plan.cores) {
        work.push_back({c.unitEnd - c.unitBegin, c.steps});
    }
    return work;
}

uint64_t GradUnitSteps(const GradTilingData& t, bool causal, uint64_t unit)
{
    return causal ? UnitCost<true>(t, unit) : UnitCost<false>(t, unit);
}

double GradUnitMacs(const GradTilingData& t, bool causal, uint64_t unit)
{
    const GradUnit u = causal ? UnitAt<true>(t, unit) : UnitAt<false>(t, unit);
    const uint32_t blocks = u.endQueryBlock - u.firstQueryBlock;
    if (blocks == 0) {
        return 0;
    }
    const uint32_t lastRows = MinU32(t.blockQ, t.seqlenQ - (u.endQueryBlock - 1) * t.blockQ);
    const double rows = static_cast<double>(blocks - 1) * t.blockQ + AlignUp(lastRows, kCubeBlock);
    return 5.0 * t.group * rows * AlignUp(u.keys, kCubeBlock) * t.headDimPad;
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
    result.error = ChooseGradBlocks(t, elemBytes, r.hasMask, request.deterministic, platform);
    if (!result.ok()) {
        return result;
    }
    plan.buffers = ListGradBuffers(t, elemBytes, r.hasMask);
    plan.levels = SumLevels(plan.buffers, platform);
    result.error = CheckPipeBuffers(plan.buffers);
    if (!result.ok()) {
        return result;
    }
    ChooseDqChunks(t, request.deterministic);
    const double queryRows = static_cast<double>(GradQueryRows(t));
    const double keyRows = static_cast<double>(GradKeyRows(t));
    const double fp32Bytes = (queryRows * t.dqSlots + 2 * keyRows) * t.headDimPad * 4.0;
    if (fp32Bytes > kMaxWorkspaceBytes) {
        result.error = Message("the backward's fp32 workspace (dQ x ", t.dqSlots, ", dK, dV: ",
                               fp32Bytes, " bytes) overflows the kernel's 64-bit offsets");
        return result;
    }

    const uint32_t cores = std::min(platform.aicCores, kMaxCores);
    if (IsPacked(t)) {
        // The units and their split are the kernel's, on the device (flash_cann_packed.h):
        // every core it can use, no more than there can be units (each sequence adds at
        // most one partial key block per kv head).
        const uint64_t units = uint64_t{t.headsKv} * ((t.tokensK + t.blockK - 1) / t.blockK + t.batch);
        t.units = 0;
        t.usedCores = static_cast<uint32_t>(std::min<uint64_t>(cores, units));
        std::fill(std::begin(t.unitStart), std::end(t.unitStart), 0);
    } else {
        const SegmentProfile profile(t, r.causal, request.deterministic);
        SplitUnits(t, profile, cores);
        plan.cores = MeasureGradCores(t, profile);
    }
    double total = 0;
    double busiest = 0;
    for (const GradCoreWork& c : plan.cores) {
        total += c.macs;
        busiest = std::max(busiest, c.macs);
    }
    plan.imbalance = total > 0 ? busiest / (total / platform.aicCores) : 1.0;
    plan.blockDim = t.usedCores;

    const GradWorkspace ws(t, elemBytes);
    plan.userWorkspaceBytes = ws.total;
    plan.workspace = {ws.dq - ws.delta, ws.dk - ws.dq, ws.exchange - ws.dk, ws.total - ws.exchange};
    plan.tilingKey = GradTilingKey(r.dtype == DType::BFloat16, r.causal, r.hasMask,
                                   request.deterministic, t.fp16Scores);
    return result;
}

BackwardPrediction PredictGradPlan(const GradPlan& plan, const GradPlanRequest& request,
                                   const Platform& platform)
{
    const PlanRequest& r = request.problem;
    const BackwardProblem problem{r.batch, r.headsQ, r.headsKv, r.seqlenQ, r.seqlenK,
                                  r.headDim, r.causal, r.variant};
    return PredictBackward(GradDesign(plan, r.dtype, request.deterministic), problem,
                           GradModelWork(plan), platform);
}

}  // namespace flash_cann
