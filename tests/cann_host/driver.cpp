// TEST-ONLY driver of op_host/flash_cann_attention{,_grad}.cpp compiled against the
// recording stand-in (include/cann_host_stub.h). Commands print JSON for
// tests/test_op_host.py:
//   opdefs
//   tiling <OpType> <layout> <fp16|bf16> <causal 0|1> <mask 0|1> <scale> q0 q1 q2 q3 k0 k1 k2 k3 [aic]
//   grad-tiling <layout> <fp16|bf16> <causal 0|1> <mask 0|1> <deterministic 0|1>
//               <grad_lse 0|1> <scale> q0 q1 q2 q3 k0 k1 k2 k3 [aic [input-to-misshape]]
//   infer  <OpType> <layout> <fp16|bf16> q0 q1 q2 q3 k0 k1 k2 k3
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "flash_cann_grad_tiling.h"
#include "flash_cann_tiling.h"
#include "register/op_def_registry.h"

namespace {

const char* TypeName(ge::DataType t)
{
    switch (t) {
        case ge::DT_FLOAT: return "float32";
        case ge::DT_FLOAT16: return "float16";
        case ge::DT_BF16: return "bfloat16";
        case ge::DT_BOOL: return "bool";
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

gert::Shape ShapeOf(char** dims)
{
    gert::Shape shape;
    for (int i = 0; i < 4; ++i) {
        shape.AppendDim(std::atoll(dims[i]));
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

// A forward node: query, key, value (shaped like key), optional mask (batch, seqlen_k).
gert::StubNode Node(const char* type, const char* layout, const char* dtype, bool causal,
                    bool mask, float scale, char** q, char** k)
{
    gert::StubNode node;
    node.type = type;
    const ge::DataType dt = std::strcmp(dtype, "bf16") == 0 ? ge::DT_BF16 : ge::DT_FLOAT16;
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
    const ge::DataType dt = std::strcmp(dtype, "bf16") == 0 ? ge::DT_BF16 : ge::DT_FLOAT16;
    const bool bnsd = std::strcmp(layout, "BNSD") == 0;
    const gert::Shape qs = ShapeOf(q);
    const gert::Shape ks = ShapeOf(k);
    gert::Shape rows;
    rows.AppendDim(qs.GetDim(0)).AppendDim(qs.GetDim(bnsd ? 1 : 2)).AppendDim(qs.GetDim(bnsd ? 2 : 1));
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
    node.outputs.resize(3);
    node.outputTypes.resize(3, ge::DT_UNDEFINED);
    return node;
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
        platform.aic = static_cast<uint32_t>(std::atoi(argv[17]));
        platform.aiv = 2 * platform.aic;
    }
    const auto& op = ops::Registry().at(node.type);
    gert::TilingContext context(node, platform, 2048);
    if (op->aicore.tiling(&context) != ge::GRAPH_SUCCESS) {
        std::printf("{\"status\":\"failed\"}\n");
        return 0;
    }
    flash_cann::GradTilingData t;
    std::memcpy(&t, context.GetRawTilingData()->GetData(), sizeof(t));
    std::printf("{\"status\":\"ok\",\"tiling_key\":%llu,\"block_dim\":%u,\"workspace\":%zu,"
                "\"tiling_size\":%zu,\"block_q\":%u,\"block_k\":%u,\"used_cores\":%u,"
                "\"dq_slots\":%u,\"scale\":%g,\"units\":%llu,\"last_unit\":%llu}\n",
                static_cast<unsigned long long>(context.tilingKey_), context.blockDim_,
                context.workspace_, context.GetRawTilingData()->GetDataSize(), t.blockQ, t.blockK,
                t.usedCores, t.dqSlots, t.scale, static_cast<unsigned long long>(t.units),
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
        platform.aic = static_cast<uint32_t>(std::atoi(argv[16]));
        platform.aiv = 2 * platform.aic;
    }
    const auto& op = ops::Registry().at(argv[2]);
    gert::TilingContext context(node, platform, 2048);
    const uint32_t status = op->aicore.tiling(&context);
    if (status != ge::GRAPH_SUCCESS) {
        std::printf("{\"status\":\"failed\"}\n");
        return 0;
    }
    flash_cann::TilingData t;
    std::memcpy(&t, context.GetRawTilingData()->GetData(), sizeof(t));
    std::printf("{\"status\":\"ok\",\"tiling_key\":%llu,\"block_dim\":%u,\"workspace\":%zu,"
                "\"tiling_size\":%zu,\"block_q\":%u,\"block_k\":%u,\"used_cores\":%u,"
                "\"head_dim_pad\":%u,\"scale\":%g,\"last_row\":%llu}\n",
                static_cast<unsigned long long>(context.tilingKey_), context.blockDim_,
                context.workspace_, context.GetRawTilingData()->GetDataSize(), t.blockQ, t.blockK,
                t.usedCores, t.headDimPad, t.scale,
                static_cast<unsigned long long>(t.rowStart[t.usedCores]));
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

int main(int argc, char** argv)
{
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "opdefs") {
        return OpDefs();
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
    std::fprintf(stderr, "usage: %s opdefs | tiling ... | grad-tiling ... | infer ...\n", argv[0]);
    return 2;
}
