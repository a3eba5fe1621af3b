// The tiling planner: portable C++17, no CANN headers.
//
// Given an attention problem and a platform, it decides what the forward kernel
// executes -- query/key block sizes, head_dim padding, the split of the flattened
// (batch x heads x query rows) space over AI cores, which buffers are double-buffered,
// the workspace, the tiling key -- and proves that every buffer fits. Unsupported input
// is refused with a message that says what and why, never planned around.
#ifndef FLASH_CANN_PLANNER_PLANNER_H
#define FLASH_CANN_PLANNER_PLANNER_H

#include <cstdint>
#include <string>
#include <vector>
#include <utility>

#include "../../op_kernel/flash_cann_tiling.h"
#include "platform.h"

namespace flash_cann {

enum class DType : uint32_t { Float16 = 0, BFloat16 = 1, Float32 = 2 };

struct PlanRequest {
    int64_t batch = 0;
    int64_t headsQ = 0;
    int64_t headsKv = 0;
    int64_t seqlenQ = 0;
    int64_t seqlenK = 0;
    int64_t headDim = 0;
    DType dtype = DType::Float16;
    Layout layout = Layout::BNSD;
    bool causal = false;
    bool hasMask = false;
    double scale = 0;
    VariantTiling variant = kPlainVariant;  // features beyond plain attention
    // Layout TND (packed sequences): the query and key tokens (the tensors' first
    // dimension); batch is then the number of sequences (cu_seqlens' length - 1) and
    // seqlenQ/K are max_seqlen_q/k. The plan depends on these shapes only: cu_seqlens
    // are read by the kernel on the device (flash_cann_packed.h).
    int64_t tokensQ = 0;
    int64_t tokensK = 0;
    // fp16_scores: the backward may hold S = Q K^T in fp16 (fp16 inputs only; refused
    // otherwise, forward and backward alike). The forward plans as without it: it keeps
    // fp32 S (docs/kernel-backward.md, "The fp16-score fast path").
    bool fp16Scores = false;
    // The 256-row tile in row passes (TilingData cubeRows): 0 where the schedule model
    // predicts it faster (MakePlan), 1 wherever it fits, -1 never (tests force it at small
    // shapes with 1).
    int32_t cubePasses = 0;
};

enum class MemLevel : uint32_t { L1, L0A, L0B, L0C, UB };
const char* MemLevelName(MemLevel level);

// One buffer of one kernel stage: `copies` x `bytes` at `level`, on one core
// (AIC buffers: per cube core; UB buffers: per vector core).
struct BufferUse {
    std::string stage;
    std::string name;
    MemLevel level;
    uint64_t bytes;
    uint32_t copies;
};

struct LevelUse {
    MemLevel level;
    uint64_t used;
    uint64_t capacity;
};

// What one AI core executes, in the cost model's unit (cube multiply-accumulates).
struct CoreWork {
    uint64_t rowBegin;
    uint64_t rowEnd;
    uint64_t tiles;
    uint64_t scoreElements;  // padded rows x visited key columns, summed over tiles
    uint64_t keyColumns;     // visited key columns summed over tiles (K/V traffic)
    double macs;             // 2 x scoreElements x padded head_dim (Q.K^T and P.V)
};

// Schedule-model prediction (a model, not a measurement): see cost_model.h. Computed on
// request (Predict), not by MakePlan: the CANN shell plans at every launch.
struct Prediction {
    std::string design;          // the kernel design the model ran
    double seconds = 0;          // launch + slowest AI core (or the HBM floor)
    double launchSeconds = 0;
    double hbmSeconds = 0;       // HBM floor: inputs and outputs once
    double coreSeconds = 0;      // the slowest AI core's schedule
    double meanCoreSeconds = 0;
    double usefulFlops = 0;      // 4 * D * (visible query-key pairs), no padding
    double cubeUtilization = 0;  // usefulFlops / (seconds * cube peak)
    std::string bound;           // what limits the slowest core
    std::vector<std::pair<std::string, double>> engineBusySeconds;  // slowest core
};

struct Plan {
    TilingData tiling{};
    uint64_t tilingKey = 0;
    uint32_t blockDim = 0;             // AI cores launched
    uint64_t userWorkspaceBytes = 0;   // excludes the API's system workspace
    std::vector<BufferUse> buffers;
    std::vector<LevelUse> levels;
    std::vector<CoreWork> cores;
    double imbalance = 0;              // max core work / (total work / platform AI cores)
};

struct PlanResult {
    Plan plan;
    std::string error;  // empty on success: the refusal otherwise
    bool ok() const { return error.empty(); }
};

PlanResult MakePlan(const PlanRequest& request, const Platform& platform);
// The plan MakePlan compares for long sequences: with the blocks it picks first
// (halves false), or with the 256-row tile in two 128-row cube passes (TilingData
// cubeRows); an error where the shape does not fit.
PlanResult PlanBlocks(const PlanRequest& request, const Platform& platform, bool halves);

// The encoding of a call's features (flash_cann_variant.h) from the op's arguments, as
// contract/variant.py normalised them; the dropout threshold is derived from dropout_p
// rounded to float32 (the CANN attribute's type), as every backend derives it.
VariantTiling MakeVariant(int64_t windowLeft, int64_t windowRight, double softcap,
                          double dropoutP, Alibi alibi, bool sinks);

// Bytes per element of a supported dtype.
uint32_t ElementBytes(DType dtype);

// The reserve the plan keeps free at the top of UB: Select/Compares scalar modes use
// the last 8 KB of UB as scratch on 910B (asc-devkit TMP_UB_OFFSET).
constexpr uint64_t kUbApiScratch = 8 * 1024;

}  // namespace flash_cann

#endif
