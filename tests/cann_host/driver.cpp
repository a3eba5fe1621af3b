// TEST-ONLY driver of op_host/flash_cann_attention{,_grad,_kvcache}.cpp compiled against the
// recording stand-in (include/cann_host_stub.h). Commands print JSON for
// tests/test_op_host.py:
//   opdefs
//   cann-version   (the CANN release the stand-in presents, the op_host API chosen for it)
//   tiling <OpType> <layout> <fp16|bf16|fp32> <causal 0|1> <mask 0|1> <scale> q0 q1 q2 q3 k0 k1 k2 k3 [aic]
//               ([aic]: AI cores, or AIC:AIV to set the vector cores too)
//   grad-tiling <layout> <fp16|bf16|fp32> <causal 0|1> <mask 0|1> <deterministic 0|1>
//               <grad_lse 0|1> <scale> q0 q1 q2 q3 k0 k1 k2 k3 [aic [input-to-misshape]]
//   infer  <OpType> <layout> <fp16|bf16|fp32> q0 q1 q2 q3 k0 k1 k2 k3
//   kvcache-tiling <BSND|TND> <fp16|bf16|fp32> <scale> q0 q1 q2 q3 c0 c1 c2 c3
//               (FlashCannAttentionKVCache: q with "_" for TND's missing dimension, the
//               caches' shape; inputs cache_seqlens, cache_batch_idx, block_table,
//               cache_leftpad, cu_seqlens_q and attributes max_seqlen_q, num_splits as
//               NAME=VALUE)
// Any argument NAME=VALUE sets a feature argument of the node instead (attributes
// window_left, window_right (int), softcap, dropout_p (float); optional inputs
// alibi_slopes, rng_state, sinks with VALUE its shape, e.g. 2x8); the tiling commands print the
// planner request the shell built ("request", null when it failed) beside the plan.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "decode_planner.h"
#include "flash_cann_cann_compat.h"
#include "flash_cann_grad_tiling.h"
#include "flash_cann_tiling.h"
#include "grad_planner.h"
#include "register/op_def_registry.h"

namespace optiling {
ge::graphStatus FlashCannAttentionRequest(gert::TilingContext*, flash_cann::PlanRequest&);
ge::graphStatus FlashCannAttentionGradRequest(gert::TilingContext*, flash_cann::GradPlanRequest&);
ge::graphStatus FlashCannAttentionKVCacheRequest(gert::TilingContext*, flash_cann::DecodeRequest&);
}  // namespace optiling

namespace {

// The NAME=VALUE arguments of the command line.
std::map<std::string, std::string> g_features;

std::string Feature(const char* name, const char* otherwise)
{
    const auto it = g_features.find(name);
    return it == g_features.end() ? otherwise : it->second;
}

const char* TypeName(ge::DataType t)
{
    switch (t) {
        case ge::DT_FLOAT: return "float32";
        case ge::DT_FLOAT16: return "float16";
        case ge::DT_BF16: return "bfloat16";
        case ge::DT_BOOL: return "bool";
        case ge::DT_INT64: return "int64";
        case ge::DT_INT32: return "int32";
        default: return "undefined";
    }
}

const char* OptionName(ops::Option o)
{
    return o == ops::REQUIRED ? "required" : o == ops::OPTIONAL ? "optional" : "other";
}

void PrintParams(const std::vector<ops::OpParamDef>& params)
{
    std::printf("[");
    for (size_t i = 0; i < params.size(); ++i) {
        const ops::OpParamDef& p = params[i];
        std::printf("%s{\"name\":\"%s\",\"presence\":\"%s\",\"auto_contiguous\":%s,\"dtypes\":[",
                    i ? "," : "", p.name.c_str(), OptionName(p.option),
                    p.autoContiguous ? "true" : "false");
        for (size_t j = 0; j < p.types.size(); ++j) {
            std::printf("%s\"%s\"", j ? "," : "", TypeName(p.types[j]));
        }
        std::printf("],\"formats\":%zu}", p.formats.size());
    }
    std::printf("]");
}

int OpDefs()
{
    std::printf("[");
    bool first = true;
    for (const auto& [type, op] : ops::Registry()) {
        std::printf("%s{\"type\":\"%s\",\"inputs\":", first ? "" : ",", type.c_str());
        first = false;
        PrintParams(op->inputs);
        std::printf(",\"outputs\":");
        PrintParams(op->outputs);
        std::printf(",\"attrs\":[");
        for (size_t i = 0; i < op->attrs.size(); ++i) {
            const ops::OpAttrDef& a = op->attrs[i];
            std::printf("%s{\"name\":\"%s\",\"type\":\"%s\",\"presence\":\"%s\",\"default\":%s%s%s}",
                        i ? "," : "", a.name.c_str(), a.type.c_str(), OptionName(a.option),
                        a.hasDefault ? "\"" : "", a.hasDefault ? a.def.c_str() : "null",
                        a.hasDefault ? "\"" : "");
        }
        std::printf("],\"socs\":[");
        for (size_t i = 0; i < op->aicore.socs.size(); ++i) {
            std::printf("%s\"%s\"", i ? "," : "", op->aicore.socs[i].c_str());
        }
        std::printf("],\"has_tiling\":%s,\"has_infer_shape\":%s,\"has_infer_dtype\":%s}",
                    op->aicore.tiling ? "true" : "false", op->inferShape ? "true" : "false",
                    op->inferDataType ? "true" : "false");
    }
    std::printf("]\n");
    return 0;
}

// The inputs' dtype argument: bf16, fp32 (which the shells refuse), else fp16.
ge::DataType DTypeOf(const char* name)
{
    return std::strcmp(name, "bf16") == 0   ? ge::DT_BF16
           : std::strcmp(name, "fp32") == 0 ? ge::DT_FLOAT
                                            : ge::DT_FLOAT16;
}

// Four dimension arguments; "_" leaves one out (layout TND's tensors are 3-D).
gert::Shape ShapeOf(char** dims)
{
    gert::Shape shape;
    for (int i = 0; i < 4; ++i) {
        if (std::strcmp(dims[i], "_") != 0) {
            shape.AppendDim(std::atoll(dims[i]));
        }
    }
    return shape;
}

void AddInput(gert::StubNode& node, const gert::Shape& shape, ge::DataType dtype)
{
    node.inputs.push_back(std::make_unique<gert::StorageShape>(gert::StorageShape{shape}));
    node.inputDescs.push_back({dtype});
}

void AddAbsentInput(gert::StubNode& node)
{
    node.inputs.push_back(nullptr);
    node.inputDescs.push_back({ge::DT_UNDEFINED});
}

// A NAME=VALUE input's dimensions, "2x8" -> (2, 8).
gert::Shape DimsOf(const std::string& dims)
{
    gert::Shape shape;
    for (const char* p = dims.c_str(); *p != '\0';) {
        char* end = nullptr;
        shape.AppendDim(std::strtoll(p, &end, 10));
        p = *end == 'x' ? end + 1 : end;
    }
    return shape;
}

// The optional int32 input NAME, from its NAME=VALUE argument, else absent.
void AddOptionalInput(gert::StubNode& node, const char* name, ge::DataType dtype)
{
    const std::string dims = Feature(name, "");
    if (dims.empty()) {
        AddAbsentInput(node);
    } else {
        AddInput(node, DimsOf(dims), dtype);
    }
}

// The features' optional inputs (cu_seqlens_q/k, alibi_slopes, rng_state, sinks) and
// attributes (max_seqlen_q/k, window_left, window_right, softcap, dropout_p), in spec
// order, from the NAME=VALUE arguments (an input's value: its dimensions, "2x8"); an
// attribute not given has the OpDef's default, as CANN fills it in; then fp16_scores.
void AddFeatures(gert::StubNode& node)
{
    for (const auto& [name, dtype] : {std::pair{"cu_seqlens_q", ge::DT_INT32},
                                      {"cu_seqlens_k", ge::DT_INT32},
                                      {"alibi_slopes", ge::DT_FLOAT},
                                      {"rng_state", ge::DT_INT64}, {"sinks", ge::DT_FLOAT}}) {
        AddOptionalInput(node, name, dtype);
    }
    using V = gert::RuntimeAttrs::Value;
    for (const char* name : {"max_seqlen_q", "max_seqlen_k"}) {
        node.attrs.values.push_back(V{V::kInt, 0, false, "", std::atoll(Feature(name, "0").c_str())});
    }
    for (const char* name : {"window_left", "window_right"}) {
        const int64_t value = std::atoll(Feature(name, "-1").c_str());
        node.attrs.values.push_back(V{V::kInt, 0, false, "", value});
    }
    for (const char* name : {"softcap", "dropout_p"}) {
        node.attrs.values.push_back(V{V::kFloat, std::strtof(Feature(name, "0").c_str(), nullptr),
                                      false, "", 0});
    }
    // fp16_scores, both ops' last attribute (no feature's).
    node.attrs.values.push_back(V{V::kBool, 0, Feature("fp16_scores", "0") == "1", "", 0});
}

// What the shell passed to the planner: the problem and its features.
void PrintRequest(const flash_cann::PlanRequest& r)
{
    const flash_cann::VariantTiling& v = r.variant;
    std::printf("{\"batch\":%lld,\"heads_q\":%lld,\"seqlen_q\":%lld,\"seqlen_k\":%lld,"
                "\"tokens_q\":%lld,\"tokens_k\":%lld,\"layout\":%u,\"causal\":%s,"
                "\"window_left\":%lld,\"window_right\":%lld,\"softcap\":%.9g,"
                "\"dropout_p\":%.9g,\"dropout_threshold\":%u,\"alibi\":%u,\"sinks\":%u}",
                static_cast<long long>(r.batch), static_cast<long long>(r.headsQ),
                static_cast<long long>(r.seqlenQ), static_cast<long long>(r.seqlenK),
                static_cast<long long>(r.tokensQ), static_cast<long long>(r.tokensK),
                static_cast<uint32_t>(r.layout), r.causal ? "true" : "false",
                static_cast<long long>(v.windowLeft), static_cast<long long>(v.windowRight),
                static_cast<double>(v.softcap), static_cast<double>(v.dropoutP),
                v.dropoutThreshold, v.alibi, v.sinks);
}

// A forward node: query, key, value (shaped like key), optional mask (batch, seqlen_k).
gert::StubNode Node(const char* type, const char* layout, const char* dtype, bool causal,
                    bool mask, float scale, char** q, char** k)
{
    gert::StubNode node;
    node.type = type;
    const ge::DataType dt = DTypeOf(dtype);
    const gert::Shape qs = ShapeOf(q);
    const gert::Shape ks = ShapeOf(k);
    for (const gert::Shape& s : {qs, ks, ks}) {
        AddInput(node, s, dt);
    }
    if (mask) {
        const bool bnsd = std::strcmp(layout, "BNSD") == 0;
        gert::Shape ms;
        ms.AppendDim(ks.GetDim(0)).AppendDim(ks.GetDim(bnsd ? 2 : 1));
        AddInput(node, ms, ge::DT_BOOL);
    } else {
        AddAbsentInput(node);
    }
    using V = gert::RuntimeAttrs::Value;
    node.attrs.values = {V{V::kFloat, scale, false, ""}, V{V::kBool, 0, causal, ""},
                         V{V::kStr, 0, false, layout}};
    AddFeatures(node);
    node.outputs.resize(2);
    node.outputTypes.resize(2, ge::DT_UNDEFINED);
    return node;
}

// A backward node: grad_out, query, key, value, out, softmax_lse, optional mask and
// grad_softmax_lse, with the spec's shapes; `misshape` names an input whose last
// dimension is made one larger (to test the shell's operand checks).
gert::StubNode GradNode(const char* layout, const char* dtype, bool causal, bool mask,
                        bool deterministic, bool gradLse, float scale, char** q, char** k,
                        const std::string& misshape)
{
    gert::StubNode node;
    node.type = "FlashCannAttentionGrad";
    const ge::DataType dt = DTypeOf(dtype);
    const bool bnsd = std::strcmp(layout, "BNSD") == 0;
    const gert::Shape qs = ShapeOf(q);
    const gert::Shape ks = ShapeOf(k);
    gert::Shape rows;
    if (std::strcmp(layout, "TND") == 0) {  // (heads_q, tokens_q)
        rows.AppendDim(qs.GetDim(1)).AppendDim(qs.GetDim(0));
    } else {
        rows.AppendDim(qs.GetDim(0)).AppendDim(qs.GetDim(bnsd ? 1 : 2)).AppendDim(qs.GetDim(bnsd ? 2 : 1));
    }
    gert::Shape keys;
    keys.AppendDim(ks.GetDim(0)).AppendDim(ks.GetDim(bnsd ? 2 : 1));
    auto shape = [&](const char* name, gert::Shape s) {
        if (misshape == name) {
            s.SetDim(s.GetDimNum() - 1, s.GetDim(s.GetDimNum() - 1) + 1);
        }
        return s;
    };
    AddInput(node, shape("grad_out", qs), dt);
    AddInput(node, qs, dt);
    AddInput(node, ks, dt);
    AddInput(node, shape("value", ks), dt);
    AddInput(node, shape("out", qs), dt);
    AddInput(node, shape("softmax_lse", rows), ge::DT_FLOAT);
    if (mask) {
        AddInput(node, shape("key_padding_mask", keys), ge::DT_BOOL);
    } else {
        AddAbsentInput(node);
    }
    if (gradLse) {
        AddInput(node, shape("grad_softmax_lse", rows), ge::DT_FLOAT);
    } else {
        AddAbsentInput(node);
    }
    using V = gert::RuntimeAttrs::Value;
    node.attrs.values = {V{V::kFloat, scale, false, ""}, V{V::kBool, 0, causal, ""},
                         V{V::kStr, 0, false, layout}, V{V::kBool, 0, deterministic, ""}};
    AddFeatures(node);
    node.outputs.resize(4);
    node.outputTypes.resize(4, ge::DT_UNDEFINED);
    return node;
}

// The [aic] argument: AI cores, each with two vector cores, or "AIC:AIV" for a platform
// that reports another count of vector cores.
void SetCores(fe::PlatFormInfos& platform, const char* text)
{
    platform.aic = static_cast<uint32_t>(std::atoi(text));
    const char* colon = std::strchr(text, ':');
    platform.aiv = colon ? static_cast<uint32_t>(std::atoi(colon + 1)) : 2 * platform.aic;
}

int GradTiling(int argc, char** argv)
{
    if (argc < 17) {
        std::fprintf(stderr, "usage: grad-tiling layout dtype causal mask deterministic grad_lse "
                             "scale q0..q3 k0..k3 [aic [input-to-misshape]]\n");
        return 2;
    }
    gert::StubNode node = GradNode(argv[2], argv[3], std::atoi(argv[4]) != 0,
                                   std::atoi(argv[5]) != 0, std::atoi(argv[6]) != 0,
                                   std::atoi(argv[7]) != 0, std::strtof(argv[8], nullptr),
                                   argv + 9, argv + 13, argc > 18 ? argv[18] : "");
    fe::PlatFormInfos platform;
    if (argc > 17 && std::atoi(argv[17]) > 0) {
        SetCores(platform, argv[17]);
    }
    const auto& op = ops::Registry().at(node.type);
    gert::TilingContext requestContext(node, platform, 2048);
    flash_cann::GradPlanRequest request;
    std::printf("{\"request\":");
    if (optiling::FlashCannAttentionGradRequest(&requestContext, request) == ge::GRAPH_SUCCESS) {
        PrintRequest(request.problem);
    } else {
        std::printf("null");
    }
    gert::TilingContext context(node, platform, 2048);
    if (op->aicore.tiling(&context) != ge::GRAPH_SUCCESS) {
        std::printf(",\"status\":\"failed\"}\n");
        return 0;
    }
    flash_cann::GradTilingData t;
    std::memcpy(&t, context.GetRawTilingData()->GetData(), sizeof(t));
    std::printf(",\"status\":\"ok\",\"tiling_key\":%llu,\"schedule_mode\":%u,\"block_dim\":%u,\"workspace\":%zu,"
                "\"tiling_size\":%zu,\"block_q\":%u,\"block_k\":%u,\"used_cores\":%u,"
                "\"query_units\":%llu,\"scale\":%g,\"units\":%llu,\"last_unit\":%llu}\n",
                static_cast<unsigned long long>(context.tilingKey_), context.scheduleMode_, context.blockDim_,
                context.workspace_, context.GetRawTilingData()->GetDataSize(), t.blockQ, t.blockK,
                t.usedCores, static_cast<unsigned long long>(t.queryUnits), t.scale,
                static_cast<unsigned long long>(t.units),
                static_cast<unsigned long long>(t.unitStart[t.usedCores]));
    return 0;
}

int Tiling(int argc, char** argv)
{
    if (argc < 15) {
        std::fprintf(stderr, "usage: tiling OpType layout dtype causal mask scale q0..q3 k0..k3 [aic]\n");
        return 2;
    }
    gert::StubNode node = Node(argv[2], argv[3], argv[4], std::atoi(argv[5]) != 0,
                               std::atoi(argv[6]) != 0, std::strtof(argv[7], nullptr), argv + 8,
                               argv + 12);
    fe::PlatFormInfos platform;
    if (argc > 16) {
        SetCores(platform, argv[16]);
    }
    const auto& op = ops::Registry().at(argv[2]);
    gert::TilingContext requestContext(node, platform, 2048);
    flash_cann::PlanRequest request;
    std::printf("{\"request\":");
    if (optiling::FlashCannAttentionRequest(&requestContext, request) == ge::GRAPH_SUCCESS) {
        PrintRequest(request);
    } else {
        std::printf("null");
    }
    gert::TilingContext context(node, platform, 2048);
    const uint32_t status = op->aicore.tiling(&context);
    if (status != ge::GRAPH_SUCCESS) {
        std::printf(",\"status\":\"failed\"}\n");
        return 0;
    }
    flash_cann::TilingData t;
    std::memcpy(&t, context.GetRawTilingData()->GetData(), sizeof(t));
    std::printf(",\"status\":\"ok\",\"tiling_key\":%llu,\"schedule_mode\":%u,\"block_dim\":%u,\"workspace\":%zu,"
                "\"tiling_size\":%zu,\"block_q\":%u,\"block_k\":%u,\"used_cores\":%u,"
                "\"head_dim_pad\":%u,\"scale\":%g,\"last_row\":%llu}\n",
                static_cast<unsigned long long>(context.tilingKey_), context.scheduleMode_, context.blockDim_,
                context.workspace_, context.GetRawTilingData()->GetDataSize(), t.blockQ, t.blockK,
                t.usedCores, t.headDimPad, t.scale,
                static_cast<unsigned long long>(t.rowStart[t.usedCores]));
    return 0;
}

// A FlashCannAttentionKVCache node in the OpDef's order: query, k_cache, v_cache, key and
// value (absent: the contract appends before the op), the optional int32 inputs from
// NAME=VALUE, no ALiBi or sinks; attributes scale, causal false, layout, max_seqlen_q,
// the plain window and softcap, num_splits.
int KVCacheTiling(int argc, char** argv)
{
    if (argc < 13) {
        std::fprintf(stderr, "usage: kvcache-tiling layout dtype scale q0..q3 c0..c3\n");
        return 2;
    }
    gert::StubNode node;
    node.type = "FlashCannAttentionKVCache";
    const ge::DataType dt = DTypeOf(argv[3]);
    const gert::Shape cache = ShapeOf(argv + 9);
    AddInput(node, ShapeOf(argv + 5), dt);
    AddInput(node, cache, dt);
    AddInput(node, cache, dt);
    AddAbsentInput(node);
    AddAbsentInput(node);
    for (const char* name : {"cache_seqlens", "cache_batch_idx", "block_table", "cache_leftpad",
                             "cu_seqlens_q"}) {
        AddOptionalInput(node, name, ge::DT_INT32);
    }
    AddAbsentInput(node);  // alibi_slopes
    AddAbsentInput(node);  // sinks
    using V = gert::RuntimeAttrs::Value;
    node.attrs.values = {V{V::kFloat, std::strtof(argv[4], nullptr), false, ""},
                         V{V::kBool, 0, false, ""}, V{V::kStr, 0, false, argv[2]},
                         V{V::kInt, 0, false, "", std::atoll(Feature("max_seqlen_q", "0").c_str())},
                         V{V::kInt, 0, false, "", -1}, V{V::kInt, 0, false, "", -1},
                         V{V::kFloat, 0, false, ""},
                         V{V::kInt, 0, false, "", std::atoll(Feature("num_splits", "0").c_str())}};
    node.outputs.resize(2);
    node.outputTypes.resize(2, ge::DT_UNDEFINED);
    fe::PlatFormInfos platform;
    gert::TilingContext requestContext(node, platform, 2048);
    flash_cann::DecodeRequest r;
    std::printf("{\"request\":");
    if (optiling::FlashCannAttentionKVCacheRequest(&requestContext, r) == ge::GRAPH_SUCCESS) {
        std::printf("{\"batch\":%lld,\"heads_q\":%lld,\"heads_kv\":%lld,\"seqlen_q\":%lld,"
                    "\"tokens_q\":%lld,\"head_dim\":%lld,\"tnd\":%s,\"paged\":%s,"
                    "\"max_blocks\":%lld,\"leftpad\":%s,\"splits\":%lld}",
                    static_cast<long long>(r.batch), static_cast<long long>(r.headsQ),
                    static_cast<long long>(r.headsKv), static_cast<long long>(r.seqlenQ),
                    static_cast<long long>(r.tokensQ), static_cast<long long>(r.headDim),
                    r.tnd ? "true" : "false", r.paged ? "true" : "false",
                    static_cast<long long>(r.maxBlocks), r.hasLeftpad ? "true" : "false",
                    static_cast<long long>(r.splits));
    } else {
        std::printf("null");
    }
    gert::TilingContext context(node, platform, 2048);
    if (ops::Registry().at(node.type)->aicore.tiling(&context) != ge::GRAPH_SUCCESS) {
        std::printf(",\"status\":\"failed\"}\n");
        return 0;
    }
    std::printf(",\"status\":\"ok\",\"tiling_key\":%llu,\"schedule_mode\":%u,\"block_dim\":%u}\n",
                static_cast<unsigned long long>(context.tilingKey_), context.scheduleMode_, context.blockDim_);
    return 0;
}

int Infer(int argc, char** argv)
{
    if (argc < 13) {
        std::fprintf(stderr, "usage: infer OpType layout dtype q0..q3 k0..k3\n");
        return 2;
    }
    gert::StubNode node =
        std::strcmp(argv[2], "FlashCannAttentionGrad") == 0
            ? GradNode(argv[3], argv[4], false, false, false, false, 1.0f, argv + 5, argv + 9, "")
            : Node(argv[2], argv[3], argv[4], false, false, 1.0f, argv + 5, argv + 9);
    const auto& op = ops::Registry().at(argv[2]);
    gert::InferShapeContext shapes(node);
    gert::InferDataTypeContext types(node);
    const bool ok = op->inferShape(&shapes) == ge::GRAPH_SUCCESS &&
                    op->inferDataType(&types) == ge::GRAPH_SUCCESS;
    std::printf("{\"status\":\"%s\",\"outputs\":[", ok ? "ok" : "failed");
    for (size_t i = 0; i < node.outputs.size(); ++i) {
        std::printf("%s{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", TypeName(node.outputTypes[i]));
        for (size_t d = 0; d < node.outputs[i].GetDimNum(); ++d) {
            std::printf("%s%lld", d ? "," : "", static_cast<long long>(node.outputs[i].GetDim(d)));
        }
        std::printf("]}");
    }
    std::printf("]}\n");
    return 0;
}

}  // namespace

int main(int rawArgc, char** rawArgv)
{
    std::vector<char*> positional;
    for (int i = 0; i < rawArgc; ++i) {
        if (const char* eq = std::strchr(rawArgv[i], '=')) {
            g_features[std::string(rawArgv[i], static_cast<size_t>(eq - rawArgv[i]))] = eq + 1;
        } else {
            positional.push_back(rawArgv[i]);
        }
    }
    const int argc = static_cast<int>(positional.size());
    char** argv = positional.data();
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "opdefs") {
        return OpDefs();
    }
    if (command == "cann-version") {  // the CANN release presented, and the API picked for it
        std::printf("{\"cann_version_num\":%d,\"num_blocks_api\":\"%s\"}\n",
                    static_cast<int>(FLASH_CANN_CANN_VERSION_NUM), flash_cann::cann::kNumBlocksApi);
        return 0;
    }
    if (command == "tiling") {
        return Tiling(argc, argv);
    }
    if (command == "grad-tiling") {
        return GradTiling(argc, argv);
    }
    if (command == "infer") {
        return Infer(argc, argv);
    }
    if (command == "kvcache-tiling") {
        return KVCacheTiling(argc, argv);
    }
    std::fprintf(stderr, "usage: %s opdefs | tiling ... | grad-tiling ... | infer ... | "
                         "kvcache-tiling ...\n", argv[0]);
    return 2;
}
