// The CANN shell of the forward op FlashCannAttention: OpDef registration,
// InferShape/InferDataType and the TilingFunc (the backward's is
// flash_cann_attention_grad.cpp). Everything it decides is delegated to the portable planner
// (op_host/planner); this file only translates between CANN's host API
// (metadef register/op_def_registry.h, exe_graph contexts, platform_ascendc) and it.
//
// The inputs, outputs and attributes below are those of op_project/flash_cann_ops.yaml,
// in the same order (tests/test_op_host.py checks them against it); their indices come
// from flash_cann_contract.h, generated from it.
#include "flash_cann_host_common.h"

using namespace flash_cann_host;

namespace {

// Input and output indices, in spec order (generated).
using namespace flash_cann::contract::fwd::input;
using namespace flash_cann::contract::fwd::output;
namespace attr = flash_cann::contract::fwd::attr;

constexpr FeatureIndices kFeatures{kAlibiSlopes, kRngState, kSinks, attr::kWindowLeft,
                                   attr::kWindowRight, attr::kSoftcap, attr::kDropoutP};
constexpr PackedIndices kPacking{kCuSeqlensQ, kCuSeqlensK, attr::kMaxSeqlenQ, attr::kMaxSeqlenK};

}  // namespace

namespace optiling {

ge::graphStatus FlashCannAttentionRequest(gert::TilingContext* context,
                                          flash_cann::PlanRequest& request)
{
    if (ReadProblem(context, kQuery, kKey, kPacking, request) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    request.hasMask = context->GetOptionalInputShape(kKeyPaddingMask) != nullptr;
    if (ReadScores(context, attr::kFp16Scores, request) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    return ReadVariant(context, kFeatures, request);
}

static ge::graphStatus FlashCannAttentionTiling(gert::TilingContext* context)
{
    flash_cann::PlanRequest request;
    if (FlashCannAttentionRequest(context, request) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    flash_cann::Platform platform;
    if (ReadPlatform(context, platform) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    const flash_cann::PlanResult result = flash_cann::MakePlan(request, platform);
    FLASH_CANN_CHECK(context, result.ok(), "refused: %s", result.error.c_str());
    const flash_cann::Plan& plan = result.plan;
    // Normal schedule mode: the forward waits only within an AI core, never across blocks.
    return WritePlan(context, plan.tiling, plan.blockDim, plan.tilingKey, flash_cann::kScheduleNormal,
                     plan.userWorkspaceBytes);
}

}  // namespace optiling

namespace ge {

static graphStatus FlashCannAttentionInferShape(gert::InferShapeContext* context)
{
    const gert::Shape* query = context->GetInputShape(kQuery);
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    gert::Shape* out = context->GetOutputShape(kOut);
    gert::Shape* lse = context->GetOutputShape(kSoftmaxLse);
    flash_cann::Layout layout;
    FLASH_CANN_CHECK(context, query != nullptr && attrs != nullptr && out != nullptr && lse != nullptr,
                     "query, attributes and outputs missing");
    FLASH_CANN_CHECK(context, ParseLayout(attrs->GetStr(kLayout), layout),
                     "layout must be BNSD, BSND or TND");
    FLASH_CANN_CHECK(context, query->GetDimNum() == RankOf(layout), "query must be %zu-D",
                     RankOf(layout));
    *out = *query;
    const Axes axes = AxesOf(layout);
    if (layout == flash_cann::Layout::TND) {
        lse->SetDimNum(2);  // (heads_q, tokens_q)
        lse->SetDim(0, query->GetDim(axes.heads));
        lse->SetDim(1, query->GetDim(axes.seqlen));
        return GRAPH_SUCCESS;
    }
    lse->SetDimNum(3);  // (batch, heads_q, seqlen_q); SetDim alone does not grow the rank
    lse->SetDim(0, query->GetDim(axes.batch));
    lse->SetDim(1, query->GetDim(axes.heads));
    lse->SetDim(2, query->GetDim(axes.seqlen));
    return GRAPH_SUCCESS;
}

static graphStatus FlashCannAttentionInferDataType(gert::InferDataTypeContext* context)
{
    context->SetOutputDataType(kOut, context->GetInputDataType(kQuery));
    context->SetOutputDataType(kSoftmaxLse, DT_FLOAT);
    return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

class FlashCannAttention : public OpDef {
public:
    explicit FlashCannAttention(const char* name) : OpDef(name)
    {
        DeclareInput(this->Input("query"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("key"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("value"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("key_padding_mask"), OPTIONAL, kBoolTypes);
        FeatureInputs(*this);
        DeclareOutput(this->Output("out"), kInputTypes);
        DeclareOutput(this->Output("softmax_lse"), kFloatTypes);
        SharedAttributes(*this);
        FeatureAttributes(*this);
        ScoresAttribute(*this);
        this->SetInferShape(ge::FlashCannAttentionInferShape)
            .SetInferDataType(ge::FlashCannAttentionInferDataType);
        AICoreConfigs(*this, optiling::FlashCannAttentionTiling);
    }
};

OP_ADD(FlashCannAttention);

}  // namespace ops
