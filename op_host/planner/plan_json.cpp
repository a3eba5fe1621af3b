#include "plan_json.h"

#include <algorithm>
#include <vector>

#include <iomanip>
#include <sstream>

#include "cost_model.h"
#include "decode_planner.h"
#include "engine_rates.h"

namespace flash_cann {
namespace {

std::string Quote(const std::string& s)
{
    std::ostringstream out;
    out << '"';
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out << '\\' << c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            out << "\\u" << std::hex << std::setw(4) << std::setfill('0') << int(c) << std::dec;
        } else {
            out << c;
        }
    }
    out << '"';
    return out.str();
}

// A minimal JSON object writer: fields separated by commas.
class Object {
public:
    explicit Object(std::ostringstream& out) : out_(out) { out_ << '{'; }
    ~Object() { out_ << '}'; }
    std::ostringstream& Key(const char* key)
    {
        out_ << (first_ ? "" : ",") << Quote(key) << ':';
        first_ = false;
        return out_;
    }

private:
    std::ostringstream& out_;
    bool first_ = true;
};

void WritePlatform(std::ostringstream& out, const Platform& p, bool withRates = false)
{
    Object o(out);
    o.Key("name") << Quote(p.name);
    o.Key("aic_cores") << p.aicCores;
    o.Key("aiv_cores") << p.aivCores;
    o.Key("ub_bytes") << p.ubBytes;
    o.Key("l1_bytes") << p.l1Bytes;
    o.Key("l0a_bytes") << p.l0aBytes;
    o.Key("l0b_bytes") << p.l0bBytes;
    o.Key("l0c_bytes") << p.l0cBytes;
    o.Key("cube_clock_ghz") << p.cubeClockGhz;
    o.Key("cube_peak_tflops") << CubePeakFlops(p) / 1e12;
    o.Key("hbm_gb_per_s") << p.hbmBytesPerSecond / 1e9;
    o.Key("l2_gb_per_s") << p.l2BytesPerSecond / 1e9;
    o.Key("source") << Quote(p.source);
    if (withRates) {
        // The schedule model's inputs for this SoC (engine_rates.cpp): pinned per SoC
        // against their cited sources and the committed fit by tests/test_planner.py.
        const EngineRates r = RatesFor(p);
        o.Key("engine_rates");
        Object e(out);
        e.Key("clock_hz") << r.clockHz;
        e.Key("l2_to_l1") << r.l2ToL1;
        e.Key("l1_to_l0a") << r.l1ToL0a;
        e.Key("l1_to_l0b") << r.l1ToL0b;
        e.Key("fixpipe") << r.fixpipe;
        e.Key("l2_to_ub") << r.l2ToUb;
        e.Key("ub_to_l2") << r.ubToL2;
        e.Key("l2_aggregate") << r.l2Aggregate;
        e.Key("hbm") << r.hbm;
        e.Key("cross_core_flag_seconds") << r.crossCoreFlag;
        e.Key("launch_seconds") << r.launch;
        e.Key("mmad_issue_seconds") << r.mmadIssue;
        e.Key("mte1_issue_seconds") << r.mte1Issue;
        e.Key("vector_issue_seconds") << r.vectorIssue;
        e.Key("mte2_latency_seconds") << r.mte2Latency;
        e.Key("mte3_latency_seconds") << r.mte3Latency;
        e.Key("fixpipe_latency_seconds") << r.fixpipeLatency;
        e.Key("l2_to_l1_arrival_seconds") << r.l2ToL1Arrival;
        e.Key("l1_to_l0_arrival_seconds") << r.l1ToL0Arrival;
        e.Key("fixpipe_arrival_seconds") << r.fixpipeArrival;
        e.Key("l2_to_ub_arrival_seconds") << r.l2ToUbArrival;
        e.Key("ub_to_l2_arrival_seconds") << r.ubToL2Arrival;
        e.Key("vector_cycles");
        out << '[';
        for (uint32_t op = 0; op < static_cast<uint32_t>(VecOp::kCount); ++op) {
            out << (op ? "," : "") << '[' << r.vector[op].cyclesPerRepeat << ','
                << r.vector[op].headCycles << ']';
        }
        out << ']';
    }
}

void WriteTiling(std::ostringstream& out, const TilingData& t)
{
    Object o(out);
    o.Key("block_q") << t.blockQ;
    o.Key("block_k") << t.blockK;
    o.Key("key_stack") << t.keyStack;
    o.Key("vec_rows") << t.vecRows;
    o.Key("head_dim_pad") << t.headDimPad;
    o.Key("group") << t.group;
    o.Key("causal_offset") << t.causalOffset;
    o.Key("kv_l1_buffers") << t.kvL1Buffers;
    o.Key("p_l1_buffers") << t.pL1Buffers;
    o.Key("l0a_buffers") << t.l0aBuffers;
    o.Key("l0b_buffers") << t.l0bBuffers;
    o.Key("l0c_buffers") << t.l0cBuffers;
    o.Key("cube_rows") << t.cubeRows;
    o.Key("used_cores") << t.usedCores;
    o.Key("workspace_per_core") << t.workspacePerCore;
    o.Key("q_strides") << '[' << t.qStrideBatch << ',' << t.qStrideHead << ',' << t.qStrideRow << ']';
    o.Key("kv_strides") << '[' << t.kvStrideBatch << ',' << t.kvStrideHead << ',' << t.kvStrideRow
                        << ']';
    o.Key("features") << t.features;
    {
        const VariantTiling& v = t.variant;
        o.Key("variant");
        Object ov(out);
        ov.Key("window_left") << v.windowLeft;
        ov.Key("window_right") << v.windowRight;
        ov.Key("softcap") << v.softcap;
        ov.Key("dropout_p") << v.dropoutP;
        ov.Key("dropout_threshold") << v.dropoutThreshold;
        ov.Key("alibi") << v.alibi;
        ov.Key("sinks") << v.sinks;
    }
    o.Key("tiling_bytes") << sizeof(TilingData);
}

void WriteBuffers(std::ostringstream& out, const std::vector<BufferUse>& buffers)
{
    out << '[';
    for (size_t i = 0; i < buffers.size(); ++i) {
        const BufferUse& b = buffers[i];
        out << (i ? "," : "");
        Object ob(out);
        ob.Key("stage") << Quote(b.stage);
        ob.Key("name") << Quote(b.name);
        ob.Key("level") << Quote(MemLevelName(b.level));
        ob.Key("bytes") << b.bytes;
        ob.Key("copies") << b.copies;
    }
    out << ']';
}

void WriteLevels(std::ostringstream& out, const std::vector<LevelUse>& levels)
{
    out << '[';
    for (size_t i = 0; i < levels.size(); ++i) {
        const LevelUse& l = levels[i];
        out << (i ? "," : "");
        Object ol(out);
        ol.Key("level") << Quote(MemLevelName(l.level));
        ol.Key("used") << l.used;
        ol.Key("capacity") << l.capacity;
    }
    out << ']';
}

void WriteGradTiling(std::ostringstream& out, const GradTilingData& t)
{
    Object o(out);
    o.Key("block_q") << t.blockQ;
    o.Key("block_k") << t.blockK;
    o.Key("key_blocks") << t.keyBlocks;
    o.Key("head_dim_pad") << t.headDimPad;
    o.Key("group") << t.group;
    o.Key("causal_offset") << t.causalOffset;
    o.Key("pass_rows") << t.passRows;
    o.Key("l0c_scratch_buffers") << t.l0cScratchBuffers;
    o.Key("product_rows") << t.productRows;
    o.Key("dq_columns") << t.dqColumns;
    o.Key("units") << t.units;
    o.Key("query_blocks") << t.queryBlocks;
    o.Key("query_units") << t.queryUnits;
    o.Key("used_cores") << t.usedCores;
    o.Key("q_strides") << '[' << t.qStrideBatch << ',' << t.qStrideHead << ',' << t.qStrideRow << ']';
    o.Key("kv_strides") << '[' << t.kvStrideBatch << ',' << t.kvStrideHead << ',' << t.kvStrideRow
                        << ']';
    o.Key("tiling_bytes") << sizeof(GradTilingData);
}

void WritePrediction(std::ostringstream& out, const Prediction& p, const Platform& platform)
{
    Object o(out);
    o.Key("label") << Quote("PREDICTION of the schedule model (docs/schedule-model.md), not a measurement");
    o.Key("design") << Quote(p.design);
    o.Key("seconds") << p.seconds;
    o.Key("launch_seconds") << p.launchSeconds;
    o.Key("hbm_seconds") << p.hbmSeconds;
    o.Key("core_seconds") << p.coreSeconds;
    o.Key("mean_core_seconds") << p.meanCoreSeconds;
    o.Key("useful_flops") << p.usefulFlops;
    o.Key("tflops") << (p.seconds > 0 ? p.usefulFlops / p.seconds / 1e12 : 0.0);
    o.Key("cube_utilization") << p.cubeUtilization;
    o.Key("cube_peak_tflops") << CubePeakFlops(platform) / 1e12;
    o.Key("bound") << Quote(p.bound);
    o.Key("engine_busy_seconds");
    Object busy(out);
    for (const auto& [engine, seconds] : p.engineBusySeconds) {
        busy.Key(engine.c_str()) << seconds;
    }
}

}  // namespace

std::string ErrorJson(const std::string& message)
{
    std::ostringstream out;
    {
        Object o(out);
        o.Key("error") << Quote(message);
    }
    return out.str();
}

std::string PlatformsToJson()
{
    std::ostringstream out;
    out << std::setprecision(10) << '[';
    bool first = true;
    for (const Platform& p : KnownPlatforms()) {
        out << (first ? "" : ",");
        first = false;
        WritePlatform(out, p, /*withRates=*/true);
    }
    out << ']';
    return out.str();
}

std::string PlanToJson(const PlanResult& result, const PlanRequest& request,
                       const Platform& platform)
{
    if (!result.ok()) {
        return ErrorJson(result.error);
    }
    const Plan& plan = result.plan;
    std::ostringstream out;
    out << std::setprecision(10);
    {
        Object o(out);
        o.Key("platform");
        WritePlatform(out, platform);
        o.Key("tiling_key") << plan.tilingKey;
        o.Key("block_dim") << plan.blockDim;
        o.Key("user_workspace_bytes") << plan.userWorkspaceBytes;
        o.Key("tiling");
        WriteTiling(out, plan.tiling);
        o.Key("buffers");
        WriteBuffers(out, plan.buffers);
        o.Key("levels");
        WriteLevels(out, plan.levels);
        o.Key("cores") << '[';
        for (size_t i = 0; i < plan.cores.size(); ++i) {
            const CoreWork& c = plan.cores[i];
            out << (i ? "," : "");
            Object oc(out);
            oc.Key("rows") << '[' << c.rowBegin << ',' << c.rowEnd << ']';
            oc.Key("tiles") << c.tiles;
            oc.Key("macs") << c.macs;
        }
        out << ']';
        o.Key("imbalance") << plan.imbalance;
        if (request.layout == Layout::TND) {
            // The plan holds no lengths (the kernel reads cu_seqlens on the device): the
            // prediction takes `batch` sequences of equal length (the tokens spread evenly,
            // max_seqlen permitting); PredictPacked takes real offsets.
            std::vector<int32_t> cuQ{0}, cuK{0};
            for (int64_t b = 1; b <= request.batch; ++b) {
                cuQ.push_back(static_cast<int32_t>(std::min(request.tokensQ * b / request.batch,
                                                            cuQ.back() + request.seqlenQ)));
                cuK.push_back(static_cast<int32_t>(std::min(request.tokensK * b / request.batch,
                                                            cuK.back() + request.seqlenK)));
            }
            o.Key("prediction_assumes") << "\"the tokens in batch sequences of equal length\"";
            o.Key("prediction");
            WritePrediction(out, PredictPacked(plan, request, platform, cuQ, cuK), platform);
            o.Key("incumbent_design_prediction") << "null";  // its TND takes host lists
        } else {
            o.Key("prediction");
            WritePrediction(out, Predict(plan, request, platform), platform);
            o.Key("incumbent_design_prediction");
            WritePrediction(out, PredictIncumbent(request, platform), platform);
            // PTO's kernel where its templates take the shape: fp16, no features, whole
            // CUBE_S0 blocks and TILE_S1 tiles, causal only square.
            const PtoTiling pto;
            const bool ptoTakes = request.dtype == DType::Float16 && !request.hasMask &&
                                  IsPlain(request.variant) && request.layout != Layout::TND &&
                                  request.seqlenQ % pto.cubeS0 == 0 &&
                                  request.seqlenK % pto.tileS1 == 0 &&
                                  (!request.causal || request.seqlenQ == request.seqlenK);
            o.Key("pto_design_prediction");
            if (ptoTakes) {
                WritePrediction(out, PredictPto(request, platform, pto), platform);
            } else {
                out << "null";
            }
        }
    }
    return out.str();
}

std::string GradPlanToJson(const GradPlanResult& result, const GradPlanRequest& request,
                           const Platform& platform)
{
    if (!result.ok()) {
        return ErrorJson(result.error);
    }
    const GradPlan& plan = result.plan;
    std::ostringstream out;
    out << std::setprecision(10);
    {
        Object o(out);
        o.Key("platform");
        WritePlatform(out, platform);
        o.Key("tiling_key") << plan.tilingKey;
        o.Key("block_dim") << plan.blockDim;
        o.Key("schedule_mode") << plan.scheduleMode;
        o.Key("user_workspace_bytes") << plan.userWorkspaceBytes;
        o.Key("workspace");
        {
            Object ow(out);
            ow.Key("delta") << plan.workspace.delta;
            ow.Key("dq") << plan.workspace.dq;
            ow.Key("dk_dv") << plan.workspace.dkdv;
            ow.Key("exchange") << plan.workspace.exchange;
            ow.Key("offsets") << plan.workspace.offsets;
        }
        o.Key("tiling");
        WriteGradTiling(out, plan.tiling);
        o.Key("buffers");
        WriteBuffers(out, plan.buffers);
        o.Key("levels");
        WriteLevels(out, plan.levels);
        o.Key("cores") << '[';
        for (size_t i = 0; i < plan.cores.size(); ++i) {
            const GradCoreWork& c = plan.cores[i];
            out << (i ? "," : "");
            Object oc(out);
            oc.Key("units") << '[' << c.unitBegin << ',' << c.unitEnd << ']';
            oc.Key("steps") << c.steps;
            oc.Key("macs") << c.macs;
            oc.Key("query_units") << '[' << c.queryBegin << ',' << c.queryEnd << ']';
            oc.Key("query_steps") << c.querySteps;
            oc.Key("query_macs") << c.queryMacs;
        }
        out << ']';
        o.Key("imbalance") << plan.imbalance;
        if (IsPacked(plan.tiling)) {
            // The backward model walks the planner's unit split; a packed plan has none (the
            // kernel splits on the device): not modelled (null), rather than a wrong figure.
            o.Key("prediction") << "null";
        } else {
            const BackwardPrediction p = PredictGradPlan(plan, request, platform);
            o.Key("prediction");
            Object op(out);
            op.Key("label") << Quote("PREDICTION of the backward schedule model (docs/schedule-model.md), "
                                     "not a measurement");
            op.Key("seconds") << p.seconds;
            op.Key("pre_seconds") << p.preSeconds;
            op.Key("main_seconds") << p.mainSeconds;
            op.Key("post_seconds") << p.postSeconds;
            op.Key("query_pass_seconds") << p.queryPassSeconds;
            op.Key("vector_step_seconds") << p.vectorStepSeconds;
            op.Key("useful_flops") << p.usefulFlops;
            op.Key("tflops") << (p.seconds > 0 ? p.usefulFlops / p.seconds / 1e12 : 0.0);
            op.Key("cube_utilization") << p.cubeUtilization;
            op.Key("cube_peak_tflops") << CubePeakFlops(platform) / 1e12;
            op.Key("bound") << Quote(p.bound);
            op.Key("engine_busy_seconds");
            Object busy(out);
            for (const auto& [engine, seconds] : p.engineBusySeconds) {
                busy.Key(engine.c_str()) << seconds;
            }
        }
    }
    return out.str();
}

std::string DecodePlanToJson(const DecodePlanResult& result, const DecodeRequest& request,
                             const Platform& platform, int64_t keys)
{
    if (!result.ok()) {
        return ErrorJson(result.error);
    }
    const DecodePlan& plan = result.plan;
    const DecodeTiling& t = plan.tiling;
    std::ostringstream out;
    out << std::setprecision(10);
    {
        Object o(out);
        o.Key("platform");
        WritePlatform(out, platform);
        o.Key("kernel") << Quote("decode");
        o.Key("tiling_key") << plan.tilingKey;
        o.Key("block_dim") << plan.blockDim;
        o.Key("schedule_mode") << plan.scheduleMode;
        o.Key("user_workspace_bytes") << plan.userWorkspaceBytes;
        o.Key("tiling");
        {
            Object ot(out);
            ot.Key("block_q") << t.blockQ;
            ot.Key("row_tiles") << t.rowTiles;
            ot.Key("block_k") << t.blockK;
            ot.Key("key_stack") << t.keyStack;
            ot.Key("round_keys") << DecodeRoundKeys(t);
            ot.Key("vec_rows") << t.vecRows;
            ot.Key("splits") << t.splits;
            ot.Key("units") << DecodeUnits(t);
            ot.Key("used_cores") << t.usedCores;
            ot.Key("group") << t.group;
            ot.Key("head_dim_pad") << t.headDimPad;
            ot.Key("paged") << t.paged;
            ot.Key("capacity") << DecodeCapacity(request);
            ot.Key("workspace_per_core") << t.workspacePerCore;
            ot.Key("tiling_bytes") << sizeof(DecodeTiling);
        }
        o.Key("buffers");
        WriteBuffers(out, plan.buffers);
        o.Key("levels");
        WriteLevels(out, plan.levels);
        const DecodePrediction p = PredictDecode(plan, request, platform, keys);
        o.Key("prediction");
        Object op(out);
        op.Key("label") << Quote("PREDICTION of the decode schedule model (docs/planner.md, \"The decode plan\"), "
                                 "not a measurement");
        op.Key("keys_per_sequence") << keys;
        op.Key("seconds") << p.seconds;
        op.Key("launch_seconds") << p.launchSeconds;
        op.Key("hbm_seconds") << p.hbmSeconds;
        op.Key("core_seconds") << p.coreSeconds;
        op.Key("combine_seconds") << p.combineSeconds;
        op.Key("hbm_bytes") << p.hbmBytes;
        op.Key("hbm_use") << p.hbmUse;
        op.Key("hbm_gb_per_s") << platform.hbmBytesPerSecond / 1e9;
        op.Key("bound") << Quote(p.bound);
    }
    return out.str();
}

std::string FitToJson(const FitResult& fit, const Platform& platform)
{
    std::ostringstream out;
    out << std::setprecision(10);
    {
    Object o(out);
    o.Key("label") << Quote("the schedule model's figures fitted to hw-native-sys/pto-isa's published "
                            "flash_atten tables (docs/schedule-model.md, \"Fitted model\")");
    const FittedFigures& f = fit.figures;
    const EngineRates r = RatesFor(platform, f);
    o.Key("figures");
    {
        Object of(out);
        of.Key("fixpipe_scale") << f.fixpipeScale;
        of.Key("mte2_scale") << f.mte2Scale;
        of.Key("l2_scale") << f.l2Scale;
        of.Key("transfer_cycles") << f.transferCycles;
        of.Key("issue_cycles") << f.issueCycles;
        of.Key("launch_cycles") << f.launchCycles;
        // What they make of 910B2's rates, per core or in total.
        of.Key("fixpipe_gb_per_s") << r.fixpipe / 1e9;
        of.Key("l2_to_l1_gb_per_s") << r.l2ToL1 / 1e9;
        of.Key("l2_to_ub_gb_per_s") << r.l2ToUb / 1e9;
        of.Key("l2_tb_per_s") << r.l2Aggregate / 1e12;
        of.Key("launch_us") << r.launch * 1e6;
    }
    o.Key("cost") << fit.cost;
    o.Key("evaluations") << fit.evaluations;
    o.Key("points");
    out << '[';
    for (size_t i = 0; i < fit.points.size(); ++i) {
        const FitPoint& p = fit.points[i];
        out << (i ? "," : "");
        Object op(out);
        op.Key("table") << Quote(p.table);
        op.Key("what") << Quote(p.what);
        op.Key("measured_us") << p.measured;
        op.Key("modelled_us") << p.modelled;
        op.Key("error") << p.Error();
        op.Key("weight") << p.weight;
        op.Key("role") << Quote(p.role);
    }
    out << ']';
    }
    return out.str();
}

}  // namespace flash_cann
