#include "c_api.h"

#include <cstring>

#include "decode_planner.h"
#include "plan_json.h"

using namespace flash_cann;

namespace {

int64_t Emit(const std::string& text, char* out, uint64_t capacity)
{
    if (text.size() + 1 > capacity) {
        return -static_cast<int64_t>(text.size() + 1);
    }
    std::memcpy(out, text.c_str(), text.size() + 1);
    return static_cast<int64_t>(text.size());
}

// The platform and request of a C ABI call; the refusal as JSON if the arguments are bad.
std::string ReadCall(const char* soc, int64_t batch, int64_t headsQ, int64_t headsKv,
                     int64_t seqlenQ, int64_t seqlenK, int64_t headDim, int32_t dtype,
                     int32_t layout, int32_t causal, int32_t hasMask, double scale,
                     const flash_cann_variant* variant, int32_t aicCores, Platform& platform,
                     PlanRequest& request)
{
    const Platform* known = FindPlatform(soc ? soc : "");
    if (known == nullptr) {
        return ErrorJson(std::string("unknown SoC '") + (soc ? soc : "") + "'");
    }
    if (dtype < 0 || dtype > 2 || layout < 0 || layout > 2) {
        return ErrorJson("dtype must be 0..2 and layout 0..2");
    }
    platform = WithAiCores(*known, aicCores > 0 ? static_cast<uint32_t>(aicCores) : 0);
    request = PlanRequest{batch, headsQ, headsKv, seqlenQ, seqlenK, headDim,
                          static_cast<DType>(dtype), static_cast<Layout>(layout),
                          causal != 0, hasMask != 0, scale};
    if (variant != nullptr) {
        if (variant->alibi < 0 || variant->alibi > 2) {
            return ErrorJson("alibi must be 0, 1 or 2");
        }
        request.variant = MakeVariant(variant->window_left, variant->window_right,
                                      variant->softcap, variant->dropout_p,
                                      static_cast<Alibi>(variant->alibi), variant->sinks != 0);
        request.tokensQ = variant->tokens_q;
        request.tokensK = variant->tokens_k;
        request.fp16Scores = variant->fp16_scores != 0;
        if (variant->cube_passes < -1 || variant->cube_passes > 1) {
            return ErrorJson("cube_passes must be -1, 0 or 1");
        }
        request.cubePasses = variant->cube_passes;
    }
    return "";
}

// A decode problem and its features as the planner takes them; the refusal if bad.
std::string ReadDecodeProblem(const flash_cann_decode_problem& p, const flash_cann_variant* variant,
                              DecodeRequest& request)
{
    if (p.dtype < 0 || p.dtype > 1) {
        return "dtype must be 0 (float16) or 1 (bfloat16)";
    }
    request.batch = p.batch;
    request.headsQ = p.heads_q;
    request.headsKv = p.heads_kv;
    request.seqlenQ = p.seqlen_q;
    request.tokensQ = p.tokens_q;
    request.headDim = p.head_dim;
    request.dtype = static_cast<DType>(p.dtype);
    request.tnd = p.tnd != 0;
    request.causal = p.causal != 0;
    request.paged = p.max_blocks > 0;
    request.cacheBatch = p.cache_batch;
    request.cacheSeqlen = p.cache_seqlen;
    request.maxBlocks = p.max_blocks;
    request.hasBatchIdx = p.has_batch_idx != 0;
    request.hasLeftpad = p.has_leftpad != 0;
    request.splits = p.splits;
    request.scale = p.scale;
    if (variant != nullptr) {
        if (variant->alibi < 0 || variant->alibi > 2) {
            return "alibi must be 0, 1 or 2";
        }
        if (variant->dropout_p != 0) {
            return "dropout is not a feature of fwd_kvcache";
        }
        if (variant->fp16_scores != 0) {
            return "fp16_scores is not an argument of fwd_kvcache";
        }
        if (variant->cube_passes != 0) {
            return "cube_passes is not an argument of fwd_kvcache";
        }
        request.variant = MakeVariant(variant->window_left, variant->window_right, variant->softcap, 0.0,
                                      static_cast<Alibi>(variant->alibi), variant->sinks != 0);
    }
    return {};
}

}  // namespace

extern "C" int64_t flash_cann_plan_json(const char* soc, int64_t batch, int64_t heads_q,
                                        int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                        int64_t head_dim, int32_t dtype, int32_t layout,
                                        int32_t causal, int32_t has_mask, double scale,
                                        const flash_cann_variant* variant, int32_t aic_cores,
                                        char* out, uint64_t capacity)
{
    Platform platform;
    PlanRequest request;
    const std::string refusal = ReadCall(soc, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                         head_dim, dtype, layout, causal, has_mask, scale,
                                         variant, aic_cores, platform, request);
    if (!refusal.empty()) {
        return Emit(refusal, out, capacity);
    }
    return Emit(PlanToJson(MakePlan(request, platform), request, platform), out, capacity);
}

extern "C" int64_t flash_cann_grad_plan_json(const char* soc, int64_t batch, int64_t heads_q,
                                             int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                             int64_t head_dim, int32_t dtype, int32_t layout,
                                             int32_t causal, int32_t has_mask,
                                             int32_t deterministic, double scale,
                                             const flash_cann_variant* variant,
                                             int32_t aic_cores, char* out, uint64_t capacity)
{
    Platform platform;
    GradPlanRequest request;
    const std::string refusal = ReadCall(soc, batch, heads_q, heads_kv, seqlen_q, seqlen_k,
                                         head_dim, dtype, layout, causal, has_mask, scale,
                                         variant, aic_cores, platform, request.problem);
    if (!refusal.empty()) {
        return Emit(refusal, out, capacity);
    }
    request.deterministic = deterministic != 0;
    return Emit(GradPlanToJson(MakeGradPlan(request, platform), request, platform), out, capacity);
}

extern "C" int64_t flash_cann_decode_plan_json(const char* soc, const flash_cann_decode_problem* problem,
                                               const flash_cann_variant* variant, int64_t keys,
                                               int32_t aic_cores, char* out, uint64_t capacity)
{
    const Platform* known = FindPlatform(soc ? soc : "");
    if (known == nullptr || problem == nullptr) {
        return Emit(ErrorJson(std::string("unknown SoC '") + (soc ? soc : "") + "'"), out, capacity);
    }
    const Platform platform = WithAiCores(*known, aic_cores > 0 ? static_cast<uint32_t>(aic_cores) : 0);
    DecodeRequest request;
    std::string refusal = ReadDecodeProblem(*problem, variant, request);
    if (!refusal.empty()) {
        return Emit(ErrorJson(refusal), out, capacity);
    }
    return Emit(DecodePlanToJson(MakeDecodePlan(request, platform), request, platform,
                                 keys > 0 ? keys : DecodeCapacity(request)),
                out, capacity);
}

extern "C" int64_t flash_cann_platforms_json(char* out, uint64_t capacity)
{
    return Emit(PlatformsToJson(), out, capacity);
}

extern "C" int64_t flash_cann_model_fit_json(int32_t refit, const double* figures, char* out,
                                             uint64_t capacity)
{
    const Platform& b2 = *FindPlatform("Ascend910B2");
    if (refit != 0) {
        return Emit(FitToJson(FitModel(b2), b2), out, capacity);
    }
    const FittedFigures f = figures ? FittedFigures{figures[0], figures[1], figures[2], figures[3],
                                                    figures[4], figures[5]}
                                    : kFitted;
    return Emit(FitToJson(EvaluateFit(f, b2), b2), out, capacity);
}
