#include "decode_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../flash_cann_contract.h"
#include "engine_rates.h"
#include "plan_parts.h"

namespace flash_cann {
namespace {

constexpr int64_t kMaxHeadDim = contract::kHeadDimMax;
constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();
// Nd2NzParams' source row pitch (srcDValue) is a uint16_t: a cache row is headsKv x D.
constexpr int64_t kMaxNd2NzPitch = std::numeric_limits<uint16_t>::max();
// ALiBi distances are exact in fp32 below 2^24 keys.
constexpr int64_t kMaxAlibiKeys = int64_t{1} << 24;
constexpr uint32_t kBlockK = 64;
constexpr uint32_t kVecRows = 8;
constexpr uint32_t kMaxBlockQ = 128;
// A split below one full round of keys buys no parallelism worth its partial: the
// planner never cuts a sequence's capacity into chunks shorter than this.
constexpr int64_t kMinSplitKeys = kDecodeMaxRoundKeys;
// Splits per tile at most (the combine keeps one lse row per split in UB).
constexpr int64_t kMaxSplits = 64;

std::string Validate(const DecodeRequest& r)
{
    if (r.batch < 1 || r.headsQ < 1 || r.headsKv < 1 || r.seqlenQ < 1 || r.headDim < 1) {
        return Message("batch, heads and seqlen_q must be >= 1 (got batch ", r.batch, ", heads_q ", r.headsQ,
                       ", heads_kv ", r.headsKv, ", seqlen_q ", r.seqlenQ, ")");
    }
    if (r.headDim > kMaxHeadDim) {
        return Message("head_dim ", r.headDim, " exceeds the kernel's limit of ", kMaxHeadDim);
    }
    if (r.headsQ % r.headsKv != 0) {
        return Message("heads_q (", r.headsQ, ") must be a multiple of heads_kv (", r.headsKv, ")");
    }
    if (r.dtype != DType::Float16 && r.dtype != DType::BFloat16) {
        return "the decode kernel computes float16 and bfloat16 only";
    }
    if (r.headsKv * r.headDim > kMaxNd2NzPitch || r.headsQ * r.headDim > kMaxIndex) {
        return Message("heads_kv x head_dim = ", r.headsKv * r.headDim,
                       " exceeds the cache row pitch the kernel's ND->NZ copy takes (", kMaxNd2NzPitch, ")");
    }
    if (r.cacheBatch < 1 || r.cacheSeqlen < 1 || (r.paged && r.maxBlocks < 1)) {
        return "the cache must hold at least one sequence (or block) of at least one key";
    }
    const int64_t capacity = DecodeCapacity(r);
    if (capacity > kMaxIndex || r.cacheBatch * r.cacheSeqlen > kMaxIndex || r.batch * r.seqlenQ > kMaxIndex ||
        r.tokensQ > kMaxIndex) {
        return Message("the cache or the query has more rows than the kernel's 32-bit indices address");
    }
    if (r.variant.alibi != 0 && capacity >= kMaxAlibiKeys) {
        return Message("ALiBi distances are exact in float32 only below 2^24 keys (capacity ", capacity, ")");
    }
    if (!(r.scale > 0) || !std::isfinite(r.scale)) {
        return Message("scale must be a positive finite number (got ", r.scale, ")");
    }
    return {};
}

std::vector<BufferUse> ListDecodeBuffers(const DecodeTiling& t, uint32_t elemBytes)
{
    const DecodeBufferBytes b = ComputeDecodeBufferBytes(t, elemBytes);
    std::vector<BufferUse> list = {
        {"cube", "q_l1", MemLevel::L1, b.qL1, 1},
        {"cube", "k_l1", MemLevel::L1, b.kvL1, 2},
        {"cube", "v_l1", MemLevel::L1, b.kvL1, 2},
        {"cube", "p_l1", MemLevel::L1, b.pL1, 2},
        {"cube", "q_l0a", MemLevel::L0A, b.qL0a, 1},
        {"cube", "p_l0a", MemLevel::L0A, b.pL0a, 2},
        {"cube", "kv_l0b", MemLevel::L0B, b.l0b, 2},
        {"cube", "o_l0c", MemLevel::L0C, b.oL0c, 1},
        {"cube", "s_l0c", MemLevel::L0C, b.sL0c, 2},
        {"softmax", "s_ub", MemLevel::UB, b.sUb, kVecBuffers},
        {"softmax", "p_ub", MemLevel::UB, b.pUb, kVecBuffers},
        {"update", "o_ub", MemLevel::UB, b.oUb, kVecBuffers},
        {"combine", "out_ub", MemLevel::UB, b.outUb, kVecBuffers},
        {"partial", "partial_ub", MemLevel::UB, b.oUb, kVecBuffers},
        {"update", "acc_ub", MemLevel::UB, b.accUb, 1},
        {"softmax", "row_stats_ub", MemLevel::UB, b.rowUb, kRowStats},
        {"partial", "lse_ub", MemLevel::UB, b.rowUb, 1},
        {"softmax", "broadcast_ub", MemLevel::UB, b.brcUb, 1},
        {"combine", "lse_out_ub", MemLevel::UB, b.brcUb, 1},
        {"softmax", "key_rows_ub", MemLevel::UB, b.keyUb, kDecodeKeyRows},
        {"softmax", "bits_ub", MemLevel::UB, b.bitsUb, 1},
        {"combine", "split_lse_ub", MemLevel::UB, b.splitUb, 1},
    };
    if (t.variant.softcap > 0.0f) {
        list.push_back({"softcap", "softcap_ub", MemLevel::UB, b.sUb, 2});
    }
    return list;
}

// Split count from shapes: enough (tile, split) units for every core when the tiles
// alone are fewer, never chunks shorter than one round of the capacity.
uint32_t ChooseSplits(const DecodeRequest& r, uint64_t tiles, uint32_t cores)
{
    if (r.splits > 0) {
        return static_cast<uint32_t>(std::min<int64_t>(r.splits, kMaxSplits));
    }
    if (tiles >= cores) {
        return 1;
    }
    const int64_t byCores = static_cast<int64_t>(cores / tiles);
    const int64_t byKeys = std::max<int64_t>(1, DecodeCapacity(r) / kMinSplitKeys);
    return static_cast<uint32_t>(std::max<int64_t>(1, std::min({byCores, byKeys, kMaxSplits})));
}

}  // namespace

int64_t DecodeCapacity(const DecodeRequest& r)
{
    return r.paged ? r.maxBlocks * r.cacheSeqlen : r.cacheSeqlen;
}

DecodePlanResult MakeDecodePlan(const DecodeRequest& r, const Platform& platform)
{
    DecodePlanResult result;
    result.error = Validate(r);
    if (!result.ok()) {
        return result;
    }
    if (platform.aicCores == 0) {
        result.error = "the platform has no AI cores";
        return result;
    }
    const uint32_t elemBytes = ElementBytes(r.dtype);
    DecodeTiling& t = result.plan.tiling;
    t.batch = static_cast<uint32_t>(r.batch);
    t.headsQ = static_cast<uint32_t>(r.headsQ);
    t.headsKv = static_cast<uint32_t>(r.headsKv);
    t.group = t.headsQ / t.headsKv;
    t.seqlenQ = static_cast<uint32_t>(r.seqlenQ);
    t.tokensQ = static_cast<uint32_t>(r.tnd ? r.tokensQ : r.batch * r.seqlenQ);
    t.headDim = static_cast<uint32_t>(r.headDim);
    t.headDimPad = AlignUp(t.headDim, kCubeBlock);
    t.layout = static_cast<uint32_t>(r.tnd ? DecodeLayout::TND : DecodeLayout::BSND);
    t.causal = r.causal ? 1u : 0u;
    t.scale = static_cast<float>(r.scale);
    t.paged = r.paged ? 1u : 0u;
    t.blockRows = static_cast<uint32_t>(r.cacheSeqlen);
    t.maxBlocks = r.paged ? static_cast<uint32_t>(r.maxBlocks) : 1u;
    t.hasBatchIdx = r.hasBatchIdx ? 1u : 0u;
    t.hasLeftpad = r.hasLeftpad ? 1u : 0u;
    t.variant = r.variant;
    t.blockK = kBlockK;
    t.vecRows = kVecRows;
    const uint64_t packedRows = uint64_t{t.group} * t.seqlenQ;
    const int64_t capacity = DecodeCapacity(r);
    // Rounds as wide as the capacity needs (whole 64-key sub-blocks, at most 512 keys),
    // tiles as tall as the group's rows need (at most 128); the largest that fit.
    const uint32_t widest = std::min<uint32_t>(
        kDecodeMaxRoundKeys, AlignUp(static_cast<uint32_t>(std::min<int64_t>(capacity, kDecodeMaxRoundKeys)),
                                     kBlockK));
    const uint32_t tallest = std::min<uint32_t>(kMaxBlockQ, AlignUp(static_cast<uint32_t>(
                                                                        std::min<uint64_t>(packedRows, kMaxBlockQ)),
                                                                    kCubeBlock));
    bool fits = false;
    t.splits = 1;
    for (uint32_t blockQ = tallest; blockQ >= kCubeBlock && !fits; blockQ /= 2) {
        for (uint32_t keys = widest; keys >= kBlockK && !fits; keys /= 2) {
            t.blockQ = AlignUp(blockQ, kCubeBlock);
            t.keyStack = keys / kBlockK;
            t.rowTiles = static_cast<uint32_t>((packedRows + t.blockQ - 1) / t.blockQ);
            t.splits = ChooseSplits(r, uint64_t{t.batch} * t.headsKv * t.rowTiles, platform.aicCores);
            fits = Fits(SumLevels(ListDecodeBuffers(t, elemBytes), platform));
        }
    }
    if (!fits) {
        result.error = Message("no decode tiling fits the platform's memories at head_dim ", r.headDim);
        return result;
    }
    const uint64_t units = DecodeUnits(t);
    if (units > kMaxIndex) {
        result.error = Message("the decode call has ", units, " work units, more than 32-bit indices address");
        return result;
    }
    t.usedCores = static_cast<uint32_t>(std::min<uint64_t>(std::min<uint32_t>(platform.aicCores, kMaxCores), units));
    // Units of equal shape: an even count per core (their keys are device values).
    for (uint32_t c = 0; c <= t.usedCores; ++c) {
        t.unitStart[c] = static_cast<uint32_t>(units * c / t.usedCores);
    }
    const DecodeWorkspace ws(t, elemBytes);
    t.workspacePerCore = ws.perCore;
    t.partialOffset = DecodeWorkspace::Align(ws.perCore * t.usedCores);
    DecodePlan& plan = result.plan;
    plan.tilingKey = DecodeTilingKey(r.dtype == DType::BFloat16 ? 1u : 0u);
    plan.blockDim = t.usedCores;
    const std::string launchError = CheckAllCoreLaunch(plan.blockDim, platform);
    if (!launchError.empty()) {
        result.error = launchError;
        return result;
    }
    plan.userWorkspaceBytes = ws.Total(t.usedCores, static_cast<uint32_t>(units));
    plan.buffers = ListDecodeBuffers(t, elemBytes);
    plan.levels = SumLevels(plan.buffers, platform);
    const std::string pipeError = CheckPipeBuffers(plan.buffers);
    if (!pipeError.empty()) {
        result.error = pipeError;
    }
    return result;
}

// The schedule model of the decode kernel (docs/planner.md, "Decode"). Per round of W
// keys on one core: the K and V sub-blocks stream GM -> L1 (MTE2) at the lesser of the
// core's MTE2 rate and its share of HBM; the cube's two products, the Fixpipes of S and
// O and the vector cores' softmax and update of the round form the compute chain, which
// overlaps the loads of the next round except for what the L1 rings cannot hold ahead
// (two K and two V sub-blocks). Per unit: Q in, the partial out. After the SyncAll the
// combine reads every split's partial.
DecodePrediction PredictDecode(const DecodePlan& plan, const DecodeRequest& r, const Platform& platform,
                               int64_t keys)
{
    const DecodeTiling& t = plan.tiling;
    const EngineRates rates = RatesFor(platform);
    const double e = ElementBytes(r.dtype);
    const double d = t.headDimPad;
    const double w = DecodeRoundKeys(t);
    const double rows16 = AlignUp(std::min<uint32_t>(t.blockQ, t.group * t.seqlenQ), kCubeBlock);
    const double rowsPerVector = std::ceil(std::min<double>(t.blockQ, double(t.group) * t.seqlenQ) / 2);
    const double units = DecodeUnits(t);
    const double unitsPerCore = std::ceil(units / t.usedCores);
    const double keysPerUnit = std::ceil(double(keys) / t.splits);
    const double roundsPerUnit = std::ceil(keysPerUnit / w);

    DecodePrediction p;
    // HBM: every (sequence, kv head, tile) reads its keys' K and V once; Q, out once.
    const double kvBytes = double(r.batch) * t.headsKv * t.rowTiles * keys * 2 * r.headDim * e;
    const double qBytes = double(t.tokensQ) * t.headsQ * r.headDim * e * 2;
    p.hbmBytes = kvBytes + qBytes;
    p.hbmSeconds = p.hbmBytes / rates.hbm;

    // One round on one core.
    const double activeCores = std::min<double>(t.usedCores, units);
    const double loadRate = std::min(rates.l2ToL1, rates.hbm / activeCores);
    const double subBlocks = std::ceil(w / t.blockK);  // one Mmad, K and V load, S Fixpipe each
    const double roundLoad = 2 * w * d * e / loadRate + 2 * subBlocks * rates.mte2Latency;
    const double cube = rates.Mmad(2 * rows16 * w * d, 2 * subBlocks);  // two products
    const double fix = rates.Fixpipe(rows16 * w * 4 + rows16 * d * 4, subBlocks + 1);
    // The vector core's slice work: about 24 instructions over vecRows x W per slice with
    // a barrier after most (their head latency exposed), per-row band/ALiBi work, and the
    // S/P/O moves through UB.
    const double slices = std::ceil(rowsPerVector / t.vecRows);
    const double repeats = std::min<double>(rowsPerVector, t.vecRows) * w / 64;
    const double vecCycles = slices * (24 * 14 + 12 * repeats * 2) +
                             rowsPerVector * 2 * (14 + w / 64 * 2) * (t.causal || r.variant.windowLeft >= 0 ? 1 : 0.25);
    const double vecMoves = rowsPerVector * w * (4 + e) / rates.l2ToUb + rowsPerVector * w * e / rates.ubToL2 +
                            rowsPerVector * d * 4 / rates.l2ToUb;
    const double vector = vecCycles / rates.clockHz + slices * 24 * rates.vectorIssue + vecMoves;
    const double chain = std::max(cube + fix, vector) + 3 * rates.crossCoreFlag;
    // What the cube waits for P (vector + two flags) beyond the four sub-blocks the L1
    // rings hold ahead stalls the loads.
    const double ringAhead = 4 * t.blockK * d * e / loadRate;
    const double stall = std::max(0.0, vector + 2 * rates.crossCoreFlag - ringAhead);
    const double round = std::max(roundLoad + stall, chain);
    const double unitFixed = rows16 * d * e / rates.l2ToL1 + 3 * rates.crossCoreFlag +
                             rowsPerVector * d * 4 / rates.ubToL2 + 40 * 14 / rates.clockHz;
    p.coreSeconds = unitsPerCore * (roundsPerUnit * round + unitFixed);
    p.bound = roundLoad + stall >= chain ? (loadRate < rates.l2ToL1 ? "HBM" : "MTE2 (GM->L1)") : "cube/vector chain";
    // Combine: per run of rows, per split an lse and a partial row block from L2, ~40
    // vector instructions; spread over every vector core. SyncAll taken as 4 flag hand-offs.
    const double runs = double(r.batch) * t.headsKv * t.rowTiles *
                        std::ceil(std::min<double>(t.blockQ, double(t.group) * t.seqlenQ) /
                                  std::min<double>(t.group, t.vecRows));
    const double runSeconds = t.splits * (t.vecRows * d * 4 / rates.l2ToUb + 6 * 14 / rates.clockHz) +
                              40 * 14 / rates.clockHz;
    p.combineSeconds = 4 * rates.crossCoreFlag + std::ceil(runs / (2.0 * t.usedCores)) * runSeconds;
    p.launchSeconds = rates.launch;
    p.seconds = p.launchSeconds + std::max(p.hbmSeconds, p.coreSeconds) + p.combineSeconds;
    p.hbmUse = p.hbmBytes / p.seconds / rates.hbm;
    return p;
}

}  // namespace flash_cann
