// The decode planner: what the decode kernel (op_kernel/flash_cann_attention_kvcache.cpp)
// executes for a fwd_kvcache call -- tile rows, keys per round, the split of every
// (sequence, kv head) tile's keys over cores, the units of each core, the workspace --
// from SHAPES ONLY (the per-sequence lengths, leftpads, block tables and TND offsets are
// device values the kernel reads: a decode step can be captured into a graph). Every
// buffer is proved to fit; unsupported input is refused with a message.
//
// The schedule model (PredictDecode) is a prediction, not a measurement: decode is bound
// by HBM, so its figure is the share of HBM bandwidth the K/V reads reach.
#ifndef FLASH_CANN_PLANNER_DECODE_PLANNER_H
#define FLASH_CANN_PLANNER_DECODE_PLANNER_H

#include <cstdint>
#include <string>
#include <vector>

#include "../../op_kernel/flash_cann_decode_tiling.h"
#include "planner.h"

namespace flash_cann {

struct DecodeRequest {
    int64_t batch = 0;
    int64_t headsQ = 0;
    int64_t headsKv = 0;
    int64_t seqlenQ = 0;     // BSND: query rows per sequence; TND: max_seqlen_q
    int64_t tokensQ = 0;     // TND: total query rows (0 for BSND)
    int64_t headDim = 0;
    DType dtype = DType::Float16;
    bool tnd = false;
    bool causal = false;
    // The cache: contiguous (cacheBatch sequences of cacheSeqlen keys) or paged
    // (cacheBatch blocks of pageSize keys, block_table rows of maxBlocks).
    bool paged = false;
    int64_t cacheBatch = 0;
    int64_t cacheSeqlen = 0; // contiguous: keys per cache sequence; paged: page_size
    int64_t maxBlocks = 0;   // paged: block_table's row length
    bool hasBatchIdx = false;
    bool hasLeftpad = false;
    double scale = 0;
    VariantTiling variant = kPlainVariant;
    int64_t splits = 0;      // > 0: force the split count (tests); 0: the planner's choice
};

struct DecodePlan {
    DecodeTiling tiling{};
    uint64_t tilingKey = 0;
    uint32_t blockDim = 0;
    uint32_t scheduleMode = kScheduleBatch;  // the split combine's SyncAll
    uint64_t userWorkspaceBytes = 0;
    std::vector<BufferUse> buffers;
    std::vector<LevelUse> levels;
};

struct DecodePlanResult {
    DecodePlan plan;
    std::string error;
    bool ok() const { return error.empty(); }
};

DecodePlanResult MakeDecodePlan(const DecodeRequest& request, const Platform& platform);

// Keys each sequence can hold: block_table's row x page_size, or the cache's seqlen.
int64_t DecodeCapacity(const DecodeRequest& request);

// The schedule model's prediction for a decode call where every sequence holds
// `keys` keys (the figure the planner cannot know; the plan is the same for any).
struct DecodePrediction {
    double seconds = 0;
    double hbmSeconds = 0;        // the K/V (and Q/out) bytes at full HBM bandwidth
    double coreSeconds = 0;       // the slowest core's main phase
    double combineSeconds = 0;    // SyncAll + the split combine
    double launchSeconds = 0;
    double hbmBytes = 0;          // bytes that must cross HBM
    double hbmUse = 0;            // hbmBytes / seconds / HBM bandwidth
    std::string bound;            // what limits the main phase
};

DecodePrediction PredictDecode(const DecodePlan& plan, const DecodeRequest& request, const Platform& platform,
                               int64_t keys);

}  // namespace flash_cann

#endif
