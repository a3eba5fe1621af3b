// Pieces of the planner that the forward plan (planner.cpp) and the backward plan
// (grad_planner.cpp) share: the problem checks, the per-level memory accounting and the
// platform / TPipe limits. Internal to the planner library.
#ifndef FLASH_CANN_PLANNER_PLAN_PARTS_H
#define FLASH_CANN_PLANNER_PLAN_PARTS_H

#include <sstream>
#include <string>
#include <vector>

#include "planner.h"

namespace flash_cann {

template <typename... Parts>
std::string Message(const Parts&... parts)
{
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}

// The refusal for a problem neither kernel supports (sizes, dtype, head_dim, GQA ratio,
// index widths, BSND row pitch, scale); empty if supported.
std::string ValidateProblem(const PlanRequest& request);

// The problem fields and strides of a tiling (TilingData, GradTilingData: same names)
// for a request that ValidateProblem accepted.
template <typename Tiling>
void SetProblem(Tiling& t, const PlanRequest& r)
{
    t.batch = static_cast<uint32_t>(r.batch);
    t.headsQ = static_cast<uint32_t>(r.headsQ);
    t.headsKv = static_cast<uint32_t>(r.headsKv);
    t.group = static_cast<uint32_t>(r.headsQ / r.headsKv);
    t.seqlenQ = static_cast<uint32_t>(r.seqlenQ);
    t.seqlenK = static_cast<uint32_t>(r.seqlenK);
    t.headDim = static_cast<uint32_t>(r.headDim);
    t.headDimPad = AlignUp(t.headDim, kCubeBlock);
    t.causalOffset = r.seqlenK - r.seqlenQ;
    t.scale = static_cast<float>(r.scale);
    t.layout = static_cast<uint32_t>(r.layout);
    t.variant = r.variant;
    const uint64_t d = t.headDim;
    if (r.layout == Layout::BNSD) {  // (batch, heads, seqlen, head_dim)
        t.qStrideRow = d;
        t.qStrideHead = d * t.seqlenQ;
        t.qStrideBatch = t.qStrideHead * t.headsQ;
        t.kvStrideRow = d;
        t.kvStrideHead = d * t.seqlenK;
        t.kvStrideBatch = t.kvStrideHead * t.headsKv;
    } else if (r.layout == Layout::TND) {  // (tokens, heads, head_dim): rows are tokens
        t.qStrideHead = d;
        t.qStrideRow = d * t.headsQ;
        t.qStrideBatch = 0;  // a sequence is placed by its cu_seqlens offset, not its index
        t.kvStrideHead = d;
        t.kvStrideRow = d * t.headsKv;
        t.kvStrideBatch = 0;
        t.tokensQ = static_cast<uint64_t>(r.tokensQ);
        t.tokensK = static_cast<uint64_t>(r.tokensK);
    } else {  // BSND: (batch, seqlen, heads, head_dim)
        t.qStrideHead = d;
        t.qStrideRow = d * t.headsQ;
        t.qStrideBatch = t.qStrideRow * t.seqlenQ;
        t.kvStrideHead = d;
        t.kvStrideRow = d * t.headsKv;
        t.kvStrideBatch = t.kvStrideRow * t.seqlenK;
    }
}

// The refusal for a problem ValidateProblem rejects, else for a platform without AI
// cores; empty if both kernels' planners may go on.
std::string CheckRequest(const PlanRequest& request, const Platform& platform);

// Bytes the plan may use at `level` on one core (UB keeps the API's scratch free).
uint64_t Capacity(MemLevel level, const Platform& platform);

// Per-level totals; a buffer is rounded up to 32 bytes as TPipe::InitBuffer does.
std::vector<LevelUse> SumLevels(const std::vector<BufferUse>& buffers, const Platform& platform);

bool Fits(const std::vector<LevelUse>& levels);

// The refusal for more buffers than one TPipe manages; empty otherwise.
std::string CheckPipeBuffers(const std::vector<BufferUse>& buffers);

}  // namespace flash_cann

#endif
