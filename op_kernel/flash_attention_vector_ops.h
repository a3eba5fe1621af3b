// Vector-core (AIV) building blocks and constants shared by the forward and backward kernels.
//
// RowBroadcast: dst[r][c] (op)= value[r] over a row-major tile.
//
// ScoreMasking: masking of a block of scaled scores, for any kernel whose tiling names
// blockK, seqlenK and causalOffset (TilingData, GradTilingData):
//   key bias   0 for a column that holds a key the rows may attend to, -inf for one past
//              the block's last key or padded out by the key mask; added to every row.
//   causal     per row, on the rows whose diagonal falls inside the block: columns past
//              the row's last visible key become -inf (bottom-right alignment).
// Per-key rows span kKeyLanes-wide vector repeats, so blockK need only be a multiple of 16.
#ifndef FLASH_CANN_FLASH_ATTENTION_VECTOR_OPS_H
#define FLASH_CANN_FLASH_ATTENTION_VECTOR_OPS_H

#include "kernel_operator.h"
#include "flash_cann_tiling.h"

namespace flash_cann {

constexpr uint32_t kVectorCoresPerCube = 2;
enum class RowOp { kSubtract, kMultiply };
constexpr uint32_t kFloatsPerRepeat = 64;  // 256 bytes of fp32 per vector repeat
constexpr uint32_t kFloatsPerBlock = 8;    // 32 bytes of fp32
constexpr float kLowest = -3.40282347e+38f;
constexpr float kSmallest = 1.17549435e-38f;

// dst[r][c] (op)= rowValue[r] for the `rows` rows of a row-major [rows][width] tile: the
// per-row values are broadcast to one 32-byte block each (Brcb, into `broadcast`) and
// read with block stride 0, 64 columns per instruction.
template <RowOp OP>
__aicore__ inline void RowBroadcast(const AscendC::LocalTensor<float>& dst,
                                    const AscendC::LocalTensor<float>& rowValue,
                                    const AscendC::LocalTensor<float>& broadcast, uint32_t rows,
                                    uint32_t width)
{
    AscendC::Brcb(broadcast, rowValue, static_cast<uint8_t>((rows + 7) / 8), AscendC::BrcbRepeatParams(1, 8));
    AscendC::PipeBarrier<PIPE_V>();
    const uint8_t pitch = static_cast<uint8_t>(width / kFloatsPerBlock);
    for (uint32_t col = 0; col < width; col += kFloatsPerRepeat) {
        const uint64_t mask = MinU32(kFloatsPerRepeat, width - col);
        const AscendC::BinaryRepeatParams params(1, 1, 0, pitch, pitch, 1);
        if constexpr (OP == RowOp::kSubtract) {
            AscendC::Sub(dst[col], dst[col], broadcast, mask, static_cast<uint8_t>(rows), params);
        } else {
            AscendC::Mul(dst[col], dst[col], broadcast, mask, static_cast<uint8_t>(rows), params);
        }
    }
    AscendC::PipeBarrier<PIPE_V>();
}

template <typename Tiling, bool CAUSAL, bool MASK>
class ScoreMasking {
public:
    // The buffers: per-key rows of keyUbBytes (bias, column index, scratch), the mask
    // bytes, the mask as half, and a comparison bit mask.
    __aicore__ inline void Init(AscendC::TPipe* pipe, GM_ADDR keyPaddingMask, const Tiling& t,
                                uint32_t keyUbBytes, uint32_t maskUbBytes, uint32_t maskHalfUbBytes,
                                uint32_t bitsUbBytes)
    {
        blockK_ = t.blockK;
        lanes_ = keyUbBytes / sizeof(float);
        seqlenK_ = t.seqlenK;
        negInf_ = -__builtin_inff();
        if (MASK) {
            mask_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(keyPaddingMask));
            pipe->InitBuffer(maskQue_, 1, maskUbBytes);
            pipe->InitBuffer(maskHalfBuf_, maskHalfUbBytes);
            maskHalf_ = maskHalfBuf_.template Get<half>();
        }
        pipe->InitBuffer(keyBuf_, keyUbBytes * kKeyRows);
        pipe->InitBuffer(bitsBuf_, bitsUbBytes);
        keyBias_ = keyBuf_.template GetWithOffset<float>(lanes_, 0);
        column_ = keyBuf_.template GetWithOffset<float>(lanes_, keyUbBytes);
        keyScratch_ = keyBuf_.template GetWithOffset<float>(lanes_, 2 * keyUbBytes);
        bits_ = bitsBuf_.template Get<uint8_t>();
        AscendC::CreateVecIndex(column_, 0.0f, lanes_);
    }

    // s: `rows` rows of blockK scaled scores (row pitch blockK); its row r is query row
    // firstRow + r of batch `batch`; the block's columns are keys key0 .. key0 + columns.
    // causalOffset: the sequence's seqlen_k - seqlen_q (its own, with packed sequences).
    __aicore__ inline void Apply(const AscendC::LocalTensor<float>& s, uint32_t rows, uint32_t batch,
                                 int64_t causalOffset, uint32_t firstRow, uint32_t key0, uint32_t columns)
    {
        causalOffset_ = causalOffset;
        if (MASK || columns < blockK_) {
            BuildKeyBias(batch, key0, columns);
            const uint8_t pitch = static_cast<uint8_t>(blockK_ / kFloatsPerBlock);
            for (uint32_t col = 0; col < blockK_; col += kFloatsPerRepeat) {
                AscendC::Add(s[col], s[col], keyBias_[col], MinU32(kFloatsPerRepeat, blockK_ - col),
                             static_cast<uint8_t>(rows),
                             AscendC::BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
            }
            AscendC::PipeBarrier<PIPE_V>();
        }
        if (CAUSAL) {
            MaskCausal(s, rows, firstRow, key0, columns);
        }
    }

private:
    __aicore__ inline void BuildKeyBias(uint32_t batch, uint32_t key0, uint32_t columns)
    {
        AscendC::Duplicate(keyBias_, 0.0f, lanes_);
        if (columns < lanes_) {
            AscendC::Compares(bits_, column_, static_cast<float>(columns), AscendC::CMPMODE::LT, lanes_);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Select(keyBias_, bits_, keyBias_, negInf_,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes_);
            AscendC::PipeBarrier<PIPE_V>();
        }
        if (MASK) {
            AscendC::LocalTensor<uint8_t> maskBytes = maskQue_.template AllocTensor<uint8_t>();
            AscendC::DataCopyPad(maskBytes, mask_[uint64_t{batch} * seqlenK_ + key0],
                                 AscendC::DataCopyExtParams(1, columns, 0, 0, 0),
                                 AscendC::DataCopyPadExtParams<uint8_t>(false, 0, 0, 0));
            maskQue_.EnQue(maskBytes);
            maskBytes = maskQue_.template DeQue<uint8_t>();
            // Bytes past `columns` are stale; the bias there is already -inf.
            AscendC::Cast(maskHalf_, maskBytes, AscendC::RoundMode::CAST_NONE, lanes_);
            maskQue_.FreeTensor(maskBytes);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Cast(keyScratch_, maskHalf_, AscendC::RoundMode::CAST_NONE, lanes_);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Compares(bits_, keyScratch_, 0.5f, AscendC::CMPMODE::GT, lanes_);  // true = attend
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Select(keyBias_, bits_, keyBias_, negInf_,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, lanes_);
            AscendC::PipeBarrier<PIPE_V>();
        }
    }

    __aicore__ inline void MaskCausal(const AscendC::LocalTensor<float>& s, uint32_t rows,
                                      uint32_t firstRow, uint32_t key0, uint32_t columns)
    {
        for (uint32_t r = 0; r < rows; ++r) {
            const int64_t lastVisible = static_cast<int64_t>(firstRow) + r + causalOffset_ -
                                        static_cast<int64_t>(key0);
            if (lastVisible >= static_cast<int64_t>(columns) - 1) {
                continue;  // the key bias already covers columns past the block's end
            }
            if (lastVisible < 0) {
                AscendC::Duplicate(s[r * blockK_], negInf_, blockK_);
            } else {
                AscendC::Compares(bits_, column_, static_cast<float>(lastVisible),
                                  AscendC::CMPMODE::LE, lanes_);
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Select(s[r * blockK_], bits_, s[r * blockK_], negInf_,
                                AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, blockK_);
            }
            AscendC::PipeBarrier<PIPE_V>();
        }
    }

    uint32_t blockK_ = 0;
    uint32_t lanes_ = 0;
    uint32_t seqlenK_ = 0;
    int64_t causalOffset_ = 0;
    float negInf_ = 0;
    AscendC::GlobalTensor<uint8_t> mask_;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> maskQue_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> keyBuf_, maskHalfBuf_, bitsBuf_;
    AscendC::LocalTensor<float> keyBias_, column_, keyScratch_;
    AscendC::LocalTensor<half> maskHalf_;
    AscendC::LocalTensor<uint8_t> bits_;
};

}  // namespace flash_cann

#endif
