// The CANN shell of the backward op FlashCannAttentionGrad: OpDef registration,
// InferShape/InferDataType and the TilingFunc. Everything it decides is delegated to the
// portable backward planner (op_host/planner/grad_planner.h); this file only translates
// between CANN's host API and it.
//
// The inputs, outputs and attributes below are those of the spec's `bwd` op
// (op_project/flash_cann_ops.yaml), in the same order (tests/test_op_host.py checks them).
#include "flash_cann_host_common.h"
#include "grad_planner.h"

using namespace flash_cann_host;

namespace {

// Input and attribute indices, in spec order (generated from the spec). The optional
// inputs come last, so the required ones have the same instance index whether or not the
// optional ones are given.
using namespace flash_cann::contract::bwd::input;
namespace attr = flash_cann::contract::bwd::attr;
using attr::kDeterministic;

constexpr FeatureIndices kFeatures{kAlibiSlopes, kRngState, kSinks, attr::kWindowLeft,
                                   attr::kWindowRight, attr::kSoftcap, attr::kDropoutP};
constexpr PackedIndices kPacking{kCuSeqlensQ, kCuSeqlensK, attr::kMaxSeqlenQ, attr::kMaxSeqlenK};
// grad_query, grad_key, grad_value: like inputs query, key, value (consecutive); then
// grad_sinks (heads_q,), always written (zeros without sinks).
using flash_cann::contract::bwd::output::kGradSinks;
constexpr size_t kGradients = 3;
static_assert(kKey == kQuery + 1 && kValue == kQuery + 2 && kGradSinks == kGradients &&
                  flash_cann::contract::bwd::output::kCount == kGradients + 1,
              "the gradients follow query, key, value; grad_sinks comes last");

bool SameShape(const gert::Shape& a, const gert::Shape& b)
{
    if (a.GetDimNum() != b.GetDimNum()) {
        return false;
    }
    for (size_t i = 0; i < a.GetDimNum(); ++i) {
        if (a.GetDim(i) != b.GetDim(i)) {
            return false;
        }
    }
    return true;
}

// The tensors the planner does not look at must still agree with the problem, or the
// kernel would read past them: grad_out and out like query, value like key, softmax_lse
// and grad_softmax_lse (batch, heads_q, seqlen_q) -- (heads_q, tokens_q) with layout TND --,
// key_padding_mask (batch, seqlen_k).
ge::graphStatus CheckOperands(gert::TilingContext* context, const flash_cann::PlanRequest& r)
{
    auto shape = [&](size_t instance) -> const gert::Shape* {
        const gert::StorageShape* s = context->GetInputShape(instance);
        return s ? &s->GetStorageShape() : nullptr;
    };
    const gert::Shape* query = shape(kQuery);
    const gert::Shape* key = shape(kKey);
    for (const auto& [name, index, like, likeName] :
         {std::tuple{"grad_out", kGradOut, query, "query"}, {"out", kOut, query, "query"},
          {"value", kValue, key, "key"}}) {
        const gert::Shape* s = shape(index);
        FLASH_CANN_CHECK(context, s != nullptr && SameShape(*s, *like),
                         "%s must have the shape of %s", name, likeName);
    }
    gert::Shape rows;
    const gert::Shape* lse = shape(kSoftmaxLse);
    if (r.layout == flash_cann::Layout::TND) {
        rows.SetDimNum(2);
        rows.SetDim(0, r.headsQ);
        rows.SetDim(1, r.tokensQ);
        FLASH_CANN_CHECK(context, lse != nullptr && SameShape(*lse, rows),
                         "softmax_lse must have shape (heads_q, tokens_q) = (%lld, %lld) with layout TND",
                         static_cast<long long>(r.headsQ), static_cast<long long>(r.tokensQ));
    } else {
        rows.SetDimNum(3);
        rows.SetDim(0, r.batch);
        rows.SetDim(1, r.headsQ);
        rows.SetDim(2, r.seqlenQ);
        FLASH_CANN_CHECK(context, lse != nullptr && SameShape(*lse, rows),
                         "softmax_lse must have shape (batch, heads_q, seqlen_q) = (%lld, %lld, %lld)",
                         static_cast<long long>(r.batch), static_cast<long long>(r.headsQ),
                         static_cast<long long>(r.seqlenQ));
    }
    const gert::StorageShape* gradLse = context->GetOptionalInputShape(kGradSoftmaxLse);
    FLASH_CANN_CHECK(context, gradLse == nullptr || SameShape(gradLse->GetStorageShape(), rows),
                     "grad_softmax_lse must have the shape of softmax_lse");
    const gert::StorageShape* mask = context->GetOptionalInputShape(kKeyPaddingMask);
    FLASH_CANN_CHECK(context, mask == nullptr || r.layout != flash_cann::Layout::TND,
                     "key_padding_mask is not taken with layout TND (cu_seqlens_k delimits the keys)");
    gert::Shape keys;
    keys.SetDimNum(2);
    keys.SetDim(0, r.batch);
    keys.SetDim(1, r.seqlenK);
    FLASH_CANN_CHECK(context, mask == nullptr || SameShape(mask->GetStorageShape(), keys),
                     "key_padding_mask must have shape (batch, seqlen_k) = (%lld, %lld)",
                     static_cast<long long>(r.batch), static_cast<long long>(r.seqlenK));
    return ge::GRAPH_SUCCESS;
}

}  // namespace

namespace optiling {

ge::graphStatus FlashCannAttentionGradRequest(gert::TilingContext* context,
                                              flash_cann::GradPlanRequest& request)
{
    if (ReadProblem(context, kQuery, kKey, kPacking, request.problem) != ge::GRAPH_SUCCESS ||
        CheckOperands(context, request.problem) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    request.problem.hasMask = context->GetOptionalInputShape(kKeyPaddingMask) != nullptr;
    const bool* deterministic = context->GetAttrs()->GetBool(kDeterministic);
    FLASH_CANN_CHECK(context, deterministic != nullptr, "deterministic missing");
    request.deterministic = *deterministic;
    if (ReadScores(context, attr::kFp16Scores, request.problem) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    return ReadVariant(context, kFeatures, request.problem);
}

static ge::graphStatus FlashCannAttentionGradTiling(gert::TilingContext* context)
{
    flash_cann::GradPlanRequest request;
    if (FlashCannAttentionGradRequest(context, request) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    flash_cann::Platform platform;
    if (ReadPlatform(context, platform) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    const flash_cann::GradPlanResult result = flash_cann::MakeGradPlan(request, platform);
    FLASH_CANN_CHECK(context, result.ok(), "refused: %s", result.error.c_str());
    const flash_cann::GradPlan& plan = result.plan;
    return WritePlan(context, plan.tiling, plan.blockDim, plan.tilingKey, plan.scheduleMode,
                     plan.userWorkspaceBytes);
}

}  // namespace optiling

namespace ge {

// Each gradient has the shape and dtype of its input; grad_sinks is fp32 (heads_q,),
// whether or not the sinks input is given (an output's shape does not depend on it).
static graphStatus FlashCannAttentionGradInferShape(gert::InferShapeContext* context)
{
    for (size_t i = 0; i < kGradients; ++i) {
        const gert::Shape* input = context->GetInputShape(kQuery + i);
        gert::Shape* grad = context->GetOutputShape(i);
        FLASH_CANN_CHECK(context, input != nullptr && grad != nullptr, "missing shape");
        *grad = *input;
    }
    const gert::Shape* query = context->GetInputShape(kQuery);
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    gert::Shape* gradSinks = context->GetOutputShape(kGradSinks);
    flash_cann::Layout layout;
    FLASH_CANN_CHECK(context, attrs != nullptr && gradSinks != nullptr, "attributes or outputs missing");
    FLASH_CANN_CHECK(context, ParseLayout(attrs->GetStr(kLayout), layout),
                     "layout must be BNSD, BSND or TND");
    FLASH_CANN_CHECK(context, query->GetDimNum() == RankOf(layout), "query must be %zu-D",
                     RankOf(layout));
    gradSinks->SetDimNum(1);  // SetDim alone does not grow the rank
    gradSinks->SetDim(0, query->GetDim(AxesOf(layout).heads));
    return GRAPH_SUCCESS;
}

static graphStatus FlashCannAttentionGradInferDataType(gert::InferDataTypeContext* context)
{
    for (size_t i = 0; i < kGradients; ++i) {
        context->SetOutputDataType(i, context->GetInputDataType(kQuery + i));
    }
    context->SetOutputDataType(kGradSinks, DT_FLOAT);
    return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class FlashCannAttentionGrad : public OpDef {
public:
    explicit FlashCannAttentionGrad(const char* name) : OpDef(name)
    {
        DeclareInput(this->Input("grad_out"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("query"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("key"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("value"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("out"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("softmax_lse"), REQUIRED, kFloatTypes);
        DeclareInput(this->Input("key_padding_mask"), OPTIONAL, kBoolTypes);
        DeclareInput(this->Input("grad_softmax_lse"), OPTIONAL, kFloatTypes);
        FeatureInputs(*this);
        DeclareOutput(this->Output("grad_query"), kInputTypes);
        DeclareOutput(this->Output("grad_key"), kInputTypes);
        DeclareOutput(this->Output("grad_value"), kInputTypes);
        DeclareOutput(this->Output("grad_sinks"), kFloatTypes);
        SharedAttributes(*this);
        // flash-attn's deterministic=True: dQ reduced from per-core partials in a fixed
        // order instead of fp32 atomic adds (the tiling key's deterministic bit).
        this->Attr("deterministic").AttrType(OPTIONAL).Bool(false);
        FeatureAttributes(*this);
        ScoresAttribute(*this);
        this->SetInferShape(ge::FlashCannAttentionGradInferShape)
            .SetInferDataType(ge::FlashCannAttentionGradInferDataType);
        AICoreConfigs(*this, optiling::FlashCannAttentionGradTiling);
    }
};

OP_ADD(FlashCannAttentionGrad);

}  // namespace ops
