#include "c_api.h"

#include <cstring>

#include "plan_json.h"

namespace {

int64_t Emit(const std::string& text, char* out, uint64_t capacity)
{
    if (text.size() + 1 > capacity) {
        return -static_cast<int64_t>(text.size() + 1);
    }
    std::memcpy(out, text.c_str(), text.size() + 1);
    return static_cast<int64_t>(text.size());
}

}  // namespace

extern "C" int64_t flash_cann_plan_json(const char* soc, int64_t batch, int64_t heads_q,
                                        int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                        int64_t head_dim, int32_t dtype, int32_t layout,
                                        int32_t causal, int32_t has_mask, double scale,
                                        int32_t aic_cores, char* out, uint64_t capacity)
{
    using namespace flash_cann;
    const Platform* known = FindPlatform(soc ? soc : "");
    if (known == nullptr) {
        return Emit(ErrorJson(std::string("unknown SoC '") + (soc ? soc : "") + "'"), out, capacity);
    }
    if (dtype < 0 || dtype > 2 || layout < 0 || layout > 1) {
        return Emit(ErrorJson("dtype must be 0..2 and layout 0..1"), out, capacity);
    }
    const Platform platform = WithAiCores(*known, aic_cores > 0 ? static_cast<uint32_t>(aic_cores) : 0);
    const PlanRequest request{batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
                              static_cast<DType>(dtype), static_cast<Layout>(layout),
                              causal != 0, has_mask != 0, scale};
    return Emit(PlanToJson(MakePlan(request, platform), request, platform), out, capacity);
}

extern "C" int64_t flash_cann_platforms_json(char* out, uint64_t capacity)
{
    return Emit(flash_cann::PlatformsToJson(), out, capacity);
}
