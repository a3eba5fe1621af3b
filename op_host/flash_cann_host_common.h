// What the CANN shells of the forward (flash_cann_attention.cpp) and backward
// (flash_cann_attention_grad.cpp) ops share: the error idiom, the problem read from the
// tiling context, the platform read from platform_ascendc, writing a plan into the
// context, and the OpDef building blocks. Only CANN's host API and the planner.
#ifndef FLASH_CANN_HOST_COMMON_H
#define FLASH_CANN_HOST_COMMON_H

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "register/op_def_registry.h"
#include "tiling/platform/platform_ascendc.h"

#include "flash_cann_cann_compat.h"
#include "flash_cann_contract.h"
#include "planner.h"

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

namespace flash_cann {
struct GradPlanRequest;
}

// The planner requests the TilingFuncs build from a node, before planning (separate so
// that tests/cann_host's driver can check what reaches the planner, features included).
namespace optiling {
ge::graphStatus FlashCannAttentionRequest(gert::TilingContext* context,
                                          flash_cann::PlanRequest& request);
ge::graphStatus FlashCannAttentionGradRequest(gert::TilingContext* context,
                                              flash_cann::GradPlanRequest& request);
}  // namespace optiling

namespace flash_cann_host {

// Attribute indices both ops share, in spec order (generated; the backward appends its
// own).
using flash_cann::contract::fwd::attr::kCausal;
using flash_cann::contract::fwd::attr::kLayout;
using flash_cann::contract::fwd::attr::kScale;
static_assert(size_t{flash_cann::contract::bwd::attr::kScale} == size_t{kScale} &&
                  size_t{flash_cann::contract::bwd::attr::kCausal} == size_t{kCausal} &&
                  size_t{flash_cann::contract::bwd::attr::kLayout} == size_t{kLayout},
              "both ops declare scale, causal, layout first");
constexpr size_t kRank = 4;
constexpr size_t kPackedRank = 3;  // layout TND: (tokens, heads, head_dim)

// A layout attribute's value: its index among the spec's layouts (= flash_cann::Layout,
// which the planner checks against the generated header).
inline bool ParseLayout(const char* text, flash_cann::Layout& layout)
{
    for (uint32_t i = 0; text != nullptr && i < flash_cann::contract::kLayoutCount; ++i) {
        if (std::strcmp(text, flash_cann::contract::kLayoutNames[i]) == 0) {
            layout = static_cast<flash_cann::Layout>(i);
            return true;
        }
    }
    return false;
}

// "(2, 8)", "(8,)": a shape as error messages show it.
inline std::string ShapeText(const gert::Shape& shape)
{
    std::string text = "(";
    for (size_t i = 0; i < shape.GetDimNum(); ++i) {
        text += (i ? ", " : "") + std::to_string(shape.GetDim(i));
    }
    return text + (shape.GetDimNum() == 1 ? ",)" : ")");
}

// (batch, heads, seqlen, head_dim) positions of a dense layout; TND's (tokens, heads,
// head_dim) has no batch axis (its rows are the tokens).
struct Axes {
    size_t batch, heads, seqlen, headDim;
};

inline Axes AxesOf(flash_cann::Layout layout)
{
    switch (layout) {
        case flash_cann::Layout::BNSD: return Axes{0, 1, 2, 3};
        case flash_cann::Layout::TND: return Axes{0, 1, 0, 2};
        default: return Axes{0, 2, 1, 3};
    }
}

inline size_t RankOf(flash_cann::Layout layout)
{
    return layout == flash_cann::Layout::TND ? kPackedRank : kRank;
}

// Where a node keeps the packed sequences' arguments (layout TND): the IR indices of the
// optional cu_seqlens_q/k inputs and the indices of the max_seqlen_q/k attributes.
struct PackedIndices {
    size_t cuSeqlensQ, cuSeqlensK;  // optional inputs
    size_t maxSeqlenQ, maxSeqlenK;  // attributes
};

// Layout TND: batch = cu_seqlens' length - 1 (a shape, never their values: the kernel
// reads the offsets on the device), seqlen_q/k = max_seqlen_q/k, tokens from the query
// and key. Other layouts must not carry them (flash-attn's contract, checks.py's).
inline ge::graphStatus ReadPacking(gert::TilingContext* context, const PackedIndices& at,
                                   const gert::Shape& q, const gert::Shape& k,
                                   flash_cann::PlanRequest& request)
{
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    const int64_t* maxQ = attrs->GetInt(at.maxSeqlenQ);
    const int64_t* maxK = attrs->GetInt(at.maxSeqlenK);
    FLASH_CANN_CHECK(context, maxQ != nullptr && maxK != nullptr, "max_seqlen_q/max_seqlen_k missing");
    const gert::StorageShape* cuQ = context->GetOptionalInputShape(at.cuSeqlensQ);
    const gert::StorageShape* cuK = context->GetOptionalInputShape(at.cuSeqlensK);
    if (request.layout != flash_cann::Layout::TND) {
        FLASH_CANN_CHECK(context, cuQ == nullptr && cuK == nullptr && *maxQ == 0 && *maxK == 0,
                         "cu_seqlens_q/k and max_seqlen_q/k are only taken with layout TND");
        return ge::GRAPH_SUCCESS;
    }
    FLASH_CANN_CHECK(context, cuQ != nullptr && cuK != nullptr,
                     "layout TND needs cu_seqlens_q and cu_seqlens_k (int32, batch + 1)");
    const gert::Shape& sq = cuQ->GetStorageShape();
    const gert::Shape& sk = cuK->GetStorageShape();
    FLASH_CANN_CHECK(context, sq.GetDimNum() == 1 && sq.GetDim(0) >= 2,
                     "cu_seqlens_q must have shape (batch + 1,) with batch >= 1 (got %s)",
                     ShapeText(sq).c_str());
    FLASH_CANN_CHECK(context, sk.GetDimNum() == 1 && sk.GetDim(0) == sq.GetDim(0),
                     "cu_seqlens_k must have the shape of cu_seqlens_q, %s (got %s)",
                     ShapeText(sq).c_str(), ShapeText(sk).c_str());
    FLASH_CANN_CHECK(context, *maxQ >= 1 && *maxK >= 1,
                     "max_seqlen_q and max_seqlen_k must be >= 1 with layout TND (got %lld, %lld)",
                     static_cast<long long>(*maxQ), static_cast<long long>(*maxK));
    request.batch = sq.GetDim(0) - 1;
    request.seqlenQ = *maxQ;
    request.seqlenK = *maxK;
    request.tokensQ = q.GetDim(0);
    request.tokensK = k.GetDim(0);
    return ge::GRAPH_SUCCESS;
}

// The query's dtype as the planner's DType: float16 or bfloat16, anything else refused by
// name (every op's kernels are instantiated for those two).
inline ge::graphStatus ReadQueryDType(gert::TilingContext* context, size_t queryIndex,
                                      flash_cann::DType& dtype)
{
    const gert::CompileTimeTensorDesc* queryDesc = context->GetInputDesc(queryIndex);
    FLASH_CANN_CHECK(context, queryDesc != nullptr, "query description missing");
    const ge::DataType type = queryDesc->GetDataType();
    FLASH_CANN_CHECK(context, type == ge::DT_FLOAT16 || type == ge::DT_BF16,
                     "query dtype must be float16 or bfloat16");
    dtype = type == ge::DT_BF16 ? flash_cann::DType::BFloat16 : flash_cann::DType::Float16;
    return ge::GRAPH_SUCCESS;
}

// The attention problem of a node: attributes scale/causal/layout, sizes from the query
// and key inputs (instance indices) -- with layout TND, from cu_seqlens' shape and
// max_seqlen_q/k -- dtype from the query. The key padding mask, whose presence the
// caller knows, is left to it.
inline ge::graphStatus ReadProblem(gert::TilingContext* context, size_t queryIndex,
                                   size_t keyIndex, const PackedIndices& packing,
                                   flash_cann::PlanRequest& request)
{
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    FLASH_CANN_CHECK(context, attrs != nullptr, "no attributes");
    const float* scale = attrs->GetFloat(kScale);
    const bool* causal = attrs->GetBool(kCausal);
    const char* layoutText = attrs->GetStr(kLayout);
    FLASH_CANN_CHECK(context, scale != nullptr && causal != nullptr, "scale/causal missing");
    FLASH_CANN_CHECK(context, ParseLayout(layoutText, request.layout),
                     "layout must be BNSD, BSND or TND (got %s)", layoutText ? layoutText : "null");
    const gert::StorageShape* query = context->GetInputShape(queryIndex);
    const gert::StorageShape* key = context->GetInputShape(keyIndex);
    FLASH_CANN_CHECK(context, query != nullptr && key != nullptr, "query/key shape missing");
    const gert::Shape& q = query->GetStorageShape();
    const gert::Shape& k = key->GetStorageShape();
    const size_t rank = RankOf(request.layout);
    FLASH_CANN_CHECK(context, q.GetDimNum() == rank && k.GetDimNum() == rank,
                     "query and key must be %zu-D with layout %s (got %zu-D and %zu-D)", rank,
                     layoutText, q.GetDimNum(), k.GetDimNum());
    const Axes axes = AxesOf(request.layout);
    request.batch = q.GetDim(axes.batch);
    request.headsQ = q.GetDim(axes.heads);
    request.seqlenQ = q.GetDim(axes.seqlen);
    request.headDim = q.GetDim(axes.headDim);
    request.headsKv = k.GetDim(axes.heads);
    request.seqlenK = k.GetDim(axes.seqlen);
    FLASH_CANN_CHECK(context, (rank == kPackedRank || k.GetDim(axes.batch) == request.batch) &&
                                  k.GetDim(axes.headDim) == request.headDim,
                     "key must match query in batch and head_dim");
    if (ReadPacking(context, packing, q, k, request) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    if (ReadQueryDType(context, queryIndex, request.dtype) != ge::GRAPH_SUCCESS) {
        return ge::GRAPH_FAILED;
    }
    request.causal = *causal;
    request.scale = *scale;
    return ge::GRAPH_SUCCESS;
}

// Where a node keeps the arguments of the features (flash_cann_variant.h): the IR indices
// of its optional inputs and the indices of its attributes (generated, per op);
// kNoFeature for an argument the op does not have (fwd_kvcache: no dropout).
constexpr size_t kNoFeature = static_cast<size_t>(-1);
struct FeatureIndices {
    size_t alibiSlopes, rngState, sinks;                // optional inputs
    size_t windowLeft, windowRight, softcap, dropoutP;  // attributes
};

// The features of a node into request.variant, after ReadProblem (it needs the sizes and
// causal). The window is normalised as contract/variant.py's window_bounds (flash-attn
// 2.8) does, because a graph (torchair) passes the attributes as the user wrote them:
// a bound >= seqlen_k is unbounded, and causal is the right bound. What the planner
// checks (softcap, dropout_p ranges) is left to it; the tensors' shapes, which it never
// sees, are checked here. The tensors stay in GM: the kernel reads the slopes, the
// (seed, offset) pair and the sink logits, never the host (a call stays capturable).
inline ge::graphStatus ReadVariant(gert::TilingContext* context, const FeatureIndices& at,
                                   flash_cann::PlanRequest& request)
{
    const gert::RuntimeAttrs* attrs = context->GetAttrs();
    const int64_t* left = attrs->GetInt(at.windowLeft);
    const int64_t* right = attrs->GetInt(at.windowRight);
    const float* softcap = attrs->GetFloat(at.softcap);
    const float noDropout = 0.0f;
    const float* dropoutP = at.dropoutP == kNoFeature ? &noDropout : attrs->GetFloat(at.dropoutP);
    FLASH_CANN_CHECK(context, left != nullptr && right != nullptr && softcap != nullptr &&
                                  dropoutP != nullptr,
                     "window_left/window_right/softcap/dropout_p missing");
    // Before the normalisation, which would hide a bad right bound behind causal.
    FLASH_CANN_CHECK(context, *left >= -1 && *right >= -1,
                     "window_left and window_right must be >= -1 (-1: unbounded) (got %lld, %lld)",
                     static_cast<long long>(*left), static_cast<long long>(*right));
    const int64_t windowLeft = *left >= request.seqlenK ? -1 : *left;
    const int64_t windowRight = request.causal || *right >= request.seqlenK ? -1 : *right;

    flash_cann::Alibi alibi = flash_cann::Alibi::kNone;
    if (const gert::StorageShape* slopes = context->GetOptionalInputShape(at.alibiSlopes)) {
        const gert::Shape& s = slopes->GetStorageShape();
        const bool perHead = s.GetDimNum() == 1 && s.GetDim(0) == request.headsQ;
        const bool perBatchHead = s.GetDimNum() == 2 && s.GetDim(0) == request.batch &&
                                  s.GetDim(1) == request.headsQ;
        FLASH_CANN_CHECK(context, perHead || perBatchHead,
                         "alibi_slopes must have shape (heads_q,) = (%lld,) or (batch, "
                         "heads_q) = (%lld, %lld) (got %s)",
                         static_cast<long long>(request.headsQ),
                         static_cast<long long>(request.batch),
                         static_cast<long long>(request.headsQ), ShapeText(s).c_str());
        alibi = perHead ? flash_cann::Alibi::kPerHead : flash_cann::Alibi::kPerBatchHead;
    }
    const gert::StorageShape* rng =
        at.rngState == kNoFeature ? nullptr : context->GetOptionalInputShape(at.rngState);
    FLASH_CANN_CHECK(context, rng == nullptr || (rng->GetStorageShape().GetDimNum() == 1 &&
                                                 rng->GetStorageShape().GetDim(0) == 2),
                     "rng_state must have shape (2,): (seed, offset) (got %s)",
                     ShapeText(rng->GetStorageShape()).c_str());
    FLASH_CANN_CHECK(context, rng != nullptr || !(*dropoutP > 0.0f),
                     "dropout_p %g > 0 needs the rng_state input (int64 (seed, offset))",
                     static_cast<double>(*dropoutP));
    const gert::StorageShape* sinks = context->GetOptionalInputShape(at.sinks);
    FLASH_CANN_CHECK(context, sinks == nullptr ||
                                  (sinks->GetStorageShape().GetDimNum() == 1 &&
                                   sinks->GetStorageShape().GetDim(0) == request.headsQ),
                     "sinks must have shape (heads_q,) = (%lld,) (got %s)",
                     static_cast<long long>(request.headsQ),
                     ShapeText(sinks->GetStorageShape()).c_str());
    request.variant = flash_cann::MakeVariant(windowLeft, windowRight, *softcap, *dropoutP,
                                              alibi, sinks != nullptr);
    return ge::GRAPH_SUCCESS;
}

// fp16_scores (a Bool attribute of the forward and backward ops) into the request; the
// planner refuses it for inputs other than float16.
inline ge::graphStatus ReadScores(gert::TilingContext* context, size_t index,
                                  flash_cann::PlanRequest& request)
{
    const bool* fp16Scores = context->GetAttrs()->GetBool(index);
    FLASH_CANN_CHECK(context, fp16Scores != nullptr, "fp16_scores missing");
    request.fp16Scores = *fp16Scores;
    return ge::GRAPH_SUCCESS;
}

// The platform the kernel runs on, as the platform API reports it.
inline ge::graphStatus ReadPlatform(gert::TilingContext* context, flash_cann::Platform& platform)
{
    const auto ascendc = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
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
    return ge::GRAPH_SUCCESS;
}

// Saves a plan into the context: tiling data, block dim, tiling key, schedule mode (batch
// for a kernel that synchronises across blocks) and the workspace, whose user part the
// kernel finds after the system workspace (GetUserWorkspace).
template <typename Tiling>
ge::graphStatus WritePlan(gert::TilingContext* context, const Tiling& tiling, uint32_t blockDim,
                          uint64_t tilingKey, uint32_t scheduleMode, uint64_t userWorkspaceBytes)
{
    gert::TilingData* raw = context->GetRawTilingData();
    FLASH_CANN_CHECK(context, raw != nullptr && raw->GetCapacity() >= sizeof(tiling),
                     "tiling buffer holds %zu bytes, the plan needs %zu",
                     raw ? raw->GetCapacity() : size_t{0}, sizeof(tiling));
    std::memcpy(raw->GetData(), &tiling, sizeof(tiling));
    raw->SetDataSize(sizeof(tiling));
    FLASH_CANN_CHECK(context, flash_cann::cann::SetNumBlocks(context, blockDim) == ge::GRAPH_SUCCESS,
                     "%s(%u) failed", flash_cann::cann::kNumBlocksApi, blockDim);
    context->SetTilingKey(tilingKey);
    FLASH_CANN_CHECK(context, context->SetScheduleMode(scheduleMode) == ge::GRAPH_SUCCESS,
                     "SetScheduleMode(%u) failed", scheduleMode);
    size_t* workspace = context->GetWorkspaceSizes(1);
    FLASH_CANN_CHECK(context, workspace != nullptr, "no workspace slot");
    const auto ascendc = platform_ascendc::PlatformAscendC(context->GetPlatformInfo());
    workspace[0] = userWorkspaceBytes + ascendc.GetLibApiWorkSpaceSize();
    return ge::GRAPH_SUCCESS;
}

// OpDef building blocks. Both ops run on every 910B part and on 910_93 (A3). The dtype
// lists pair entry by entry: the i-th entry of every tensor forms one supported
// combination.
inline const std::vector<ge::DataType> kInputTypes = {ge::DT_FLOAT16, ge::DT_BF16};
inline const std::vector<ge::DataType> kFloatTypes = {ge::DT_FLOAT, ge::DT_FLOAT};
inline const std::vector<ge::DataType> kBoolTypes = {ge::DT_BOOL, ge::DT_BOOL};
inline const std::vector<ge::DataType> kInt64Types = {ge::DT_INT64, ge::DT_INT64};
inline const std::vector<ge::DataType> kInt32Types = {ge::DT_INT32, ge::DT_INT32};
inline const std::vector<ge::Format> kFormats = {ge::FORMAT_ND, ge::FORMAT_ND};

inline void DeclareInput(ops::OpParamDef& param, ops::Option presence,
                         const std::vector<ge::DataType>& types)
{
    // AutoContiguous: the generated aclnn makes strided inputs contiguous; the kernel
    // reads the dense layout the `layout` attribute names.
    param.ParamType(presence).DataType(types).Format(kFormats).AutoContiguous();
}

inline void DeclareOutput(ops::OpParamDef& param, const std::vector<ge::DataType>& types)
{
    param.ParamType(ops::REQUIRED).DataType(types).Format(kFormats);
}

// The attributes both ops start with, in spec order.
inline void SharedAttributes(ops::OpDef& op)
{
    op.Attr("scale").AttrType(ops::REQUIRED).Float();
    op.Attr("causal").AttrType(ops::OPTIONAL).Bool(false);
    op.Attr("layout").AttrType(ops::OPTIONAL).String("BNSD");
}

// The features' optional inputs, in spec order (after each op's own optional inputs).
inline void FeatureInputs(ops::OpDef& op)
{
    // Layout TND: (batch + 1,) offsets of the packed sequences, read by the kernel.
    DeclareInput(op.Input("cu_seqlens_q"), ops::OPTIONAL, kInt32Types);
    DeclareInput(op.Input("cu_seqlens_k"), ops::OPTIONAL, kInt32Types);
    // (heads_q,) or (batch, heads_q): the bias is generated in the kernel.
    DeclareInput(op.Input("alibi_slopes"), ops::OPTIONAL, kFloatTypes);
    // (seed, offset) of the Philox dropout draw, read by the kernel.
    DeclareInput(op.Input("rng_state"), ops::OPTIONAL, kInt64Types);
    // (heads_q,): one sink logit per query head, joining each row's softmax denominator.
    DeclareInput(op.Input("sinks"), ops::OPTIONAL, kFloatTypes);
}

// The features' attributes, in spec order (each op's last).
inline void FeatureAttributes(ops::OpDef& op)
{
    // Layout TND: bounds of the sequences' lengths (0: not packed).
    op.Attr("max_seqlen_q").AttrType(ops::OPTIONAL).Int(0);
    op.Attr("max_seqlen_k").AttrType(ops::OPTIONAL).Int(0);
    // -1: unbounded on that side.
    op.Attr("window_left").AttrType(ops::OPTIONAL).Int(-1);
    op.Attr("window_right").AttrType(ops::OPTIONAL).Int(-1);
    op.Attr("softcap").AttrType(ops::OPTIONAL).Float(0.0f);
    op.Attr("dropout_p").AttrType(ops::OPTIONAL).Float(0.0f);
}

// Both ops' last attribute: permit fp16 scores (the spec's fp16_scores; the grad tiling
// key's fp16-score digit; the forward plans as without it).
inline void ScoresAttribute(ops::OpDef& op)
{
    op.Attr("fp16_scores").AttrType(ops::OPTIONAL).Bool(false);
}

// The tiling function type spelled out: the alias for it moved between CANN versions
// (gert::OpImplKernelRegistry in 8.x, gert::OpImplRegisterV2 in 9.x).
using TilingFunction = ge::graphStatus (*)(gert::TilingContext*);

// kernelFile: the op_kernel/ file (without .cpp) when CANN's OpType -> file name rule
// would not find it (FlashCannAttentionKVCache: the rule's treatment of "KV" is not
// documented, so the decode op names its file).
inline void AICoreConfigs(ops::OpDef& op, TilingFunction tiling, const char* kernelFile = nullptr)
{
    ops::OpAICoreConfig config;
    config.DynamicCompileStaticFlag(true)
        .DynamicFormatFlag(false)
        .DynamicRankSupportFlag(true)
        .DynamicShapeSupportFlag(true)
        .NeedCheckSupportFlag(false)
        .PrecisionReduceFlag(false);
    if (kernelFile != nullptr) {
        config.ExtendCfgInfo("opFile.value", kernelFile);
    }
    op.AICore().SetTiling(tiling);
    op.AICore().AddConfig("ascend910b", config);
    op.AICore().AddConfig("ascend910_93", config);
}

}  // namespace flash_cann_host

#endif
