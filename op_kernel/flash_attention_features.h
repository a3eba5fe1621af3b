// Vector-core (AIV) building blocks of the attention features (flash_cann_variant.h) on a
// tile of scaled scores, as the forward and the backward both apply them; the semantics
// are python/flash_cann/contract/variant.py's.
//
// Softcap      s <- softcap * tanh(s / softcap); tanh kept for the backward's chain rule.
// AlibiBias    s <- s - slope * |i + causalOffset - j|, the bias generated in the kernel
//              from a row-minus-column template built once (no bias tensor in GM).
// BandMasking  the sliding window's bounds per row, -inf outside; rows and key blocks
//              wholly outside the band are skipped by the walk, so only the rows whose
//              band edge crosses the block come here.
#ifndef FLASH_CANN_FLASH_ATTENTION_FEATURES_H
#define FLASH_CANN_FLASH_ATTENTION_FEATURES_H

#include "kernel_operator.h"
#include "flash_attention_vector_ops.h"
#include "flash_cann_variant.h"

namespace flash_cann {

// tanh(x) rounds to 1 in fp32 for x > 9.01: clamping 2x there keeps exp(2x) finite, so
// (e - 1) / (e + 1) never meets inf / inf (for x -> -inf, e -> 0 and t -> -1 unclamped).
constexpr float kTanhClamp = 10.0f;

// s <- softcap * tanh(s / softcap) over `count` elements; tanh <- tanh(s / softcap), kept
// for the backward's chain rule. tanh(x) = (e - 1) / (e + 1), e = exp(2x): the vector
// unit has Exp and Div, no Tanh. s holds e - 1 in between (its scores are in tanh then).
__aicore__ inline void Softcap(const AscendC::LocalTensor<float>& s, const AscendC::LocalTensor<float>& tanh,
                               const AscendC::LocalTensor<float>& scratch, float softcap, uint32_t count)
{
    const int32_t n = static_cast<int32_t>(count);
    AscendC::Muls(tanh, s, 2.0f / softcap, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Mins(tanh, tanh, 2.0f * kTanhClamp, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Exp(tanh, tanh, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Adds(scratch, tanh, 1.0f, n);
    AscendC::Adds(s, tanh, -1.0f, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Div(tanh, s, scratch, n);
    AscendC::PipeBarrier<PIPE_V>();
    AscendC::Muls(s, tanh, softcap, n);
    AscendC::PipeBarrier<PIPE_V>();
}

// ALiBi: s[r][c] -= slope * |firstRow + r + causalOffset - key0 - c| on a [rows][width]
// tile. The template holds c - r for the tile's largest row count, built once; a block
// adds its own offset, takes the absolute value and scales it by the slope of its
// (batch, head). Distances are exact in fp32 up to 2^24 (the planner refuses longer).
class AlibiBias {
public:
    // `rows` x `width`: the largest tile; slopes (fp32, GM) per head (mode kPerHead) or per
    // (batch, head) (kPerBatchHead).
    __aicore__ inline void Init(AscendC::TPipe* pipe, GM_ADDR slopes, const VariantTiling& v, uint32_t headsQ,
                                uint32_t rows, uint32_t width)
    {
        perBatch_ = v.alibi == static_cast<uint32_t>(Alibi::kPerBatchHead);
        headsQ_ = headsQ;
        width_ = width;
        slopes_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(slopes));
        pipe->InitBuffer(templateBuf_, rows * width * sizeof(float));
        columnMinusRow_ = templateBuf_.template Get<float>();
        AscendC::CreateVecIndex(columnMinusRow_, 0.0f, width);
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t r = 1; r < rows; ++r) {
            AscendC::Adds(columnMinusRow_[r * width], columnMinusRow_, -static_cast<float>(r),
                          static_cast<int32_t>(width));
        }
    }

    __aicore__ inline float Slope(uint32_t batch, uint32_t head) const
    {
        return slopes_.GetValue(perBatch_ ? uint64_t{batch} * headsQ_ + head : head);
    }

    // s: `rows` rows of width_ scores, row r = query row firstRow + r, columns keys key0 + c;
    // causalOffset: the sequence's seqlen_k - seqlen_q (its own, with packed sequences).
    __aicore__ inline void Apply(const AscendC::LocalTensor<float>& s, const AscendC::LocalTensor<float>& scratch,
                                 uint32_t rows, int64_t causalOffset, uint32_t firstRow, uint32_t key0,
                                 float slope)
    {
        const int32_t n = static_cast<int32_t>(rows * width_);
        const int64_t base = static_cast<int64_t>(firstRow) + causalOffset - key0;
        AscendC::Adds(scratch, columnMinusRow_, -static_cast<float>(base), n);  // j - i - offset
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Abs(scratch, scratch, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Muls(scratch, scratch, -slope, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Add(s, s, scratch, n);
        AscendC::PipeBarrier<PIPE_V>();
    }

private:
    bool perBatch_ = false;
    uint32_t headsQ_ = 0;
    uint32_t width_ = 0;
    AscendC::GlobalTensor<float> slopes_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> templateBuf_;
    AscendC::LocalTensor<float> columnMinusRow_;
};

// The sliding window on a tile: row i sees key j only if i + causalOffset - left <= j <=
// i + causalOffset + right (flash_cann_variant.h; a side < 0 is unbounded, the causal
// bound is ScoreMasking's). Columns outside become -inf.
class BandMasking {
public:
    // keyUbBytes: one per-key row of the tile (kKeyLanes-padded); bitsUbBytes: a
    // comparison bit mask over it.
    __aicore__ inline void Init(AscendC::TPipe* pipe, const VariantTiling& v, uint32_t width,
                                uint32_t keyUbBytes, uint32_t bitsUbBytes)
    {
        left_ = v.windowLeft;
        right_ = v.windowRight;
        width_ = width;
        lanes_ = keyUbBytes / sizeof(float);
        negInf_ = -__builtin_inff();
        pipe->InitBuffer(columnBuf_, keyUbBytes);
        pipe->InitBuffer(bitsBuf_, bitsUbBytes);
        column_ = columnBuf_.template Get<float>();
        bits_ = bitsBuf_.template Get<uint8_t>();
        AscendC::CreateVecIndex(column_, 0.0f, lanes_);
    }

    // s: `rows` rows of width_ scores (row i = firstRow + r); the block holds keys key0 ..
    // key0 + columns - 1 (columns past them are masked already); causalOffset: the
    // sequence's seqlen_k - seqlen_q.
    __aicore__ inline void Apply(const AscendC::LocalTensor<float>& s, uint32_t rows, int64_t causalOffset,
                                 uint32_t firstRow, uint32_t key0, uint32_t columns)
    {
        for (uint32_t r = 0; r < rows; ++r) {
            const int64_t diagonal = static_cast<int64_t>(firstRow) + r + causalOffset - key0;
            const AscendC::LocalTensor<float> row = s[r * width_];
            if (left_ >= 0 && diagonal - left_ > 0) {  // keys left of the band
                Clip(row, diagonal - left_, AscendC::CMPMODE::GE, columns);
            }
            if (right_ >= 0 && diagonal + right_ < static_cast<int64_t>(columns) - 1) {  // right of it
                Clip(row, diagonal + right_, AscendC::CMPMODE::LE, columns);
            }
        }
    }

private:
    // row[c] <- -inf where !(c mode bound); a bound outside the block masks all of it.
    __aicore__ inline void Clip(const AscendC::LocalTensor<float>& row, int64_t bound, AscendC::CMPMODE mode,
                                uint32_t columns)
    {
        const bool none = mode == AscendC::CMPMODE::GE ? bound >= static_cast<int64_t>(columns) : bound < 0;
        if (none) {
            AscendC::Duplicate(row, negInf_, static_cast<int32_t>(width_));
        } else {
            AscendC::Compares(bits_, column_, static_cast<float>(bound), mode, lanes_);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Select(row, bits_, row, negInf_, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, width_);
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    int64_t left_ = -1;
    int64_t right_ = -1;
    uint32_t width_ = 0;
    uint32_t lanes_ = 0;
    float negInf_ = 0;
    AscendC::TBuf<AscendC::TPosition::VECCALC> columnBuf_, bitsBuf_;
    AscendC::LocalTensor<float> column_;
    AscendC::LocalTensor<uint8_t> bits_;
};

}  // namespace flash_cann

#endif  // FLASH_CANN_FLASH_ATTENTION_FEATURES_H
