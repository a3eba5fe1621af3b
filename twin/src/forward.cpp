// The forward kernel on the twin, for Python (ctypes): plan with the real planner, lay
// out GM as the CANN shell would (user workspace after the 16 MiB system workspace,
// tiling data in GM), launch every AI core, report the first rule violation and the
// bytes the kernel allocated per memory level.
#include <cstring>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "planner.h"
#include "report.h"
#include "twin/launch.h"
#include "twin/race.h"

extern "C" void flash_cann_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                     GM_ADDR keyPaddingMask, GM_ADDR cuSeqlensQ, GM_ADDR cuSeqlensK,
                                     GM_ADDR alibiSlopes, GM_ADDR rngState,
                                     GM_ADDR sinks, GM_ADDR out, GM_ADDR softmaxLse,
                                     GM_ADDR workspace, GM_ADDR tiling);

// The features (flash_cann_variant.h) as the op's arguments give them: window bounds as
// contract.variant normalised them, softcap and dropout_p (0: off), alibi 0/1/2 (none,
// slopes (heads_q,), slopes (batch, heads_q)); the tensors are null when unused.
// Layout TND (2): cu_seqlens_q/k (int32, batch + 1) and the packed tokens; batch is the
// number of sequences and seqlen_q/k are max_seqlen_q/k. fp16Scores: the fp16_scores
// permission, which the planner refuses for inputs other than fp16 and otherwise plans as
// without it (the forward keeps fp32 S).
// The planner's cube_passes (PlanRequest::cubePasses) for the following launches: tests
// force the 256-row tile in row passes at small shapes with 1; 0 restores the planner's
// choice.
namespace {
int32_t g_cubePasses = 0;
}  // namespace

extern "C" void flash_cann_twin_cube_passes(int32_t cubePasses)
{
    g_cubePasses = cubePasses;
}

// The AI cores of the device the following launches run on, whatever the planner planned
// for (0: the plan's platform): tests launch a plan made for more cores than the device has.
namespace {
uint32_t g_deviceCores = 0;
}  // namespace

extern "C" void flash_cann_twin_device_cores(int32_t cores)
{
    g_deviceCores = cores > 0 ? static_cast<uint32_t>(cores) : 0;
}

uint32_t twin::DeviceAiCores(uint32_t plannedCores)
{
    return g_deviceCores > 0 ? g_deviceCores : plannedCores;
}

extern "C" int flash_cann_twin_forward(void* query, void* key, void* value, void* keyPaddingMask,
                                       void* cuSeqlensQ, void* cuSeqlensK, int64_t tokensQ,
                                       int64_t tokensK, void* alibiSlopes, void* rngState, void* sinks,
                                       void* out, void* softmaxLse, int64_t batch, int64_t headsQ,
                                       int64_t headsKv, int64_t seqlenQ, int64_t seqlenK,
                                       int64_t headDim, int32_t dtype, int32_t layout,
                                       int32_t causal, double scale, int64_t windowLeft,
                                       int64_t windowRight, double softcap, double dropoutP,
                                       int32_t alibi, int32_t fp16Scores, int32_t aicCores,
                                       uint64_t* allocatedBytes, char* error,
                                       uint64_t errorCapacity)
{
    using namespace flash_cann;
    const Platform platform = WithAiCores(*FindPlatform("Ascend910B2"),
                                          aicCores > 0 ? static_cast<uint32_t>(aicCores) : 0);
    PlanRequest request{batch, headsQ, headsKv, seqlenQ, seqlenK, headDim,
                        static_cast<DType>(dtype), static_cast<Layout>(layout),
                        causal != 0, keyPaddingMask != nullptr, scale};
    request.variant = MakeVariant(windowLeft, windowRight, softcap, dropoutP,
                                  static_cast<Alibi>(alibi), sinks != nullptr);
    request.fp16Scores = fp16Scores != 0;
    request.cubePasses = g_cubePasses;
    const bool packed = layout == static_cast<int32_t>(Layout::TND);
    if (packed) {
        request.tokensQ = tokensQ;
        request.tokensK = tokensK;
    }
    if ((alibi != 0) != (alibiSlopes != nullptr) || (dropoutP > 0) != (rngState != nullptr) ||
        packed != (cuSeqlensQ != nullptr && cuSeqlensK != nullptr)) {
        return twin::Report("alibi_slopes, rng_state and cu_seqlens go with alibi, dropout_p and "
                            "layout TND", error, errorCapacity);
    }
    const PlanResult result = MakePlan(request, platform);
    if (!result.ok()) {
        return twin::Report("the planner refused: " + result.error, error, errorCapacity);
    }
    const Plan& plan = result.plan;
    const size_t e = ElementBytes(request.dtype);
    std::vector<uint8_t> workspace(AscendC::kSystemWorkspaceBytes + plan.userWorkspaceBytes, 0xFF);
    std::vector<uint8_t> tiling(sizeof(TilingData));
    std::memcpy(tiling.data(), &plan.tiling, sizeof(TilingData));
    const size_t rowsQ = packed ? size_t(tokensQ) : size_t(batch) * seqlenQ;
    const size_t rowsK = packed ? size_t(tokensK) : size_t(batch) * seqlenK;
    const size_t qBytes = rowsQ * headsQ * headDim * e;
    const size_t kvBytes = rowsK * headsKv * headDim * e;
    twin::LaunchConfig config;
    config.blockDim = plan.blockDim;
    config.tilingKey = plan.tilingKey;
    config.aiCores = twin::DeviceAiCores(platform.aicCores);
    // The race detector checks what the kernel writes: the outputs and the workspace.
    config.gm = {{query, qBytes, "query", false}, {key, kvBytes, "key", false},
                 {value, kvBytes, "value", false}, {out, qBytes, "out"},
                 {softmaxLse, rowsQ * headsQ * sizeof(float), "softmax_lse"},
                 {workspace.data(), workspace.size(), "workspace"},
                 {tiling.data(), tiling.size(), "tiling", false}};
    if (keyPaddingMask != nullptr) {
        config.gm.push_back({keyPaddingMask, size_t(batch) * seqlenK, "key_padding_mask", false});
    }
    if (packed) {
        config.gm.push_back({cuSeqlensQ, size_t(batch + 1) * sizeof(int32_t), "cu_seqlens_q", false});
        config.gm.push_back({cuSeqlensK, size_t(batch + 1) * sizeof(int32_t), "cu_seqlens_k", false});
    }
    if (alibiSlopes != nullptr) {
        const size_t rows = alibi == static_cast<int32_t>(Alibi::kPerHead) ? 1 : size_t(batch);
        config.gm.push_back({alibiSlopes, rows * headsQ * sizeof(float), "alibi_slopes", false});
    }
    if (rngState != nullptr) {
        config.gm.push_back({rngState, 2 * sizeof(int64_t), "rng_state", false});
    }
    if (sinks != nullptr) {
        config.gm.push_back({sinks, size_t(headsQ) * sizeof(float), "sinks", false});
    }
    twin::LaunchReport report;
    const std::string violation = twin::Launch(config, [&] {
        flash_cann_attention(static_cast<GM_ADDR>(query), static_cast<GM_ADDR>(key),
                             static_cast<GM_ADDR>(value), static_cast<GM_ADDR>(keyPaddingMask),
                             static_cast<GM_ADDR>(cuSeqlensQ), static_cast<GM_ADDR>(cuSeqlensK),
                             static_cast<GM_ADDR>(alibiSlopes), static_cast<GM_ADDR>(rngState),
                             static_cast<GM_ADDR>(sinks), static_cast<GM_ADDR>(out),
                             static_cast<GM_ADDR>(softmaxLse), workspace.data(), tiling.data());
    }, &report);
    twin::CopyAllocated(report, allocatedBytes);
    if (!violation.empty()) {
        return twin::Report(violation, error, errorCapacity);
    }
    return 0;
}

// Mutation testing of the kernel's synchronisation (tests/test_twin_races.py): drop the
// happens-before edge of one sync call site ("file:line"; "" restores all) for the
// following launches, and list the sync sites the last launch executed.
extern "C" void flash_cann_twin_drop_sync(const char* fileAndLine)
{
    twin::DropSyncSite(fileAndLine != nullptr ? fileAndLine : "");
}

// "kind file:line" lines; returns the length, or minus the capacity needed.
extern "C" int64_t flash_cann_twin_sync_sites(char* buffer, uint64_t capacity)
{
    std::string text;
    for (const std::string& site : twin::ExecutedSyncSites()) {
        text += site + "\n";
    }
    if (text.size() + 1 > capacity) {
        return -static_cast<int64_t>(text.size() + 1);
    }
    std::memcpy(buffer, text.c_str(), text.size() + 1);
    return static_cast<int64_t>(text.size());
}
