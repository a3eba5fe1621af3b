// The decode kernel (fwd_kvcache) on the twin, for Python (ctypes): plan with the decode
// planner, lay out GM as the CANN shell would (user workspace after the system
// workspace, tiling data in GM), launch every AI core, report the first rule violation
// and the bytes the kernel allocated per memory level.
#include <cstring>
#include <string>
#include <vector>

#include "c_api.h"
#include "decode_planner.h"
#include "kernel_operator.h"
#include "report.h"
#include "twin/launch.h"

extern "C" void flash_cann_attention_kvcache(GM_ADDR query, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR key,
                                             GM_ADDR value, GM_ADDR cacheSeqlens, GM_ADDR cacheBatchIdx,
                                             GM_ADDR blockTable, GM_ADDR cacheLeftpad, GM_ADDR cuSeqlensQ,
                                             GM_ADDR alibiSlopes, GM_ADDR sinks, GM_ADDR out, GM_ADDR softmaxLse,
                                             GM_ADDR workspace, GM_ADDR tiling);

// query: BSND (batch, seqlen_q, heads_q, head_dim) or TND (tokens_q, heads_q, head_dim);
// the caches as the problem says (contiguous or paged); seqlens_k int32 (batch,): keys
// each sequence attends to (after the append); the int32 vectors and the features'
// tensors null when absent. `splitsUsed`, if not null, receives the plan's split count.
extern "C" int flash_cann_twin_kvcache(const flash_cann_decode_problem* problem, const flash_cann_variant* variant,
                                       void* query, void* kCache, void* vCache, void* seqlensK, void* cacheBatchIdx,
                                       void* blockTable, void* cacheLeftpad, void* cuSeqlensQ, void* alibiSlopes,
                                       void* sinks, void* out, void* softmaxLse, int32_t aicCores,
                                       int32_t* splitsUsed, uint64_t* allocatedBytes, char* error,
                                       uint64_t errorCapacity)
{
    using namespace flash_cann;
    const Platform platform = WithAiCores(*FindPlatform("Ascend910B2"),
                                          aicCores > 0 ? static_cast<uint32_t>(aicCores) : 0);
    const flash_cann_decode_problem& p = *problem;
    DecodeRequest request;
    request.batch = p.batch;
    request.headsQ = p.heads_q;
    request.headsKv = p.heads_kv;
    request.seqlenQ = p.seqlen_q;
    request.tokensQ = p.tokens_q;
    request.headDim = p.head_dim;
    request.dtype = static_cast<DType>(p.dtype);
    request.tnd = p.tnd != 0;
    request.causal = p.causal != 0;
    request.paged = blockTable != nullptr;
    request.cacheBatch = p.cache_batch;
    request.cacheSeqlen = p.cache_seqlen;
    request.maxBlocks = p.max_blocks;
    request.hasBatchIdx = cacheBatchIdx != nullptr;
    request.hasLeftpad = cacheLeftpad != nullptr;
    request.splits = p.splits;
    request.scale = p.scale;
    request.variant = MakeVariant(variant->window_left, variant->window_right, variant->softcap, 0.0,
                                  static_cast<Alibi>(variant->alibi), sinks != nullptr);
    if ((variant->alibi != 0) != (alibiSlopes != nullptr) || request.tnd != (cuSeqlensQ != nullptr)) {
        return twin::Report("alibi_slopes and cu_seqlens_q go with alibi and layout TND", error, errorCapacity);
    }
    const DecodePlanResult result = MakeDecodePlan(request, platform);
    if (!result.ok()) {
        return twin::Report("the decode planner refused: " + result.error, error, errorCapacity);
    }
    const DecodePlan& plan = result.plan;
    if (splitsUsed != nullptr) {
        *splitsUsed = static_cast<int32_t>(plan.tiling.splits);
    }
    const size_t e = ElementBytes(request.dtype);
    const size_t queryRows = request.tnd ? size_t(p.tokens_q) : size_t(p.batch) * p.seqlen_q;
    const size_t qBytes = queryRows * p.heads_q * p.head_dim * e;
    const size_t cacheBytes = size_t(p.cache_batch) * p.cache_seqlen * p.heads_kv * p.head_dim * e;
    std::vector<uint8_t> workspace(AscendC::kSystemWorkspaceBytes + plan.userWorkspaceBytes, 0xFF);
    std::vector<uint8_t> tiling(sizeof(DecodeTiling));
    std::memcpy(tiling.data(), &plan.tiling, sizeof(DecodeTiling));
    twin::LaunchConfig config;
    config.blockDim = plan.blockDim;
    config.tilingKey = plan.tilingKey;
    config.aiCores = twin::DeviceAiCores(platform.aicCores);
    config.scheduleMode = plan.scheduleMode;
    const size_t vector = size_t(p.batch) * sizeof(int32_t);
    config.gm = {{query, qBytes, "query", false}, {kCache, cacheBytes, "k_cache", false},
                 {vCache, cacheBytes, "v_cache", false}, {seqlensK, vector, "seqlens_k", false},
                 {out, qBytes, "out"},
                 {softmaxLse, queryRows * p.heads_q * sizeof(float), "softmax_lse"},
                 {workspace.data(), workspace.size(), "workspace"},
                 {tiling.data(), tiling.size(), "tiling", false}};
    if (cacheBatchIdx != nullptr) {
        config.gm.push_back({cacheBatchIdx, vector, "cache_batch_idx", false});
    }
    if (blockTable != nullptr) {
        config.gm.push_back({blockTable, vector * p.max_blocks, "block_table", false});
    }
    if (cacheLeftpad != nullptr) {
        config.gm.push_back({cacheLeftpad, vector, "cache_leftpad", false});
    }
    if (cuSeqlensQ != nullptr) {
        config.gm.push_back({cuSeqlensQ, vector + sizeof(int32_t), "cu_seqlens_q", false});
    }
    if (alibiSlopes != nullptr) {
        const size_t rows = variant->alibi == static_cast<int32_t>(Alibi::kPerHead) ? 1 : size_t(p.batch);
        config.gm.push_back({alibiSlopes, rows * p.heads_q * sizeof(float), "alibi_slopes", false});
    }
    if (sinks != nullptr) {
        config.gm.push_back({sinks, size_t(p.heads_q) * sizeof(float), "sinks", false});
    }
    twin::LaunchReport report;
    const std::string violation = twin::Launch(config, [&] {
        flash_cann_attention_kvcache(
            static_cast<GM_ADDR>(query), static_cast<GM_ADDR>(kCache), static_cast<GM_ADDR>(vCache), nullptr,
            nullptr, static_cast<GM_ADDR>(seqlensK), static_cast<GM_ADDR>(cacheBatchIdx), static_cast<GM_ADDR>(blockTable),
            static_cast<GM_ADDR>(cacheLeftpad), static_cast<GM_ADDR>(cuSeqlensQ), static_cast<GM_ADDR>(alibiSlopes),
            static_cast<GM_ADDR>(sinks), static_cast<GM_ADDR>(out), static_cast<GM_ADDR>(softmaxLse),
            workspace.data(), tiling.data());
    }, &report);
    twin::CopyAllocated(report, allocatedBytes);
    if (!violation.empty()) {
        return twin::Report(violation, error, errorCapacity);
    }
    return 0;
}
