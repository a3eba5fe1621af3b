// What the cube (AIC) and vector (AIV) halves of the forward kernel share: the
// per-AI-core workspace through which they exchange scores, probabilities and partial
// outputs of one round, and the cross-core flags that order the exchange. Which rounds a
// tile has is decided by flash_cann_tiling.h (RoundCount, MakeRound) from the tile alone,
// so both halves walk exactly the same rounds without reading the key mask.
#ifndef FLASH_CANN_FLASH_ATTENTION_COMMON_H
#define FLASH_CANN_FLASH_ATTENTION_COMMON_H

#include "kernel_operator.h"
#include "flash_cann_tiling.h"
#include "flash_attention_seqlens.h"

namespace flash_cann {

// Cross-core flag ids (mode 2: an AIC and the two AIVs of its AI core).
constexpr uint16_t kFlagScores = 1;   // AIC -> AIV: S of a round is in the workspace
constexpr uint16_t kFlagProbs = 2;    // AIV -> AIC: P of a round is in the workspace
constexpr uint16_t kFlagOutput = 3;   // AIC -> AIV: P.V of a round is in the workspace

// One AI core's part of the workspace, as both halves address it: the rings of scores S
// (fp32), probabilities P (input dtype) and partial outputs O (fp32) of Workspace.
template <typename T>
class ExchangeBuffers {
public:
    __aicore__ inline void Init(GM_ADDR userWorkspace, uint32_t core, const TilingData& t)
    {
        const Workspace ws(t, sizeof(T));
        GM_ADDR mine = userWorkspace + core * t.workspacePerCore;
        scores_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(mine + ws.scores));
        probs_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(mine + ws.probs));
        output_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(mine + ws.output));
        scoreSlot_ = ws.slotBytes[0] / sizeof(float);
        probSlot_ = ws.slotBytes[1] / sizeof(T);
        outputSlot_ = ws.slotBytes[2] / sizeof(float);
    }
    // Element `offset` of the slot of the round with sequence number `seq` (the core's
    // rounds counted over all its tiles).
    __aicore__ inline AscendC::GlobalTensor<float> Scores(uint32_t seq, uint64_t offset) const
    {
        return scores_[seq % kScoreSlots * scoreSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<T> Probs(uint32_t seq, uint64_t offset) const
    {
        return probs_[seq % kProbSlots * probSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<float> Output(uint32_t seq, uint64_t offset) const
    {
        return output_[seq % kOutputSlots * outputSlot_ + offset];
    }

private:
    AscendC::GlobalTensor<float> scores_;
    AscendC::GlobalTensor<float> output_;
    AscendC::GlobalTensor<T> probs_;
    uint64_t scoreSlot_ = 0, probSlot_ = 0, outputSlot_ = 0;
};

// The query tiles of one AI core, in order: the planner's row range (dense layouts) or
// the device-side walk over cu_seqlens (TND, flash_cann_packed.h). Both halves of the AI
// core start it with the same arguments, so they walk the same tiles.
template <bool CAUSAL>
class CoreTiles {
public:
    __aicore__ inline void Start(const TilingData& t, const DeviceSeqlens& cu, uint32_t core)
    {
        t_ = &t;
        packed_ = t.layout == static_cast<uint32_t>(Layout::TND);
        if (core >= t.usedCores) {
            cursor_ = end_ = 0;
            packed_ = false;
        } else if (packed_) {
            walk_.Start(t, cu, core, t.usedCores);
        } else {
            cursor_ = t.rowStart[core];
            end_ = t.rowStart[core + 1];
        }
    }
    __aicore__ inline bool Next(QueryTile& tile)
    {
        return packed_ ? walk_.Next(tile) : NextTile(*t_, cursor_, end_, tile);
    }

private:
    const TilingData* t_ = nullptr;
    bool packed_ = false;
    uint64_t cursor_ = 0;
    uint64_t end_ = 0;
    PackedTileWalk<CAUSAL, DeviceSeqlens> walk_;
};

}  // namespace flash_cann

#endif
