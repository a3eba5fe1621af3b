// The CANN shell of the flash-cann ops: OpDef registration, InferShape/InferDataType and
// the TilingFunc. Everything it decides is delegated to the portable planner
// (op_host/planner); this file only translates between CANN's host API
// (metadef register/op_def_registry.h, exe_graph contexts, platform_ascendc) and it.
//
// The inputs, outputs and attributes below are those of op_project/flash_cann_ops.yaml,
// in the same order (tests/test_op_host.py checks them against it); their indices and
// the layout names come from flash_cann_contract.h, generated from it.
#include <cstdio>
#include <cstring>
#include <string>

#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"

#include "flash_cann_contract.h"
#include "planner.h"

namespace {

// The op_host error idiom: log the reason, return a failed status. (CANN's OP_LOGE lives
// in the separate ops-base package; stderr works with every toolkit version.)
#define FLASH_CANN_CHECK(context, cond, ...)                                   \
    do {                                                                       \
        if (!(cond)) {                                                         \
            std::fprintf(stderr, "[flash_cann][%s] ", (context)->GetNodeType()); \
            std::fprintf(stderr, __VA_ARGS__);                                 \
            std::fprintf(stderr, "\n");                                        \
            return ge::GRAPH_FAILED;                                           \
        }                                                                      \
    } while (0)

namespace fwd = flash_cann::contract::fwd;
namespace bwd = flash_cann::contract::bwd;
constexpr size_t kRank = 4;

bool ParseLayout(const char* text, flash_cann::Layout& layout)
{
    for (uint32_t i = 0; text != nullptr && i < flash_cann::contract::kLayoutCount; ++i) {
        if (std::strcmp(text, flash_cann::contract::kLayoutNames[i]) == 0) {
            layout = static_cast<flash_cann::Layout>(i);
            return true;
        }
    }
    return false;
}

// (batch, heads, seqlen, head_dim) positions of a layout.
struct Axes {
    size_t batch, heads, seqlen, headDim;
};

Axes AxesOf(flash_cann::Layout layout)
{
    return layout == flash_cann::Layout::BNSD ? Axes{0, 1, 2, 3} : Axes{0, 2, 1, 3};
}

}  // namespace

namespace optiling {

static ge::graphStatus FlashCannAttentionTiling(gert::TilingContext* context)
{
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    FLASH_CANN_CHECK(context, attrs != nullptr, "no attributes");
    const float* scale = attrs->GetFloat(fwd::attr::kScale);
    const bool* causal = attrs->GetBool(fwd::attr::kCausal);
    const char* layoutText = attrs->GetStr(fwd::attr::kLayout);
    flash_cann::PlanRequest request;
    FLASH_CANN_CHECK(context, scale != nullptr && causal != nullptr, "scale/causal missing");
    FLASH_CANN_CHECK(context, ParseLayout(layoutText, request.layout),
                     "layout must be BNSD or BSND (got %s)", layoutText ? layoutText : "null");
    const gert::StorageShape* query = context->GetInputShape(fwd::input::kQuery);
    const gert::StorageShape* key = context->GetInputShape(fwd::input::kKey);
    FLASH_CANN_CHECK(context, query != nullptr && key != nullptr, "query/key shape missing");
    const gert::Shape& q = query->GetStorageShape();
    const gert::Shape& k = key->GetStorageShape();
    FLASH_CANN_CHECK(context, q.GetDimNum() == kRank && k.GetDimNum() == kRank,
                     "query and key must be 4-D (got %zu-D and %zu-D)", q.GetDimNum(),
                     k.GetDimNum());
    const Axes axes = AxesOf(request.layout);
    request.batch = q.GetDim(axes.batch);
    request.headsQ = q.GetDim(axes.heads);
    request.seqlenQ = q.GetDim(axes.seqlen);
    request.headDim = q.GetDim(axes.headDim);
    request.headsKv = k.GetDim(axes.heads);
    request.seqlenK = k.GetDim(axes.seqlen);
    FLASH_CANN_CHECK(context, k.GetDim(axes.batch) == request.batch &&
                                  k.GetDim(axes.headDim) == request.headDim,
                     "key must match query in batch and head_dim");
    const gert::CompileTimeTensorDesc* queryDesc = context->GetInputDesc(fwd::input::kQuery);
    FLASH_CANN_CHECK(context, queryDesc != nullptr, "query description missing");
    const ge::DataType dtype = queryDesc->GetDataType();
    FLASH_CANN_CHECK(context, dtype == ge::DT_FLOAT16 || dtype == ge::DT_BF16,
                     "query dtype must be float16 or bfloat16");
    request.dtype = dtype == ge::DT_BF16 ? flash_cann::DType::BFloat16 : flash_cann::DType::Float16;
    request.causal = *causal;
    request.hasMask = context->GetOptionalInputShape(fwd::input::kKeyPaddingMask) != nullptr;
    request.scale = *scale;

    // The platform the kernel runs on, as the platform API reports it.
    const auto ascendc = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
    flash_cann::Platform platform;
    platform.name = "runtime";
    platform.aicCores = ascendc.GetCoreNumAic();
    platform.aivCores = ascendc.GetCoreNumAiv();
    ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::UB, platform.ubBytes);
    ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L1, platform.l1Bytes);
    ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L0_A, platform.l0aBytes);
    ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L0_B, platform.l0bBytes);
    ascendc.GetCoreMemSize(platform_ascendc::CoreMemType::L0_C, platform.l0cBytes);
    FLASH_CANN_CHECK(context, platform.aivCores == 2 * platform.aicCores,
                     "the kernel pairs each AI core with 2 vector cores (platform reports %u "
                     "AIC, %u AIV)", platform.aicCores, platform.aivCores);

    const flash_cann::PlanResult result = flash_cann::MakePlan(request, platform);
    FLASH_CANN_CHECK(context, result.ok(), "refused: %s", result.error.c_str());
    const flash_cann::Plan& plan = result.plan;

    gert::TilingData* raw = context->GetRawTilingData();
    FLASH_CANN_CHECK(context, raw != nullptr && raw->GetCapacity() >= sizeof(plan.tiling),
                     "tiling buffer holds %zu bytes, the plan needs %zu",
                     raw ? raw->GetCapacity() : size_t{0}, sizeof(plan.tiling));
    std::memcpy(raw->GetData(), &plan.tiling, sizeof(plan.tiling));
    raw->SetDataSize(sizeof(plan.tiling));
    context->SetBlockDim(plan.blockDim);
    context->SetTilingKey(plan.tilingKey);
    size_t* workspace = context->GetWorkspaceSizes(1);
    FLASH_CANN_CHECK(context, workspace != nullptr, "no workspace slot");
    // The kernel's scratch sits after the system workspace (GetUserWorkspace).
    workspace[0] = plan.userWorkspaceBytes + ascendc.GetLibApiWorkSpaceSize();
    return ge::GRAPH_SUCCESS;
}

}  // namespace optiling

namespace ge {

static graphStatus FlashCannAttentionInferShape(gert::InferShapeContext* context)
{
    const gert::Shape* query = context->GetInputShape(fwd::input::kQuery);
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    gert::Shape* out = context->GetOutputShape(fwd::output::kOut);
    gert::Shape* lse = context->GetOutputShape(fwd::output::kSoftmaxLse);
    flash_cann::Layout layout;
    FLASH_CANN_CHECK(context, query != nullptr && attrs != nullptr && out != nullptr &&
                                  lse != nullptr && query->GetDimNum() == kRank,
                     "query must be 4-D");
    FLASH_CANN_CHECK(context, ParseLayout(attrs->GetStr(fwd::attr::kLayout), layout),
                     "layout must be BNSD or BSND");
    *out = *query;
    const Axes axes = AxesOf(layout);
    lse->SetDimNum(3);  // (batch, heads_q, seqlen_q); SetDim alone does not grow the rank
    lse->SetDim(0, query->GetDim(axes.batch));
    lse->SetDim(1, query->GetDim(axes.heads));
    lse->SetDim(2, query->GetDim(axes.seqlen));
    return GRAPH_SUCCESS;
}

static graphStatus FlashCannAttentionInferDataType(gert::InferDataTypeContext* context)
{
    context->SetOutputDataType(fwd::output::kOut, context->GetInputDataType(fwd::input::kQuery));
    context->SetOutputDataType(fwd::output::kSoftmaxLse, DT_FLOAT);
    return GRAPH_SUCCESS;
}

// Backward: each gradient (grad_query, grad_key, grad_value) has the shape and dtype of
// its input (query, key, value).
constexpr size_t kGradients = bwd::output::kCount;
constexpr size_t kGradientOf[kGradients] = {bwd::input::kQuery, bwd::input::kKey,
                                            bwd::input::kValue};

static graphStatus FlashCannAttentionGradInferShape(gert::InferShapeContext* context)
{
    for (size_t i = 0; i < kGradients; ++i) {
        const gert::Shape* input = context->GetInputShape(kGradientOf[i]);
        gert::Shape* grad = context->GetOutputShape(bwd::output::kGradQuery + i);
        FLASH_CANN_CHECK(context, input != nullptr && grad != nullptr, "missing shape");
        *grad = *input;
    }
    return GRAPH_SUCCESS;
}

static graphStatus FlashCannAttentionGradInferDataType(gert::InferDataTypeContext* context)
{
    for (size_t i = 0; i < kGradients; ++i) {
        context->SetOutputDataType(bwd::output::kGradQuery + i,
                                   context->GetInputDataType(kGradientOf[i]));
    }
    return GRAPH_SUCCESS;
}

}  // namespace ge

namespace ops {

namespace {

// Both ops run on every 910B part and on 910_93 (A3). The dtype lists pair entry by
// entry: the i-th entry of every tensor forms one supported combination.
const std::vector<ge::DataType> kInputTypes = {ge::DT_FLOAT16, ge::DT_BF16};
const std::vector<ge::DataType> kFloatTypes = {ge::DT_FLOAT, ge::DT_FLOAT};
const std::vector<ge::DataType> kBoolTypes = {ge::DT_BOOL, ge::DT_BOOL};
const std::vector<ge::Format> kFormats = {ge::FORMAT_ND, ge::FORMAT_ND};

void DeclareInput(OpParamDef& param, Option presence, const std::vector<ge::DataType>& types)
{
    // AutoContiguous: the generated aclnn makes strided inputs contiguous; the kernel
    // reads the dense layout the `layout` attribute names.
    param.ParamType(presence).DataType(types).Format(kFormats).AutoContiguous();
}

void DeclareOutput(OpParamDef& param, const std::vector<ge::DataType>& types)
{
    param.ParamType(REQUIRED).DataType(types).Format(kFormats);
}

void Attributes(OpDef& op)
{
    op.Attr("scale").AttrType(REQUIRED).Float();
    op.Attr("causal").AttrType(OPTIONAL).Bool(false);
    op.Attr("layout").AttrType(OPTIONAL).String("BNSD");
}

// The tiling function type spelled out: the alias for it moved between CANN versions
// (gert::OpImplKernelRegistry in 8.x, gert::OpImplRegisterV2 in 9.x).
using TilingFunction = ge::graphStatus (*)(gert::TilingContext*);

void AICoreConfigs(OpDef& op, TilingFunction tiling)
{
    OpAICoreConfig config;
    config.DynamicCompileStaticFlag(true)
        .DynamicFormatFlag(false)
        .DynamicRankSupportFlag(true)
        .DynamicShapeSupportFlag(true)
        .NeedCheckSupportFlag(false)
        .PrecisionReduceFlag(false);
    op.AICore().SetTiling(tiling);
    op.AICore().AddConfig("ascend910b", config);
    op.AICore().AddConfig("ascend910_93", config);
}

}  // namespace

class FlashCannAttention : public OpDef {
public:
    explicit FlashCannAttention(const char* name) : OpDef(name)
    {
        DeclareInput(this->Input("query"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("key"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("value"), REQUIRED, kInputTypes);
        DeclareInput(this->Input("key_padding_mask"), OPTIONAL, kBoolTypes);
        DeclareOutput(this->Output("out"), kInputTypes);
        DeclareOutput(this->Output("softmax_lse"), kFloatTypes);
        Attributes(*this);
        this->SetInferShape(ge::FlashCannAttentionInferShape)
            .SetInferDataType(ge::FlashCannAttentionInferDataType);
        AICoreConfigs(*this, optiling::FlashCannAttentionTiling);
    }
};

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
        DeclareOutput(this->Output("grad_query"), kInputTypes);
        DeclareOutput(this->Output("grad_key"), kInputTypes);
        DeclareOutput(this->Output("grad_value"), kInputTypes);
        Attributes(*this);
        this->SetInferShape(ge::FlashCannAttentionGradInferShape)
            .SetInferDataType(ge::FlashCannAttentionGradInferDataType);
        // No AI Core configuration: there is no Ascend C backward kernel yet, and CANN
        // builds a kernel for every op configured for an AI Core. The prototype lets graphs
        // name the op; running it on an NPU is not possible until the kernel exists.
    }
};

OP_ADD(FlashCannAttention);
OP_ADD(FlashCannAttentionGrad);

}  // namespace ops
