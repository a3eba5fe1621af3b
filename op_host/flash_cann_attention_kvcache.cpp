// The CANN shell of the decode op FlashCannAttentionKVCache (fwd_kvcache: flash-attn's
// flash_attn_with_kvcache, vLLM's paged call): OpDef registration, InferShape /
// InferDataType and the TilingFunc. What it decides is the decode planner's
// (op_host/planner/decode_planner.h), from shapes only: the per-sequence values
// (cache_seqlens, cache_batch_idx, block_table, cache_leftpad) stay in GM for the kernel,
// so a decode step can be captured into a graph.
//
// The inputs, outputs and attributes are those of op_project/flash_cann_ops.yaml, in its
// order (tests/test_op_host.py checks them); their indices come from flash_cann_contract.h.
// k_cache and v_cache are the kernel's inputs only: the new key/value are appended to them
// before the op by contract/kvcache.append (one device op per cache, with the capacity
// guard), so this op attends to cache_seqlens keys per sequence and refuses key/value
// (docs/kernel-decode.md, "The decode kernel", says why the append is not in the kernel).
#include "flash_cann_host_common.h"
#include "decode_planner.h"

using namespace flash_cann_host;

namespace {

using namespace flash_cann::contract::fwd_kvcache::input;
using namespace flash_cann::contract::fwd_kvcache::output;
namespace attr = flash_cann::contract::fwd_kvcache::attr;

constexpr FeatureIndices kFeatures{kAlibiSlopes, kNoFeature, kSinks, attr::kWindowLeft,
                                   attr::kWindowRight, attr::kSoftcap, kNoFeature};

const gert::Shape* Shape(gert::TilingContext* context, size_t index, bool optional)
{
    const gert::StorageShape* s =
        optional ? context->GetOptionalInputShape(index) : context->GetInputShape(index);
    return s == nullptr ? nullptr : &s->GetStorageShape();
}

}  // namespace

namespace optiling {

ge::graphStatus FlashCannAttentionKVCacheRequest(gert::TilingContext* context,
                                                 flash_cann::DecodeRequest& request)
{
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    FLASH_CANN_CHECK(context, attrs != nullptr, "no attributes");
    const float* scale = attrs->GetFloat(attr::kScale);
    const bool* causal = attrs->GetBool(attr::kCausal);
    const char* layout = attrs->GetStr(attr::kLayout);
    FLASH_CANN_CHECK(context, scale != nullptr && causal != nullptr, "scale/causal missing");
    FLASH_CANN_CHECK(context, layout != nullptr && (std::strcmp(layout, "BSND") == 0 ||
                                                    std::strcmp(layout, "TND") == 0),
                     "layout must be BSND or TND (got %s)", layout ? layout : "null");
    // TND: vLLM's packed query rows (tokens, heads_q, head_dim), sequence b's rows from
    // cu_seqlens_q, read by the kernel on the device; the plan sees max_seqlen_q only.
    request.tnd = std::strcmp(layout, "TND") == 0;
    const size_t queryRank = request.tnd ? kRank - 1 : kRank;
    const gert::Shape* q = Shape(context, kQuery, false);
    const gert::Shape* cache = Shape(context, kKCache, false);
    const gert::Shape* vCache = Shape(context, kVCache, false);
    FLASH_CANN_CHECK(context, q != nullptr && cache != nullptr && vCache != nullptr,
                     "query/k_cache/v_cache shape missing");
    FLASH_CANN_CHECK(context, q->GetDimNum() == queryRank && cache->GetDimNum() == kRank &&
                                  ShapeText(*cache) == ShapeText(*vCache),
                     "query must be %s and k_cache, v_cache one (batch_cache or num_blocks, "
                     "seqlen or page_size, heads_kv, head_dim) shape (got %s, %s, %s)",
                     request.tnd ? "(tokens_q, heads_q, head_dim) for layout TND"
                                 : "(batch, seqlen_q, heads_q, head_dim)",
                     ShapeText(*q).c_str(), ShapeText(*cache).c_str(), ShapeText(*vCache).c_str());
    FLASH_CANN_CHECK(context, Shape(context, kKey, true) == nullptr && Shape(context, kValue, true) == nullptr,
                     "key/value: the Ascend op does not append; append them before it "
                     "(flash_cann.contract.kvcache.append) and pass cache_seqlens + seqlen_new");
    const gert::Shape* lengths = Shape(context, kCacheSeqlens, true);
    FLASH_CANN_CHECK(context, lengths != nullptr && lengths->GetDimNum() == 1 &&
                                  (request.tnd || lengths->GetDim(0) == q->GetDim(0)),
                     "cache_seqlens (int32 (batch,), the keys of each sequence) is required by "
                     "the Ascend kernel%s", request.tnd ? "" : ", batch = query's first dimension");
    const gert::Shape* cuSeqlensQ = Shape(context, kCuSeqlensQ, true);
    if (request.tnd) {
        const int64_t* maxSeqlenQ = attrs->GetInt(attr::kMaxSeqlenQ);
        request.batch = lengths->GetDim(0);
        FLASH_CANN_CHECK(context, cuSeqlensQ != nullptr && cuSeqlensQ->GetDimNum() == 1 &&
                                      cuSeqlensQ->GetDim(0) == request.batch + 1,
                         "cu_seqlens_q must be int32 (batch + 1,) = (%lld,) for layout TND "
                         "(batch = cache_seqlens' length)",
                         static_cast<long long>(request.batch + 1));
        FLASH_CANN_CHECK(context, maxSeqlenQ != nullptr && *maxSeqlenQ >= 1,
                         "max_seqlen_q must be >= 1 for layout TND (it sizes the plan)");
        request.seqlenQ = *maxSeqlenQ;
        request.tokensQ = q->GetDim(0);
        request.headsQ = q->GetDim(1);
        request.headDim = q->GetDim(2);
    } else {
        FLASH_CANN_CHECK(context, cuSeqlensQ == nullptr,
                         "cu_seqlens_q is taken with layout TND only");
        request.batch = q->GetDim(0);
        request.seqlenQ = q->GetDim(1);
        request.headsQ = q->GetDim(2);
        request.headDim = q->GetDim(3);
    }
    request.headsKv = cache->GetDim(2);
    FLASH_CANN_CHECK(context, cache->GetDim(3) == request.headDim,
                     "k_cache's head_dim %lld must be query's %lld",
                     static_cast<long long>(cache->GetDim(3)), static_cast<long long>(request.headDim));
    request.cacheBatch = cache->GetDim(0);
    request.cacheSeqlen = cache->GetDim(1);
    if (const gert::Shape* table = Shape(context, kBlockTable, true)) {
        FLASH_CANN_CHECK(context, table->GetDimNum() == 2 && table->GetDim(0) == request.batch,
                         "block_table must be int32 (batch, max_blocks) = (%lld, ...) (got %s)",
                         static_cast<long long>(request.batch), ShapeText(*table).c_str());
        request.paged = true;
        request.maxBlocks = table->GetDim(1);
    }
    request.hasBatchIdx = Shape(context, kCacheBatchIdx, true) != nullptr;
    request.hasLeftpad = Shape(context, kCacheLeftpad, true) != nullptr;
    FLASH_CANN_CHECK(context, !(request.paged && request.hasBatchIdx),
                     "cache_batch_idx is not taken with a paged cache (block_table)");
    if (ReadQueryDType(context, kQuery, request.dtype) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    request.causal = *causal;
    request.scale = *scale;
    // flash-attn's num_splits hint: 0 lets the planner split the keys over cores, n > 0
    // asks for n key ranges per tile (the planner still bounds it by the keys).
    const int64_t* splits = attrs->GetInt(attr::kNumSplits);
    FLASH_CANN_CHECK(context, splits == nullptr || (*splits >= 0 && *splits <= 128),
                     "num_splits must be in [0, 128] (got %lld)",
                     static_cast<long long>(splits == nullptr ? 0 : *splits));
    request.splits = splits == nullptr ? 0 : *splits;
    // The features, read and checked as the forward's (ReadVariant), against the cache's
    // capacity as seqlen_k (a window at least that wide is unbounded).
    flash_cann::PlanRequest shared;
    shared.batch = request.batch;
    shared.headsQ = request.headsQ;
    shared.seqlenK = flash_cann::DecodeCapacity(request);
    shared.causal = request.causal;
    if (ReadVariant(context, kFeatures, shared) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    request.variant = shared.variant;
    return ge::GRAPH_SUCCESS;
}

static ge::graphStatus FlashCannAttentionKVCacheTiling(gert::TilingContext* context)
{
    flash_cann::DecodeRequest request;
    if (FlashCannAttentionKVCacheRequest(context, request) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    flash_cann::Platform platform;
    if (ReadPlatform(context, platform) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    const flash_cann::DecodePlanResult result = flash_cann::MakeDecodePlan(request, platform);
    FLASH_CANN_CHECK(context, result.ok(), "refused: %s", result.error.c_str());
    const flash_cann::DecodePlan& plan = result.plan;
    return WritePlan(context, plan.tiling, plan.blockDim, plan.tilingKey, plan.scheduleMode,
                     plan.userWorkspaceBytes);
}

}  // namespace optiling

namespace ge {

static graphStatus FlashCannAttentionKVCacheInferShape(gert::InferShapeContext* context)
{
    const gert::Shape* query = context->GetInputShape(kQuery);
    gert::Shape* out = context->GetOutputShape(kOut);
    gert::Shape* lse = context->GetOutputShape(kSoftmaxLse);
    FLASH_CANN_CHECK(context, query != nullptr && out != nullptr && lse != nullptr &&
                                  (query->GetDimNum() == kRank || query->GetDimNum() == kRank - 1),
                     "query must be 4-D (batch, seqlen_q, heads_q, head_dim) or, for layout "
                     "TND, 3-D (tokens_q, heads_q, head_dim)");
    *out = *query;
    if (query->GetDimNum() == kRank - 1) {
        lse->SetDimNum(2);  // TND: (heads_q, tokens_q)
        lse->SetDim(0, query->GetDim(1));
        lse->SetDim(1, query->GetDim(0));
        return GRAPH_SUCCESS;
    }
    lse->SetDimNum(3);  // (batch, heads_q, seqlen_q)
    lse->SetDim(0, query->GetDim(0));
    lse->SetDim(1, query->GetDim(2));
    lse->SetDim(2, query->GetDim(1));
    return GRAPH_SUCCESS;
}

static graphStatus FlashCannAttentionKVCacheInferDataType(gert::InferDataTypeContext* context)
{
    context->SetOutputDataType(kOut, context->GetInputDataType(kQuery));
    context->SetOutputDataType(kSoftmaxLse, DT_FLOAT);
    return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class FlashCannAttentionKVCache : public OpDef {
public:
    explicit FlashCannAttentionKVCache(const char* name) : OpDef(name)
    {
        const std::vector<ge::DataType> int32Types = {ge::DT_INT32, ge::DT_INT32};
        DeclareInput(this->Input("query"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("k_cache"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("v_cache"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("key"), OPTIONAL, kInputTypes);
        DeclareInput(this->Input("value"), OPTIONAL, kInputTypes);
        DeclareInput(this->Input("cache_seqlens"), OPTIONAL, int32Types);
        DeclareInput(this->Input("cache_batch_idx"), OPTIONAL, int32Types);
        DeclareInput(this->Input("block_table"), OPTIONAL, int32Types);
        DeclareInput(this->Input("cache_leftpad"), OPTIONAL, int32Types);
        DeclareInput(this->Input("cu_seqlens_q"), OPTIONAL, int32Types);
        DeclareInput(this->Input("alibi_slopes"), OPTIONAL, kFloatTypes);
        DeclareInput(this->Input("sinks"), OPTIONAL, kFloatTypes);
        DeclareOutput(this->Output("out"), kInputTypes);
        DeclareOutput(this->Output("softmax_lse"), kFloatTypes);
        this->Attr("scale").AttrType(REQUIRED).Float();
        this->Attr("causal").AttrType(OPTIONAL).Bool(false);
        this->Attr("layout").AttrType(OPTIONAL).String("BSND");
        this->Attr("max_seqlen_q").AttrType(OPTIONAL).Int(0);
        this->Attr("window_left").AttrType(OPTIONAL).Int(-1);
        this->Attr("window_right").AttrType(OPTIONAL).Int(-1);
        this->Attr("softcap").AttrType(OPTIONAL).Float(0.0f);
        this->Attr("num_splits").AttrType(OPTIONAL).Int(0);
        this->SetInferShape(ge::FlashCannAttentionKVCacheInferShape)
            .SetInferDataType(ge::FlashCannAttentionKVCacheInferDataType);
        AICoreConfigs(*this, optiling::FlashCannAttentionKVCacheTiling, "flash_cann_attention_kvcache");
    }
};

OP_ADD(FlashCannAttentionKVCache);

}  // namespace ops
