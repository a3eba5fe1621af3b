// What the cube (AIC) and vector (AIV) halves of the forward kernel share: the
// per-AI-core workspace through which they exchange scores, probabilities and partial
// outputs, the cross-core flags that order the exchange, and the rule for which key
// blocks a query tile visits (both sides must walk exactly the same blocks).
#ifndef FLASH_CANN_FLASH_ATTENTION_COMMON_H
#define FLASH_CANN_FLASH_ATTENTION_COMMON_H

#include "kernel_operator.h"
#include "flash_cann_tiling.h"

namespace flash_cann {

// Cross-core flag ids (mode 2: an AIC and the two AIVs of its AI core).
constexpr uint16_t kFlagScores = 1;   // AIC -> AIV: S of a key block is in the workspace
constexpr uint16_t kFlagProbs = 2;    // AIV -> AIC: P of a key block is in the workspace
constexpr uint16_t kFlagOutput = 3;   // AIC -> AIV: P.V of a key block is in the workspace

// The next key block at or after `block` that the tile must visit, or `blocks` if none:
// with a key padding mask, a block whose keys are all padding is skipped. Both cores
// decide this from the same mask bytes, so they visit the same blocks in the same order.
template <bool MASK>
__aicore__ inline uint32_t NextVisibleBlock(const TilingData& t,
                                            const AscendC::GlobalTensor<uint8_t>& mask,
                                            uint32_t batch, uint32_t keyEnd, uint32_t block)
{
    const uint32_t blocks = (keyEnd + t.blockK - 1) / t.blockK;
    if (!MASK) {
        return block < blocks ? block : blocks;
    }
    for (; block < blocks; ++block) {
        const uint32_t first = block * t.blockK;
        const uint32_t last = MinU32(first + t.blockK, keyEnd);
        const uint64_t row = uint64_t{batch} * t.seqlenK;
        for (uint32_t key = first; key < last; ++key) {
            if (mask.GetValue(row + key) != 0) {
                return block;
            }
        }
    }
    return blocks;
}

}  // namespace flash_cann

#endif
