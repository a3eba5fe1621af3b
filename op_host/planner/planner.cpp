#include "planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "../flash_cann_contract.h"
#include "cost_model.h"
#include "plan_parts.h"
#include "work_model.h"

namespace flash_cann {
namespace {

// The contract's values, generated from op_project/flash_cann_ops.yaml: the C ABI and
// the TilingFunc pass layouts and dtypes by these numbers.
static_assert(static_cast<uint32_t>(Layout::BNSD) == contract::kLayoutBNSD &&
                  static_cast<uint32_t>(Layout::BSND) == contract::kLayoutBSND &&
                  static_cast<uint32_t>(Layout::TND) == contract::kLayoutTND &&
                  contract::kLayoutCount == 3,
              "flash_cann::Layout must list the spec's layouts in spec order");
static_assert(static_cast<uint32_t>(DType::Float16) == contract::kDTypeFloat16 &&
                  static_cast<uint32_t>(DType::BFloat16) == contract::kDTypeBfloat16,
              "flash_cann::DType must start with the NPU backend's dtypes in spec order");
constexpr int64_t kMaxHeadDim = contract::kHeadDimMax;
// Batch, head, row and key indices are 32-bit in the kernel.
constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
// K, V (and Q) rows are loaded into L1 with Nd2NzParams, whose source row pitch
// (srcDValue) is a uint16_t.
constexpr uint64_t kMaxNd2NzPitch = std::numeric_limits<uint16_t>::max();
// A TPipe manages at most 64 buffers (asc-devkit QBUF_MAX_LEN).
constexpr uint32_t kMaxBuffersPerPipe = 64;

// Keys per round (blockK x keyStack): 512, or kMaxRoundKeys (1024) for non-causal key
// sequences of at least kWideRoundKeys keys at head_dim >= kWideRoundHeadDim, where UB
// allows. There the schedule model (docs/schedule-model.md) predicts that halving the O
// write-outs and cross-core hand-overs per key outweighs having half as many rounds per
// tile to pipeline; for shorter sequences, head_dim 64 and causal tiles (which compute a
// whole round on the diagonal) it predicts a loss.
constexpr uint32_t kRoundKeys = 512;
constexpr int64_t kWideRoundKeys = 4096;
constexpr int64_t kWideRoundHeadDim = 128;
// Query tiles of 256 rows are planned for sequences at least this long, where they fit:
// the vector cores then take 128 rows each, and each K/V sub-block serves twice the rows.
constexpr int64_t kLongSequence = 1024;
// Block shapes (blockQ, blockK) the kernel supports, largest first (256-row tiles are
// tried first, and only, for long sequences). blockK is a multiple of 64, so that one
// fp32 key row is a whole number of 256-byte vector repeats (Compares needs that);
// blockQ is even (two vector cores split a tile) and a multiple of the cube block.
constexpr uint32_t kLongTile[2] = {256, 64};
constexpr uint32_t kBlockCandidates[][2] = {
    {128, 128}, {128, 64}, {64, 128}, {64, 64}, {32, 128}, {32, 64}, {16, 64},
};
// Long key sequences (seqlen_k >= kLongKeys) at head_dim >= kWideRoundHeadDim where the
// 256-row tile does not fit: a 160-row tile, single-buffered in L0A and L0C where Q and
// O of 160 rows leave room for no second P or S buffer (head_dim 128). Each K/V
// sub-block then serves 160 rows instead of 128, which the schedule model predicts pays
// once the shared L2 binds (long tiles: +1.5 points at 16k) and costs at 8k (the single
// buffers serialise).
constexpr int64_t kLongKeys = 16384;
constexpr uint32_t kLongKeyTile[2] = {160, 64};
// Rows of one vector slice, largest first: multiples of 8 so a slice's row statistics
// start 32-byte aligned.
constexpr uint32_t kVecRowCandidates[] = {32, 24, 16, 8};

}  // namespace

std::string ValidateProblem(const PlanRequest& r)
{
    const std::pair<const char*, int64_t> sizes[] = {
        {"batch", r.batch}, {"heads_q", r.headsQ}, {"heads_kv", r.headsKv},
        {"seqlen_q", r.seqlenQ}, {"seqlen_k", r.seqlenK}, {"head_dim", r.headDim}};
    for (const auto& [name, value] : sizes) {
        if (value < 1) {
            return Message(name, " must be >= 1 (got ", value, ")");
        }
    }
    if (r.dtype == DType::Float32) {
        return "dtype float32 is not supported by the Ascend kernel (it computes float16 and "
               "bfloat16 inputs)";
    }
    if (r.headDim > kMaxHeadDim) {
        return Message("head_dim ", r.headDim, " exceeds the kernel's maximum of ", kMaxHeadDim);
    }
    if (r.headsQ % r.headsKv != 0) {
        return Message("heads_q (", r.headsQ, ") must be a multiple of heads_kv (", r.headsKv,
                       ")");
    }
    for (const auto& [name, value] : sizes) {
        if (value > kMaxIndex) {
            return Message(name, " ", value, " overflows the kernel's 32-bit indices (maximum ",
                           kMaxIndex, ")");
        }
    }
    const int64_t limit = std::numeric_limits<int64_t>::max() / kMaxHeadDim;
    if (r.batch > limit / r.headsQ || r.batch * r.headsQ > limit / r.seqlenQ ||
        r.batch * r.headsKv > limit / r.seqlenK) {
        return "batch x heads x seqlen x head_dim overflows the kernel's 64-bit offsets";
    }
    const bool packed = r.layout == Layout::TND;
    if (packed) {
        for (const auto& [name, tokens] :
             {std::pair<const char*, int64_t>{"tokens_q", r.tokensQ}, {"tokens_k", r.tokensK}}) {
            if (tokens < 1 || tokens > kMaxIndex) {
                return Message(name, " must be in 1..", kMaxIndex, " with layout TND (got ", tokens,
                               ")");
            }
        }
        if (r.tokensQ > limit / r.headsQ || r.tokensK > limit / r.headsKv) {
            return "tokens x heads x head_dim overflows the kernel's 64-bit offsets";
        }
        if (r.hasMask) {
            return "key_padding_mask is not taken with layout TND (cu_seqlens_k delimits the keys)";
        }
    } else if (r.tokensQ != 0 || r.tokensK != 0) {
        return "tokens_q/tokens_k are only taken with layout TND";
    }
    if (r.layout == Layout::BSND || packed) {
        for (const auto& [name, heads] :
             {std::pair<const char*, int64_t>{"query", r.headsQ}, {"key/value", r.headsKv}}) {
            if (static_cast<uint64_t>(heads * r.headDim) > kMaxNd2NzPitch) {
                return Message(name, " row stride ", heads * r.headDim, " elements (heads ",
                               heads, " x head_dim ", r.headDim, ", layout BSND) exceeds ",
                               kMaxNd2NzPitch, ", the limit of Nd2NzParams::srcDValue used to "
                               "load rows into L1", packed ? "" : "; use layout BNSD");
            }
        }
    }
    if (!std::isfinite(r.scale)) {
        return "scale must be finite";
    }
    const VariantTiling& v = r.variant;
    if (v.windowLeft < -1 || v.windowRight < -1) {
        return "window bounds must be >= -1 (-1: unbounded)";
    }
    if (r.causal && v.windowRight != -1) {
        return "a causal call carries its right window bound in `causal` (window_right -1)";
    }
    if (!(v.softcap >= 0.0f) || !std::isfinite(v.softcap)) {
        return "softcap must be finite and >= 0 (0: off)";
    }
    if (!(v.dropoutP >= 0.0f && v.dropoutP < 1.0f)) {
        return "dropout_p must be in [0, 1)";
    }
    if (v.alibi > static_cast<uint32_t>(Alibi::kPerBatchHead) || v.sinks > 1u) {
        return "alibi must be 0 (none), 1 (per head) or 2 (per batch and head); sinks 0 or 1";
    }
    return "";
}

VariantTiling MakeVariant(int64_t windowLeft, int64_t windowRight, double softcap,
                          double dropoutP, Alibi alibi, bool sinks)
{
    VariantTiling v = kPlainVariant;
    v.windowLeft = windowLeft;
    v.windowRight = windowRight;
    v.softcap = static_cast<float>(softcap);
    v.dropoutP = static_cast<float>(dropoutP);
    // From the float32 p, as variant.dropout_threshold: the same threshold on every backend.
    v.dropoutThreshold = v.dropoutP > 0.0f && v.dropoutP < 1.0f
                             ? static_cast<uint32_t>(static_cast<double>(v.dropoutP) * 4294967296.0)
                             : 0u;
    v.alibi = static_cast<uint32_t>(alibi);
    v.sinks = sinks ? 1u : 0u;
    return v;
}

namespace {

std::vector<BufferUse> ListBuffers(const TilingData& t, uint32_t elemBytes)
{
    const BufferBytes b = ComputeBufferBytes(t, elemBytes);
    // In row passes (CubeInPasses): V of a whole round in L1, Q of a pass and P taking
    // turns in one L0A ring, O of one pass in L0C.
    const bool passes = CubeInPasses(t);
    std::vector<BufferUse> buffers = {
        {"cube: Q tile (loaded once per tile)", "q_l1", MemLevel::L1, b.qL1, 1},
        {"cube: K sub-block ring", "k_l1", MemLevel::L1, b.kL1, t.kvL1Buffers},
        {passes ? "cube: V round ring (each round's V kept for every row pass)" : "cube: V sub-block ring",
         "v_l1", MemLevel::L1, b.vL1, t.kvL1Buffers},
        {"cube: P sub-block ring", "p_l1", MemLevel::L1, b.pL1, t.pL1Buffers},
        passes ? BufferUse{"cube: A operand ring (Q of a row pass, or P)", "q_l0a", MemLevel::L0A, b.qL0a,
                           t.l0aBuffers}
               : BufferUse{"cube: Q operand, resident for the tile", "q_l0a", MemLevel::L0A, b.qL0a, 1},
        {"cube: B operand ring (K^T or V)", "b_l0b", MemLevel::L0B, b.l0b, t.l0bBuffers},
        {passes ? "cube: O of a round and row pass, fp32, accumulated over the stack"
                : "cube: O of a round, fp32, accumulated over the stack",
         "o_l0c", MemLevel::L0C, b.oL0c, 1},
        {"cube: S sub-block ring, fp32", "s_l0c", MemLevel::L0C, b.sL0c, t.l0cBuffers},
        {"vector: S slice, fp32", "s_ub", MemLevel::UB, b.sUb, kVecBuffers},
        {"vector: P slice (also row-reduction scratch)", "p_ub", MemLevel::UB, b.pUb, kVecBuffers},
        {"vector: O partial slice, fp32", "o_ub", MemLevel::UB, b.oUb, kVecBuffers},
        {"vector: output slice", "out_ub", MemLevel::UB, b.outUb, kVecBuffers},
        {"vector: running output rows, fp32", "acc_ub", MemLevel::UB, b.accUb, 1},
        {"vector: row statistics (m, l, alpha ring, slice max/sum)", "rows_ub", MemLevel::UB,
         b.rowUb * kRowStats, 1},
        {"vector: lse rows", "lse_ub", MemLevel::UB, b.rowUb, 1},
        {"vector: row statistic broadcast", "brc_ub", MemLevel::UB, b.brcUb, 1},
        {"vector: key bias, column index, scratch", "keys_ub", MemLevel::UB, b.keyUb * kKeyRows, 1},
        {"vector: comparison bits", "bits_ub", MemLevel::UB, b.bitsUb, 1},
    };
    if (!passes) {
        buffers.insert(buffers.begin() + 5, {"cube: P operand ring", "p_l0a", MemLevel::L0A, b.pL0a, t.l0aBuffers});
    }
    if (t.hasMask) {
        buffers.push_back({"vector: key mask bytes", "mask_ub", MemLevel::UB, b.maskUb, 1});
        buffers.push_back({"vector: key mask as half", "mask_half_ub", MemLevel::UB, b.maskHalfUb, 1});
    }
    const bool alibi = t.variant.alibi != static_cast<uint32_t>(Alibi::kNone);
    if (t.causal || IsWindowed(t.variant) || alibi) {
        buffers.push_back({"vector: band template c - r", "diag_ub", MemLevel::UB, b.diagUb, 1});
    }
    if (alibi) {
        buffers.push_back({"vector: ALiBi distances of a slice", "alibi_ub", MemLevel::UB, b.alibiUb, 1});
    }
    if (t.variant.dropoutP > 0.0f) {
        buffers.push_back({"vector: dropout Philox scratch (passes of a round's keys)", "philox_ub",
                           MemLevel::UB, b.philoxUb, 1});
        buffers.push_back({"vector: dropout keep bits of a pass", "keep_ub", MemLevel::UB, b.keepUb, 1});
    }
    return buffers;
}

}  // namespace

uint64_t Capacity(MemLevel level, const Platform& p)
{
    switch (level) {
        case MemLevel::L1: return p.l1Bytes;
        case MemLevel::L0A: return p.l0aBytes;
        case MemLevel::L0B: return p.l0bBytes;
        case MemLevel::L0C: return p.l0cBytes;
        case MemLevel::UB: return p.ubBytes > kUbApiScratch ? p.ubBytes - kUbApiScratch : 0;
    }
    return 0;
}

// Per-level totals; a buffer is rounded up to 32 bytes as TPipe::InitBuffer does.
std::vector<LevelUse> SumLevels(const std::vector<BufferUse>& buffers, const Platform& p)
{
    std::vector<LevelUse> levels;
    for (MemLevel level : {MemLevel::L1, MemLevel::L0A, MemLevel::L0B, MemLevel::L0C,
                           MemLevel::UB}) {
        uint64_t used = 0;
        for (const BufferUse& b : buffers) {
            if (b.level == level) {
                used += static_cast<uint64_t>(AlignUp(static_cast<uint32_t>(b.bytes), kByteBlock))
                        * b.copies;
            }
        }
        levels.push_back({level, used, Capacity(level, p)});
    }
    return levels;
}

bool Fits(const std::vector<LevelUse>& levels)
{
    return std::all_of(levels.begin(), levels.end(),
                       [](const LevelUse& l) { return l.used <= l.capacity; });
}

std::string CheckRequest(const PlanRequest& request, const Platform& platform)
{
    const std::string problem = ValidateProblem(request);
    if (!problem.empty()) {
        return problem;
    }
    if (platform.aicCores < 1) {
        return Message("platform ", platform.name, " reports no AI cores");
    }
    if (request.fp16Scores && request.dtype != DType::Float16) {
        return "fp16_scores needs float16 inputs (contract.checks refuses the others by name)";
    }
    return "";
}

std::string CheckPipeBuffers(const std::vector<BufferUse>& buffers)
{
    uint32_t pipeBuffers = 0;
    for (const BufferUse& b : buffers) {
        pipeBuffers += b.copies;
    }
    if (pipeBuffers > kMaxBuffersPerPipe) {
        return Message("the plan needs ", pipeBuffers, " buffers; a TPipe manages at most ",
                       kMaxBuffersPerPipe);
    }
    return "";
}

namespace {

// Complete the plan for one block shape with (at least) `l0Copies` copies of the L0 rings
// (P in L0A, the B operand in L0B, S in L0C): take the largest vector slice that fits,
// then double-buffer the remaining rings where they still fit. False if nothing fits.
// cubeRows: the rows of one cube pass (0: the whole tile).
bool TryShape(TilingData& t, uint32_t blockQ, uint32_t blockK, uint32_t l0Copies,
              uint32_t elemBytes, const Platform& p, uint32_t roundKeys = kRoundKeys,
              uint32_t cubeRows = 0)
{
    auto fits = [&] { return Fits(SumLevels(ListBuffers(t, elemBytes), p)); };
    t.blockQ = blockQ;
    t.blockK = blockK;
    t.cubeRows = cubeRows > 0 ? cubeRows : blockQ;
    t.keyStack = roundKeys / blockK;
    t.l0aBuffers = t.l0bBuffers = t.l0cBuffers = l0Copies;
    for (uint32_t vecRows : kVecRowCandidates) {
        if (vecRows > AlignUp(blockQ / 2, 8)) {
            continue;
        }
        t.vecRows = vecRows;
        t.kvL1Buffers = t.pL1Buffers = 1;
        if (!fits()) {
            continue;
        }
        for (uint32_t* count : {&t.l0bBuffers, &t.l0aBuffers, &t.l0cBuffers, &t.kvL1Buffers,
                                &t.pL1Buffers}) {
            *count = 2;
            if (!fits()) {
                *count = 1;
            }
        }
        return true;
    }
    return false;
}

// The 256-row tile worked in two 128-row cube passes (Q and O of 256 rows overflow
// L0A / L0C: head_dim 128), where its buffers fit. MakePlan takes it only where the
// schedule model predicts it faster than the shape ChooseBlocks picks.
bool TryHalves(TilingData& t, uint32_t elemBytes, const Platform& p)
{
    for (uint32_t l0Copies : {2u, 1u}) {
        if (TryShape(t, kLongTile[0], kLongTile[1], l0Copies, elemBytes, p, kRoundKeys, kLongTile[0] / 2)) {
            return true;
        }
    }
    return false;
}

// Long sequences: a 256-row tile where it fits at all; long key sequences: then a
// 160-row tile where it fits. Otherwise the largest shape whose L0 rings are
// double-buffered (so MTE1, the cube and Fixpipe overlap), or failing that the largest
// that fits with single L0 buffers.
bool ChooseBlocks(TilingData& t, bool longSequence, bool longKeys, uint32_t elemBytes,
                  const Platform& p)
{
    if (longSequence) {
        for (uint32_t l0Copies : {2u, 1u}) {
            if (TryShape(t, kLongTile[0], kLongTile[1], l0Copies, elemBytes, p)) {
                return true;
            }
        }
    }
    if (longKeys && TryShape(t, kLongKeyTile[0], kLongKeyTile[1], 1, elemBytes, p)) {
        return true;
    }
    for (uint32_t l0Copies : {2u, 1u}) {
        for (const auto& candidate : kBlockCandidates) {
            if (TryShape(t, candidate[0], candidate[1], l0Copies, elemBytes, p)) {
                return true;
            }
        }
    }
    return false;
}

// Widens the chosen shape's rounds to kMaxRoundKeys keys where its buffers still fit
// (only UB grows); otherwise leaves the plan as it is.
void WidenRounds(TilingData& t, uint32_t elemBytes, const Platform& p)
{
    const TilingData narrow = t;
    if (!TryShape(t, narrow.blockQ, narrow.blockK, 1, elemBytes, p, kMaxRoundKeys, narrow.cubeRows)) {
        t = narrow;
    }
}

}  // namespace

const char* MemLevelName(MemLevel level)
{
    switch (level) {
        case MemLevel::L1: return "L1";
        case MemLevel::L0A: return "L0A";
        case MemLevel::L0B: return "L0B";
        case MemLevel::L0C: return "L0C";
        case MemLevel::UB: return "UB";
    }
    return "?";
}

uint32_t ElementBytes(DType dtype)
{
    return dtype == DType::Float32 ? 4 : 2;
}

PlanResult PlanBlocks(const PlanRequest& request, const Platform& platform, bool halves)
{
    PlanResult result;
    result.error = CheckRequest(request, platform);
    if (!result.ok()) {
        return result;
    }
    Plan& plan = result.plan;
    TilingData& t = plan.tiling;
    const uint32_t elemBytes = ElementBytes(request.dtype);
    SetProblem(t, request);
    t.causal = request.causal ? 1 : 0;
    t.hasMask = request.hasMask ? 1 : 0;
    t.features = IsPlain(request.variant) ? 0 : 1;
    const bool longKeys = request.seqlenK >= kLongKeys && request.headDim >= kWideRoundHeadDim;
    if (halves && !TryHalves(t, elemBytes, platform)) {
        result.error = Message("cube_passes: the 256-row tile in two 128-row cube passes does not fit ",
                               platform.name, "'s buffers for head_dim ", request.headDim);
        return result;
    }
    if (!halves && !ChooseBlocks(t, request.seqlenQ >= kLongSequence, longKeys, elemBytes, platform)) {
        result.error = Message("no block shape fits ", platform.name, "'s buffers for head_dim ",
                               request.headDim);
        return result;
    }
    if (!request.causal && request.seqlenK >= kWideRoundKeys && request.headDim >= kWideRoundHeadDim) {
        WidenRounds(t, elemBytes, platform);
    }
    plan.buffers = ListBuffers(t, elemBytes);
    plan.levels = SumLevels(plan.buffers, platform);
    result.error = CheckPipeBuffers(plan.buffers);
    if (!result.ok()) {
        return result;
    }

    const uint32_t cores = std::min(platform.aicCores, kMaxCores);
    if (request.layout == Layout::TND) {
        // The split is the kernel's, on the device (flash_cann_packed.h): every core it
        // can use, no more than there can be tiles (each sequence adds at most one partial
        // tile per head).
        const uint64_t tiles = uint64_t{t.headsQ} * ((t.tokensQ + t.blockQ - 1) / t.blockQ + t.batch);
        t.usedCores = static_cast<uint32_t>(std::min<uint64_t>(cores, tiles));
        std::fill(std::begin(t.rowStart), std::end(t.rowStart), 0);
    } else {
        SplitRows(t, request.causal, cores);
        plan.cores = MeasureCores(t, request.causal);
    }
    double total = 0;
    double busiest = 0;
    for (const CoreWork& c : plan.cores) {
        total += c.macs;
        busiest = std::max(busiest, c.macs);
    }
    plan.imbalance = total > 0 ? busiest / (total / platform.aicCores) : 1.0;
    plan.blockDim = t.usedCores;
    t.workspacePerCore = Workspace(t, elemBytes).total;
    plan.userWorkspaceBytes = t.workspacePerCore * t.usedCores;
    plan.tilingKey = TilingKey(request.dtype == DType::BFloat16, request.causal, request.hasMask,
                               t.features);
    return result;
}

namespace {

// Whether the schedule model predicts the halves plan faster. Packed sequences (TND) are
// split on the device from offsets the planner does not see: they are compared as the
// dense problem of their max_seqlen.
bool HalvesPredictedFaster(const PlanRequest& request, const Plan& whole, const Plan& halves,
                           const Platform& platform)
{
    if (request.layout != Layout::TND) {
        return Predict(halves, request, platform).seconds < Predict(whole, request, platform).seconds;
    }
    PlanRequest dense = request;
    dense.layout = Layout::BNSD;
    dense.tokensQ = dense.tokensK = 0;
    const PlanResult a = PlanBlocks(dense, platform, false);
    const PlanResult b = PlanBlocks(dense, platform, true);
    return a.ok() && b.ok() && HalvesPredictedFaster(dense, a.plan, b.plan, platform);
}

}  // namespace

// The blocks ChooseBlocks picks; for long sequences where the 256-row tile does not fit
// whole, the 256-row tile in two cube passes instead where the schedule model predicts it
// faster (two predictions per plan: a few ms). At the targets' shapes the model predicts
// the passes slower by 6-10 points (the passes' O serialise through one L0C buffer behind
// S's Fixpipe: docs/kernel.md, "The cube in row passes"); where it predicts them faster
// (causal 1k with many heads, by under 2 % over planner_tests' sweep) the plan takes them.
PlanResult MakePlan(const PlanRequest& request, const Platform& platform)
{
    if (request.cubePasses > 0) {
        return PlanBlocks(request, platform, true);
    }
    PlanResult whole = PlanBlocks(request, platform, false);
    if (request.cubePasses < 0) {
        return whole;
    }
    if (!whole.ok() || request.seqlenQ < kLongSequence ||
        whole.plan.tiling.blockQ >= kLongTile[0]) {
        return whole;
    }
    PlanResult halves = PlanBlocks(request, platform, true);
    if (halves.ok() && HalvesPredictedFaster(request, whole.plan, halves.plan, platform)) {
        return halves;
    }
    return whole;
}

}  // namespace flash_cann
