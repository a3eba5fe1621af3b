// The backward planner: portable C++17, no CANN headers.
//
// Given an attention problem, the dQ variant and a platform, it decides what the backward
// kernel (op_kernel/flash_cann_attention_grad.cpp) executes -- query/key block sizes, the
// pre/post-pass chunk, the deterministic dQ chunking, the split of the flattened
// (batch, head_kv, key block) unit space over AI cores, the workspace, the tiling key --
// and proves that every buffer fits, from the kernel's own GradBufferBytes. Unsupported
// input is refused with a message that says what and why. PredictGradPlan runs the
// schedule model on a plan (backward_model.h: a PREDICTION, not a measurement); it is
// separate because it costs about a millisecond that the TilingFunc does not need.
#ifndef FLASH_CANN_PLANNER_GRAD_PLANNER_H
#define FLASH_CANN_PLANNER_GRAD_PLANNER_H

#include <cstdint>
#include <string>
#include <vector>

#include "../../op_kernel/flash_cann_grad_tiling.h"
#include "backward_model.h"
#include "planner.h"

namespace flash_cann {

struct GradPlanRequest {
    PlanRequest problem;
    // dQ by a separate query pass, accumulated in L0C in a fixed order with no atomics
    // (flash-attn's deterministic=True) instead of fp32 atomic adds.
    bool deterministic = false;
};

// What one AI core executes.
struct GradCoreWork {
    uint64_t unitBegin;
    uint64_t unitEnd;
    uint64_t steps;  // (query head, query block) steps over its units: the kernel's UnitCost
    uint64_t queryBegin;  // deterministic dQ: its query units and their steps (QueryUnitCost)
    uint64_t queryEnd;
    uint64_t querySteps;
    double macs;       // 5 products (S, dP, dV, dK, dQ; deterministic 4) x padded rows x
                       // padded keys x padded D, over its units
    double queryMacs;  // 3 products (S, dP, dQ) per query-pass step, likewise
};

// The GM workspace regions (GradWorkspace), in bytes, for reports.
struct GradWorkspaceUse {
    uint64_t delta;     // D = rowsum(dO * O) - dLSE, fp32
    uint64_t dq;        // the fp32 dQ accumulator
    uint64_t dkdv;      // fp32 dK and dV
    uint64_t exchange;  // cube <-> vector slots of every used core
    uint64_t offsets;   // fp16 scores: the query rows' score offset panels (0 otherwise)
};

struct GradPlan {
    GradTilingData tiling{};
    uint64_t tilingKey = 0;
    uint32_t blockDim = 0;            // AI cores launched (= tiling.usedCores: SyncAll spans them)
    uint32_t scheduleMode = kScheduleBatch;  // SyncAll: every block resident at once
    uint64_t userWorkspaceBytes = 0;  // excludes the API's system workspace
    GradWorkspaceUse workspace{};
    std::vector<BufferUse> buffers;
    std::vector<LevelUse> levels;
    std::vector<GradCoreWork> cores;
    double imbalance = 0;             // max core work / (total work / platform AI cores)
};

struct GradPlanResult {
    GradPlan plan;
    std::string error;  // empty on success: the refusal otherwise
    bool ok() const { return error.empty(); }
};

GradPlanResult MakeGradPlan(const GradPlanRequest& request, const Platform& platform);

BackwardPrediction PredictGradPlan(const GradPlan& plan, const GradPlanRequest& request,
                                   const Platform& platform);

// Every buffer the kernel allocates for `t`, from ComputeGradBufferBytes (the key mask's
// only with a mask).
std::vector<BufferUse> ListGradBuffers(const GradTilingData& t, uint32_t elemBytes, bool hasMask);

// The schedule model's description of a plan's (or a tiling's) kernel and work.
BackwardDesign GradDesign(const GradTilingData& t, DType dtype, bool deterministic);
BackwardDesign GradDesign(const GradPlan& plan, DType dtype, bool deterministic);
std::vector<BackwardCoreWork> GradModelWork(const GradPlan& plan);

// The modelled work of one unit (planner's unit of balance: the kernel's steps) and its
// cube multiply-accumulates; likewise of a query unit of the deterministic query pass.
uint64_t GradUnitSteps(const GradTilingData& t, bool causal, uint64_t unit);
double GradUnitMacs(const GradTilingData& t, bool causal, bool deterministic, uint64_t unit);
uint64_t GradQueryUnitSteps(const GradTilingData& t, bool causal, uint64_t unit);
double GradQueryUnitMacs(const GradTilingData& t, bool causal, uint64_t unit);

}  // namespace flash_cann

#endif
