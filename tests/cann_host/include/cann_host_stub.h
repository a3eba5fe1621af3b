// TEST-ONLY stand-in for the subset of CANN's host API that op_host/flash_cann_attention.cpp
// uses (metadef register/op_def_registry.h + exe_graph contexts, platform_ascendc). It
// RECORDS what the shell registers and lets tests drive its TilingFunc and InferShape
// without CANN. Names and signatures follow the public headers (hicann/metadef,
// mirror-cann/asc-devkit); the shell was also syntax-checked against those headers.
// Where the API differs between CANN 8.x and 9.x, the stand-in presents the release
// version/cann_version.h names (op_host/flash_cann_cann_compat.h lists the differences).
// Behaviour that the shell could get wrong is mimicked, e.g. Shape::SetDim not growing
// the rank, and GetInputShape counting only the inputs that are present.
#ifndef FLASH_CANN_TEST_CANN_HOST_STUB_H
#define FLASH_CANN_TEST_CANN_HOST_STUB_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

// The CANN release this stand-in presents (CANN_VERSION_NUM; one driver build per release).
#include "version/cann_version.h"

namespace ge {
enum DataType { DT_FLOAT = 0, DT_FLOAT16 = 1, DT_INT32 = 3, DT_INT64 = 9, DT_BOOL = 12, DT_BF16 = 27, DT_UNDEFINED = 28 };
enum Format { FORMAT_ND = 2 };
using graphStatus = uint32_t;
const graphStatus GRAPH_SUCCESS = 0;
const graphStatus GRAPH_FAILED = 0xFFFFFFFF;
}  // namespace ge

namespace fe {
// What the stand-in platform reports (filled by the test driver).
class PlatFormInfos {
public:
    uint32_t aic = 24, aiv = 48;
    uint64_t ub = 196352, l1 = 524032, l0a = 65536, l0b = 65536, l0c = 131072;
    uint32_t libApiWorkspace = 16 * 1024 * 1024;
};
}  // namespace fe

namespace gert {

class Shape {
public:
    size_t GetDimNum() const { return dimNum_; }
    void SetDimNum(size_t n) { dimNum_ = n; }
    int64_t GetDim(size_t i) const { return i < kMaxDimNum ? dims_[i] : INT64_MIN; }
    // As in metadef: the rank only grows to `i`, not `i + 1`.
    void SetDim(size_t i, int64_t v)
    {
        dims_[i] = v;
        dimNum_ = dimNum_ < i ? i : dimNum_;
    }
    Shape& AppendDim(int64_t v)
    {
        dims_[dimNum_++] = v;
        return *this;
    }
    static constexpr size_t kMaxDimNum = 25;

private:
    int64_t dims_[kMaxDimNum] = {};
    size_t dimNum_ = 0;
};

struct StorageShape {
    Shape shape;
    const Shape& GetOriginShape() const { return shape; }
    const Shape& GetStorageShape() const { return shape; }
    const Shape& GetShape() const { return shape; }
};

class CompileTimeTensorDesc {
public:
    ge::DataType dtype = ge::DT_UNDEFINED;
    ge::DataType GetDataType() const { return dtype; }
};

class RuntimeAttrs {
public:
    struct Value {
        enum Kind { kFloat, kBool, kStr, kInt } kind;
        float f = 0;
        bool b = false;
        std::string s;
        int64_t i = 0;
    };
    std::vector<Value> values;  // by attribute index
    const float* GetFloat(size_t i) const { return Is(i, Value::kFloat) ? &values[i].f : nullptr; }
    const int64_t* GetInt(size_t i) const { return Is(i, Value::kInt) ? &values[i].i : nullptr; }
    const bool* GetBool(size_t i) const { return Is(i, Value::kBool) ? &values[i].b : nullptr; }
    const char* GetStr(size_t i) const { return Is(i, Value::kStr) ? values[i].s.c_str() : nullptr; }

private:
    bool Is(size_t i, Value::Kind kind) const { return i < values.size() && values[i].kind == kind; }
};

class TilingData {
public:
    explicit TilingData(size_t capacity) : data_(capacity) {}
    size_t GetCapacity() const { return data_.size(); }
    size_t GetDataSize() const { return size_; }
    void SetDataSize(size_t size) { size_ = size; }
    void* GetData() { return data_.data(); }

private:
    std::vector<uint8_t> data_;
    size_t size_ = 0;
};

// Inputs by IR index; absent optional inputs are nullptr and are skipped by the
// instance-index getters, as in the real contexts.
struct StubNode {
    std::string type = "FlashCannAttention";
    std::vector<std::unique_ptr<StorageShape>> inputs;
    std::vector<CompileTimeTensorDesc> inputDescs;
    std::vector<Shape> outputs;
    std::vector<ge::DataType> outputTypes;
    RuntimeAttrs attrs;

    const StorageShape* Instance(size_t index) const
    {
        for (const auto& in : inputs) {
            if (in && index-- == 0) {
                return in.get();
            }
        }
        return nullptr;
    }
};

class TilingContext {
public:
    TilingContext(StubNode& node, fe::PlatFormInfos& platform, size_t capacity)
        : node_(node), platform_(platform), tiling_(capacity) {}
    const StorageShape* GetInputShape(size_t index) const { return node_.Instance(index); }
    const StorageShape* GetOptionalInputShape(size_t irIndex) const
    {
        return irIndex < node_.inputs.size() ? node_.inputs[irIndex].get() : nullptr;
    }
    const CompileTimeTensorDesc* GetInputDesc(size_t index) const
    {
        return index < node_.inputDescs.size() ? &node_.inputDescs[index] : nullptr;
    }
    const RuntimeAttrs* GetAttrs() const { return &node_.attrs; }
    fe::PlatFormInfos* GetPlatformInfo() const { return &platform_; }
    TilingData* GetRawTilingData() { return &tiling_; }
#if CANN_VERSION_NUM >= 90000000
    // CANN 9.x (hicann/metadef): SetSimdNumBlocks, and SetBlockDim kept as its alias, to be
    // deleted; marked deprecated here so that a -Werror build of the shell fails on it.
    ge::graphStatus SetSimdNumBlocks(uint32_t numBlocks)
    {
        blockDim_ = numBlocks;
        return ge::GRAPH_SUCCESS;
    }
    [[deprecated("CANN 9.x: use SetSimdNumBlocks")]] ge::graphStatus SetBlockDim(uint32_t blockDim)
    {
        return SetSimdNumBlocks(blockDim);
    }
#else
    // CANN 8.x (Ascend/metadef): SetBlockDim only.
    ge::graphStatus SetBlockDim(uint32_t blockDim)
    {
        blockDim_ = blockDim;
        return ge::GRAPH_SUCCESS;
    }
#endif
    ge::graphStatus SetTilingKey(uint64_t key)
    {
        tilingKey_ = key;
        return ge::GRAPH_SUCCESS;
    }
    // metadef's TilingContext::SetScheduleMode: 0 normal (its default), 1 batch mode.
    ge::graphStatus SetScheduleMode(const uint32_t scheduleMode)
    {
        scheduleMode_ = scheduleMode;
        return ge::GRAPH_SUCCESS;
    }
    size_t* GetWorkspaceSizes(size_t count) { return count == 1 ? &workspace_ : nullptr; }
    const char* GetNodeType() const { return node_.type.c_str(); }
    const char* GetNodeName() const { return node_.type.c_str(); }

    uint32_t blockDim_ = 0;
    uint32_t scheduleMode_ = 0;
    uint64_t tilingKey_ = 0;
    size_t workspace_ = 0;

private:
    StubNode& node_;
    fe::PlatFormInfos& platform_;
    TilingData tiling_;
};

class InferShapeContext {
public:
    explicit InferShapeContext(StubNode& node) : node_(node) {}
    const Shape* GetInputShape(size_t index) const
    {
        const StorageShape* s = node_.Instance(index);
        return s ? &s->shape : nullptr;
    }
    Shape* GetOutputShape(size_t index)
    {
        return index < node_.outputs.size() ? &node_.outputs[index] : nullptr;
    }
    const RuntimeAttrs* GetAttrs() const { return &node_.attrs; }
    const char* GetNodeType() const { return node_.type.c_str(); }

private:
    StubNode& node_;
};

class InferDataTypeContext {
public:
    explicit InferDataTypeContext(StubNode& node) : node_(node) {}
    ge::DataType GetInputDataType(size_t index) const
    {
        return index < node_.inputDescs.size() ? node_.inputDescs[index].dtype : ge::DT_UNDEFINED;
    }
    ge::graphStatus SetOutputDataType(size_t index, ge::DataType dtype)
    {
        if (index >= node_.outputTypes.size()) {
            return ge::GRAPH_FAILED;
        }
        node_.outputTypes[index] = dtype;
        return ge::GRAPH_SUCCESS;
    }
    const char* GetNodeType() const { return node_.type.c_str(); }

private:
    StubNode& node_;
};

}  // namespace gert

namespace ops {

enum Option { IGNORE = 0, OPTIONAL = 1, REQUIRED = 2, DYNAMIC = 3, VIRTUAL = 4 };
using InferShapeFunc = uint32_t (*)(gert::InferShapeContext*);
using InferDataTypeFunc = uint32_t (*)(gert::InferDataTypeContext*);
using TilingFunc = uint32_t (*)(gert::TilingContext*);

class OpParamDef {
public:
    explicit OpParamDef(const char* name) : name(name) {}
    OpParamDef& ParamType(Option o) { option = o; return *this; }
    OpParamDef& DataType(std::vector<ge::DataType> t) { types = std::move(t); return *this; }
    OpParamDef& Format(std::vector<ge::Format> f) { formats = std::move(f); return *this; }
    OpParamDef& AutoContiguous() { autoContiguous = true; return *this; }
    std::string name;
    Option option = REQUIRED;
    std::vector<ge::DataType> types;
    std::vector<ge::Format> formats;
    bool autoContiguous = false;
};

class OpAttrDef {
public:
    explicit OpAttrDef(const char* name) : name(name) {}
    OpAttrDef& AttrType(Option o) { option = o; return *this; }
    OpAttrDef& Float() { type = "float"; return *this; }
    OpAttrDef& Float(float v) { type = "float"; def = std::to_string(v); hasDefault = true; return *this; }
    OpAttrDef& Bool() { type = "bool"; return *this; }
    OpAttrDef& Bool(bool v) { type = "bool"; def = v ? "true" : "false"; hasDefault = true; return *this; }
    OpAttrDef& Int() { type = "int"; return *this; }
    OpAttrDef& Int(int64_t v) { type = "int"; def = std::to_string(v); hasDefault = true; return *this; }
    OpAttrDef& String() { type = "str"; return *this; }
    OpAttrDef& String(const char* v) { type = "str"; def = v; hasDefault = true; return *this; }
    std::string name, type, def;
    Option option = REQUIRED;  // an attribute without AttrType() is REQUIRED
    bool hasDefault = false;
};

class OpAICoreConfig {
public:
    OpAICoreConfig& DynamicCompileStaticFlag(bool) { return *this; }
    OpAICoreConfig& DynamicFormatFlag(bool) { return *this; }
    OpAICoreConfig& DynamicRankSupportFlag(bool) { return *this; }
    OpAICoreConfig& DynamicShapeSupportFlag(bool) { return *this; }
    OpAICoreConfig& NeedCheckSupportFlag(bool) { return *this; }
    OpAICoreConfig& PrecisionReduceFlag(bool) { return *this; }
    OpAICoreConfig& ExtendCfgInfo(const char* key, const char* value)
    {
        extended.emplace_back(key, value);
        return *this;
    }
    std::vector<std::pair<std::string, std::string>> extended;
};

class OpAICoreDef {
public:
    OpAICoreDef& SetTiling(TilingFunc f) { tiling = f; return *this; }
    // Non-const reference, as in the real header: a temporary does not bind.
    OpAICoreDef& AddConfig(const char* soc, OpAICoreConfig&) { socs.push_back(soc); return *this; }
    TilingFunc tiling = nullptr;
    std::vector<std::string> socs;
};

class OpDef {
public:
    explicit OpDef(const char* type) : type(type) {}
    virtual ~OpDef() = default;
    OpParamDef& Input(const char* name) { inputs.emplace_back(name); return inputs.back(); }
    OpParamDef& Output(const char* name) { outputs.emplace_back(name); return outputs.back(); }
    OpAttrDef& Attr(const char* name) { attrs.emplace_back(name); return attrs.back(); }
    OpDef& SetInferShape(InferShapeFunc f) { inferShape = f; return *this; }
    OpDef& SetInferDataType(InferDataTypeFunc f) { inferDataType = f; return *this; }
    OpAICoreDef& AICore() { return aicore; }
    std::string type;
    std::vector<OpParamDef> inputs, outputs;
    std::vector<OpAttrDef> attrs;
    InferShapeFunc inferShape = nullptr;
    InferDataTypeFunc inferDataType = nullptr;
    OpAICoreDef aicore;
};

inline std::map<std::string, std::unique_ptr<OpDef>>& Registry()
{
    static std::map<std::string, std::unique_ptr<OpDef>> registry;
    return registry;
}

template <typename T>
struct Registrar {
    explicit Registrar(const char* type) { Registry()[type] = std::make_unique<T>(type); }
};

}  // namespace ops

#define OP_ADD(opType) static ::ops::Registrar<opType> g_register_##opType(#opType)

namespace platform_ascendc {
enum class CoreMemType { L0_A = 0, L0_B = 1, L0_C = 2, L1 = 3, L2 = 4, UB = 5, HBM = 6, RESERVED };

class PlatformAscendC {
public:
    explicit PlatformAscendC(fe::PlatFormInfos* info) : info_(info) {}
    uint32_t GetCoreNumAic() const { return info_->aic; }
    uint32_t GetCoreNumAiv() const { return info_->aiv; }
    uint32_t GetLibApiWorkSpaceSize() const { return info_->libApiWorkspace; }
    void GetCoreMemSize(const CoreMemType& type, uint64_t& size) const
    {
        switch (type) {
            case CoreMemType::UB: size = info_->ub; break;
            case CoreMemType::L1: size = info_->l1; break;
            case CoreMemType::L0_A: size = info_->l0a; break;
            case CoreMemType::L0_B: size = info_->l0b; break;
            case CoreMemType::L0_C: size = info_->l0c; break;
            default: size = 0;
        }
    }

private:
    fe::PlatFormInfos* info_;
};
}  // namespace platform_ascendc

#endif
