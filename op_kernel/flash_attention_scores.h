// The element type of S = Q K^T between the cube and the vector cores, forward and
// backward: float, or half on the fp16_scores fast path (the tiling keys' D digit 2;
// docs/kernel.md, "The fp16-score fast path").
//
// The Fixpipe converts L0C's fp32 S on its way out: F322F16 rounds to the nearest fp16.
// No scalar pre-scale exists for an fp32 source on dav-c220 (QF322F16_PRE is Ascend
// 950's; DEQF16 and the other scalar modes take int32), so S leaves unscaled, and a
// score past fp16's range may leave as inf: the vector cores clamp each loaded slice
// before using it (WidenScores), so an inf never meets an inf in s - max.
#ifndef FLASH_CANN_FLASH_ATTENTION_SCORES_H
#define FLASH_CANN_FLASH_ATTENTION_SCORES_H

#include "kernel_operator.h"

namespace flash_cann {

template <typename S>
struct ScoreType {
    static constexpr QuantMode_t kFixpipeMode = QuantMode_t::NoQuant;
    static constexpr bool kHalf = false;
};
template <>
struct ScoreType<half> {
    static constexpr QuantMode_t kFixpipeMode = QuantMode_t::F322F16;
    static constexpr bool kHalf = true;
};

// The largest finite fp16: an S beyond it left the Fixpipe as +-inf.
constexpr float kHalfMax = 65504.0f;

// A loaded fp16 score slice clamped to fp16's finite range while still fp16 (half the
// repeats of an fp32 clamp; +-65504 are exact in both), then widened into `wide`. The
// barrier before the Cast also orders the previous slice's last reads of `wide`.
__aicore__ inline void WidenScores(const AscendC::LocalTensor<float>& wide,
                                   const AscendC::LocalTensor<half>& loaded, uint32_t count)
{
    AscendC::Mins(loaded, loaded, static_cast<half>(kHalfMax), static_cast<int32_t>(count));
    AscendC::PipeBarrier<PIPE_V>();  // Mins -> Maxs
    AscendC::Maxs(loaded, loaded, static_cast<half>(-kHalfMax), static_cast<int32_t>(count));
    AscendC::PipeBarrier<PIPE_V>();  // Maxs -> Cast; earlier reads of `wide` -> Cast
    AscendC::Cast(wide, loaded, AscendC::RoundMode::CAST_NONE, count);
    AscendC::PipeBarrier<PIPE_V>();  // Cast -> the scale's Muls
}

}  // namespace flash_cann

#endif
