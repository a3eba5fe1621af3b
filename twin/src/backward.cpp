// The backward kernel on the twin, for Python (ctypes): plan, lay out GM as the CANN
// shell would (user workspace after the 16 MiB system workspace, tiling data in GM),
// launch every AI core of the plan, report the first rule violation.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "flash_cann_grad_tiling.h"
#include "kernel_operator.h"
#include "planner.h"
#include "report.h"
#include "twin/launch.h"

extern "C" void flash_cann_attention_grad(GM_ADDR gradOut, GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                          GM_ADDR out, GM_ADDR softmaxLse, GM_ADDR keyPaddingMask,
                                          GM_ADDR gradSoftmaxLse, GM_ADDR gradQuery, GM_ADDR gradKey,
                                          GM_ADDR gradValue, GM_ADDR workspace, GM_ADDR tiling);

namespace {

using namespace flash_cann;

// A valid backward plan from the shapes, until the backward planner (op_host) serves the
// twin: the forward planner validates the request and sets the problem and strides;
// blocks are fixed (64 x 64; 64 x 32 keys above head_dim 128, so that the dK/dV
// accumulators and the product scratch share L0C); units are split over the cores in
// contiguous ranges of about equal cube work.
std::string MinimalGradPlan(const PlanRequest& request, const Platform& platform, bool deterministic,
                            GradTilingData& t)
{
    const PlanResult forward = MakePlan(request, platform);
    if (!forward.ok()) {
        return forward.error;
    }
    const TilingData& f = forward.plan.tiling;
    t = GradTilingData{};
    t.batch = f.batch;
    t.headsQ = f.headsQ;
    t.headsKv = f.headsKv;
    t.group = f.group;
    t.seqlenQ = f.seqlenQ;
    t.seqlenK = f.seqlenK;
    t.headDim = f.headDim;
    t.headDimPad = f.headDimPad;
    t.causalOffset = f.causalOffset;
    t.scale = f.scale;
    t.layout = f.layout;
    t.qStrideBatch = f.qStrideBatch;
    t.qStrideHead = f.qStrideHead;
    t.qStrideRow = f.qStrideRow;
    t.kvStrideBatch = f.kvStrideBatch;
    t.kvStrideHead = f.kvStrideHead;
    t.kvStrideRow = f.kvStrideRow;
    t.blockQ = 64;
    t.blockK = t.headDimPad <= 128 ? 64 : 32;
    t.keyBlocks = (t.seqlenK + t.blockK - 1) / t.blockK;
    t.dqChunkBlocks = deterministic ? 1 : t.keyBlocks;
    t.dqSlots = deterministic ? t.keyBlocks : 1;
    t.passRows = 16;
    t.units = uint64_t{t.batch} * t.headsKv * t.keyBlocks;
    t.usedCores = static_cast<uint32_t>(std::min<uint64_t>({platform.aicCores, t.units, kMaxCores}));
    std::vector<uint64_t> prefix(t.units + 1, 0);
    for (uint64_t u = 0; u < t.units; ++u) {
        prefix[u + 1] = prefix[u] + (request.causal ? UnitCost<true>(t, u) : UnitCost<false>(t, u));
    }
    for (uint32_t c = 0; c <= t.usedCores; ++c) {
        const uint64_t target = prefix[t.units] * c / t.usedCores;
        t.unitStart[c] = std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin();
    }
    t.unitStart[t.usedCores] = t.units;
    return "";
}

}  // namespace

extern "C" int flash_cann_twin_backward(void* gradOut, void* query, void* key, void* value, void* out,
                                        void* softmaxLse, void* keyPaddingMask, void* gradSoftmaxLse,
                                        void* gradQuery, void* gradKey, void* gradValue, int64_t batch,
                                        int64_t headsQ, int64_t headsKv, int64_t seqlenQ, int64_t seqlenK,
                                        int64_t headDim, int32_t dtype, int32_t layout, int32_t causal,
                                        double scale, int32_t deterministic, int32_t aicCores, char* error,
                                        uint64_t errorCapacity)
{
    const Platform platform = WithAiCores(*FindPlatform("Ascend910B2"),
                                          aicCores > 0 ? static_cast<uint32_t>(aicCores) : 0);
    const PlanRequest request{batch, headsQ, headsKv, seqlenQ, seqlenK, headDim,
                              static_cast<DType>(dtype), static_cast<Layout>(layout),
                              causal != 0, keyPaddingMask != nullptr, scale};
    GradTilingData tilingData;
    const std::string refusal = MinimalGradPlan(request, platform, deterministic != 0, tilingData);
    if (!refusal.empty()) {
        return twin::Report("the planner refused: " + refusal, error, errorCapacity);
    }
    const size_t e = ElementBytes(request.dtype);
    const GradWorkspace layoutBytes(tilingData, static_cast<uint32_t>(e));
    std::vector<uint8_t> workspace(AscendC::kSystemWorkspaceBytes + layoutBytes.total, 0xFF);
    std::vector<uint8_t> tiling(sizeof(GradTilingData));
    std::memcpy(tiling.data(), &tilingData, sizeof(GradTilingData));
    const size_t qBytes = size_t(batch) * headsQ * seqlenQ * headDim * e;
    const size_t kvBytes = size_t(batch) * headsKv * seqlenK * headDim * e;
    const size_t lseBytes = size_t(batch) * headsQ * seqlenQ * sizeof(float);
    twin::LaunchConfig config;
    config.blockDim = tilingData.usedCores;
    config.tilingKey = GradTilingKey(request.dtype == DType::BFloat16, causal != 0,
                                     keyPaddingMask != nullptr, deterministic != 0);
    config.gm = {{gradOut, qBytes, "grad_out"}, {query, qBytes, "query"}, {key, kvBytes, "key"},
                 {value, kvBytes, "value"}, {out, qBytes, "out"}, {softmaxLse, lseBytes, "softmax_lse"},
                 {gradQuery, qBytes, "grad_query"}, {gradKey, kvBytes, "grad_key"},
                 {gradValue, kvBytes, "grad_value"}, {workspace.data(), workspace.size(), "workspace"},
                 {tiling.data(), tiling.size(), "tiling"}};
    if (keyPaddingMask != nullptr) {
        config.gm.push_back({keyPaddingMask, size_t(batch) * seqlenK, "key_padding_mask"});
    }
    if (gradSoftmaxLse != nullptr) {
        config.gm.push_back({gradSoftmaxLse, lseBytes, "grad_softmax_lse"});
    }
    auto gm = [](void* p) { return static_cast<GM_ADDR>(p); };
    const std::string violation = twin::Launch(config, [&] {
        flash_cann_attention_grad(gm(gradOut), gm(query), gm(key), gm(value), gm(out), gm(softmaxLse),
                                  gm(keyPaddingMask), gm(gradSoftmaxLse), gm(gradQuery), gm(gradKey),
                                  gm(gradValue), workspace.data(), tiling.data());
    });
    if (!violation.empty()) {
        return twin::Report(violation, error, errorCapacity);
    }
    return 0;
}
