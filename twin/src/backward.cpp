// The backward kernel on the twin, for Python (ctypes): plan with the backward planner,
// lay out GM as the CANN shell would (user workspace after the 16 MiB system workspace,
// tiling data in GM), launch every AI core of the plan, report the first rule violation,
// the bytes the kernel allocated per memory level and the tensors (outputs, workspace)
// that received atomic adds in an order the hardware does not fix.
#include <cstring>
#include <string>
#include <vector>

#include "flash_cann_grad_tiling.h"
#include "kernel_operator.h"
#include "grad_planner.h"
#include "report.h"
#include "twin/launch.h"
#include "twin/race.h"

extern "C" void flash_cann_attention_grad(GM_ADDR gradOut, GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                          GM_ADDR out, GM_ADDR softmaxLse, GM_ADDR keyPaddingMask,
                                          GM_ADDR gradSoftmaxLse, GM_ADDR cuSeqlensQ, GM_ADDR cuSeqlensK,
                                          GM_ADDR alibiSlopes, GM_ADDR rngState,
                                          GM_ADDR sinks, GM_ADDR gradQuery, GM_ADDR gradKey,
                                          GM_ADDR gradValue, GM_ADDR gradSinks, GM_ADDR workspace,
                                          GM_ADDR tiling);

// The features (flash_cann_variant.h): window bounds as variant.window_bounds normalised
// them, softcap, dropout_p, the ALiBi mode (0 none, 1 per head: alibiSlopes (heads_q,), 2
// per (batch, head): (batch, heads_q)); sinks (fp32, heads_q) when not null. rngState
// (int64 seed, offset) with dropout. gradSinks (fp32, heads_q) is always written.
// Layout TND (2): cu_seqlens_q/k (int32, batch + 1) and the packed tokens; batch is the
// number of sequences and seqlen_q/k are max_seqlen_q/k. fp16Scores: the fp16_scores
// fast path (S in fp16; fp16 inputs only).
extern "C" int flash_cann_twin_backward(void* gradOut, void* query, void* key, void* value, void* out,
                                        void* softmaxLse, void* keyPaddingMask, void* gradSoftmaxLse,
                                        void* cuSeqlensQ, void* cuSeqlensK, int64_t tokensQ,
                                        int64_t tokensK, void* alibiSlopes, void* rngState, void* sinks, void* gradQuery,
                                        void* gradKey, void* gradValue, void* gradSinks, int64_t batch,
                                        int64_t headsQ, int64_t headsKv, int64_t seqlenQ, int64_t seqlenK,
                                        int64_t headDim, int32_t dtype, int32_t layout, int32_t causal,
                                        double scale, int32_t deterministic, int32_t aicCores,
                                        int64_t windowLeft, int64_t windowRight, double softcap,
                                        double dropoutP, int32_t alibi, int32_t fp16Scores,
                                        uint64_t* allocatedBytes,
                                        char* unorderedAtomicAdds, uint64_t unorderedCapacity, char* error,
                                        uint64_t errorCapacity)
{
    if (unorderedAtomicAdds != nullptr && !twin::RaceDetectorOn()) {
        return twin::Report("unordered atomic adds are the race detector's bookkeeping: it is off "
                            "(FLASH_CANN_TWIN_RACE_CHECK=0)", error, errorCapacity);
    }
    using namespace flash_cann;
    const Platform platform = WithAiCores(*FindPlatform("Ascend910B2"),
                                          aicCores > 0 ? static_cast<uint32_t>(aicCores) : 0);
    GradPlanRequest request{{batch, headsQ, headsKv, seqlenQ, seqlenK, headDim,
                             static_cast<DType>(dtype), static_cast<Layout>(layout),
                             causal != 0, keyPaddingMask != nullptr, scale},
                            deterministic != 0};
    request.problem.variant = MakeVariant(windowLeft, windowRight, softcap, dropoutP,
                                          static_cast<Alibi>(alibi), sinks != nullptr);
    request.problem.fp16Scores = fp16Scores != 0;
    const bool packed = layout == static_cast<int32_t>(Layout::TND);
    if (packed) {
        request.problem.tokensQ = tokensQ;
        request.problem.tokensK = tokensK;
    }
    if (packed != (cuSeqlensQ != nullptr && cuSeqlensK != nullptr)) {
        return twin::Report("cu_seqlens go with layout TND", error, errorCapacity);
    }
    const GradPlanResult result = MakeGradPlan(request, platform);
    if (!result.ok()) {
        return twin::Report("the planner refused: " + result.error, error, errorCapacity);
    }
    const GradPlan& plan = result.plan;
    const size_t e = ElementBytes(request.problem.dtype);
    std::vector<uint8_t> workspace(AscendC::kSystemWorkspaceBytes + plan.userWorkspaceBytes, 0xFF);
    std::vector<uint8_t> tiling(sizeof(GradTilingData));
    std::memcpy(tiling.data(), &plan.tiling, sizeof(GradTilingData));
    const size_t rowsQ = packed ? size_t(tokensQ) : size_t(batch) * seqlenQ;
    const size_t rowsK = packed ? size_t(tokensK) : size_t(batch) * seqlenK;
    const size_t qBytes = rowsQ * headsQ * headDim * e;
    const size_t kvBytes = rowsK * headsKv * headDim * e;
    const size_t lseBytes = rowsQ * headsQ * sizeof(float);
    twin::LaunchConfig config;
    config.blockDim = plan.blockDim;
    config.tilingKey = plan.tilingKey;
    config.aiCores = twin::DeviceAiCores(platform.aicCores);
    config.scheduleMode = plan.scheduleMode;
    config.gm = {{gradOut, qBytes, "grad_out"}, {query, qBytes, "query"}, {key, kvBytes, "key"},
                 {value, kvBytes, "value"}, {out, qBytes, "out"}, {softmaxLse, lseBytes, "softmax_lse"},
                 {gradQuery, qBytes, "grad_query"}, {gradKey, kvBytes, "grad_key"},
                 {gradValue, kvBytes, "grad_value"}, {gradSinks, size_t(headsQ) * sizeof(float), "grad_sinks"},
                 {workspace.data(), workspace.size(), "workspace"}, {tiling.data(), tiling.size(), "tiling"}};
    if (packed) {
        config.gm.push_back({cuSeqlensQ, size_t(batch + 1) * sizeof(int32_t), "cu_seqlens_q"});
        config.gm.push_back({cuSeqlensK, size_t(batch + 1) * sizeof(int32_t), "cu_seqlens_k"});
    }
    if (alibi != 0) {
        config.gm.push_back({alibiSlopes, size_t(alibi == 2 ? batch : 1) * headsQ * sizeof(float), "alibi_slopes"});
    }
    if (rngState != nullptr) {
        config.gm.push_back({rngState, 2 * sizeof(int64_t), "rng_state"});
    }
    if (sinks != nullptr) {
        config.gm.push_back({sinks, size_t(headsQ) * sizeof(float), "sinks"});
    }
    if (keyPaddingMask != nullptr) {
        config.gm.push_back({keyPaddingMask, size_t(batch) * seqlenK, "key_padding_mask"});
    }
    if (gradSoftmaxLse != nullptr) {
        config.gm.push_back({gradSoftmaxLse, lseBytes, "grad_softmax_lse"});
    }
    auto gm = [](void* p) { return static_cast<GM_ADDR>(p); };
    twin::LaunchReport report;
    const std::string violation = twin::Launch(config, [&] {
        flash_cann_attention_grad(gm(gradOut), gm(query), gm(key), gm(value), gm(out), gm(softmaxLse),
                                  gm(keyPaddingMask), gm(gradSoftmaxLse), gm(cuSeqlensQ), gm(cuSeqlensK),
                                  gm(alibiSlopes), gm(rngState),
                                  gm(sinks), gm(gradQuery), gm(gradKey), gm(gradValue), gm(gradSinks),
                                  workspace.data(), tiling.data());
    }, &report);
    twin::CopyAllocated(report, allocatedBytes);
    twin::CopyUnorderedAtomicAdds(report, unorderedAtomicAdds, unorderedCapacity);
    if (!violation.empty()) {
        return twin::Report(violation, error, errorCapacity);
    }
    return 0;
}
