// What the cube (AIC) and vector (AIV) halves of the forward kernel share: the
// per-AI-core workspace through which they exchange scores, probabilities and partial
// outputs of one round, and the cross-core flags that order the exchange. Which rounds a
// tile has is decided by flash_cann_tiling.h (RoundCount, MakeRound) from the tile alone,
// so both halves walk exactly the same rounds without reading the key mask.
#ifndef FLASH_CANN_FLASH_ATTENTION_COMMON_H
#define FLASH_CANN_FLASH_ATTENTION_COMMON_H

#include "kernel_operator.h"
#include "flash_cann_tiling.h"

namespace flash_cann {

// Cross-core flag ids (mode 2: an AIC and the two AIVs of its AI core).
constexpr uint16_t kFlagScores = 1;   // AIC -> AIV: S of a round is in the workspace
constexpr uint16_t kFlagProbs = 2;    // AIV -> AIC: P of a round is in the workspace
constexpr uint16_t kFlagOutput = 3;   // AIC -> AIV: P.V of a round is in the workspace

// One AI core's part of the workspace, as both halves address it: two slots each of
// scores S (fp32), probabilities P (input dtype) and partial outputs O (fp32).
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
    // Element `offset` of slot `slot` (round sequence number % 2).
    __aicore__ inline AscendC::GlobalTensor<float> Scores(uint32_t slot, uint64_t offset) const
    {
        return scores_[slot * scoreSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<T> Probs(uint32_t slot, uint64_t offset) const
    {
        return probs_[slot * probSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<float> Output(uint32_t slot, uint64_t offset) const
    {
        return output_[slot * outputSlot_ + offset];
    }

private:
    AscendC::GlobalTensor<float> scores_, output_;
    AscendC::GlobalTensor<T> probs_;
    uint64_t scoreSlot_ = 0, probSlot_ = 0, outputSlot_ = 0;
};

}  // namespace flash_cann

#endif
