// The element type of S = Q K^T between the backward's cube and vector cores: float, or
// half on the fp16_scores fast path (the grad tiling key's D digit 2; the forward keeps
// fp32 S: docs/kernel-backward.md, "The fp16-score fast path").
//
// The Fixpipe converts L0C's fp32 S on its way out: F322F16 rounds to the nearest fp16.
// No scalar pre-scale exists for an fp32 source on dav-c220 (QF322F16_PRE is Ascend
// 950's; DEQF16 and the other scalar modes take int32), so S leaves unscaled, and a
// score past fp16's range may leave as inf: the vector cores clamp each loaded block
// before using it (WidenScores), so an inf never meets an inf in s - max.
//
// The score offset. F322F16 costs each score |S| 2^-12, large where the logits are. So the
// cube does not round S but S - c, c a per-row offset close to the row's largest scores,
// which makes the rounded quantity small exactly where the probabilities are large. The
// Fixpipe has no per-row mode for an fp32 source on dav-c220, so the product does it: the
// S product runs over kScoreOffsetColumns more depth, Q's extra panel holding -a in every
// column and K's ones, which adds sum_16 (-a) 1 = -16 a = -c to every score of the row in
// L0C's fp32 (exactly: 16 a is a power-of-two multiple of an fp16). a = fp16(x / 16), x
// the wanted offset in unscaled score units, clamped so that |c| <= 65504. The vector
// cores add c back in fp32 wherever the absolute score counts. The backward's x is
// (lse - shift) / scale, known before it starts (ScoreOffsetHalves; the shift is the
// backward's, flash_attention_grad_vector.h).
#ifndef FLASH_CANN_FLASH_ATTENTION_SCORES_H
#define FLASH_CANN_FLASH_ATTENTION_SCORES_H

#include "kernel_operator.h"
#include "flash_cann_tiling.h"

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
// The largest |a| of the offset panel: c = 16 a stays within fp16's range.
constexpr float kOffsetPanelMax = kHalfMax / kScoreOffsetColumns;

// negA[i] = -a of query row i (the offset panel's value, fp16) for the backward's offset
// c = 16 a ~ (lse - shift) / scale, from the rows' lse (fp32; -inf for a row that sees no
// key, whose scores are all masked: a clamps to the panel's bound) and `shift` (fp32, the
// caller's; it is overwritten). Deterministic, so the pre-pass (which writes the panel)
// and the main loop (which adds c back) compute the same a from the same lse and shift.
__aicore__ inline void ScoreOffsetHalves(const AscendC::LocalTensor<half>& negA,
                                         const AscendC::LocalTensor<float>& shift,
                                         const AscendC::LocalTensor<float>& lse, float scale, uint32_t count)
{
    const int32_t n = static_cast<int32_t>(count);
    AscendC::Sub(shift, shift, lse, n);  // shift - lse = -(lse - shift)
    AscendC::PipeBarrier<PIPE_V>();  // Sub -> Muls
    AscendC::Muls(shift, shift, 1.0f / (scale * kScoreOffsetColumns), n);
    AscendC::PipeBarrier<PIPE_V>();  // Muls -> Mins
    AscendC::Mins(shift, shift, kOffsetPanelMax, n);
    AscendC::PipeBarrier<PIPE_V>();  // Mins -> Maxs
    AscendC::Maxs(shift, shift, -kOffsetPanelMax, n);
    AscendC::PipeBarrier<PIPE_V>();  // Maxs -> Cast
    AscendC::Cast(negA, shift, AscendC::RoundMode::CAST_RINT, count);
    AscendC::PipeBarrier<PIPE_V>();  // Cast -> the caller's use of negA
}

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
