// The vector (AIV) half of the FlashAttention forward kernel: the online softmax.
//
// The two vector cores of an AI core split each query tile's rows. Per key block:
//   SoftMaxCompute  wait for S; scale; mask (key padding and block tail as an additive
//                   -inf bias row, causal per row on diagonal blocks); row max m';
//                   P = exp(S - m'); l = l * exp(m - m') + rowsum(P); P -> workspace ->
//                   flag the cube
//   ProcessVec2     acc = acc * exp(m - m') + P.V once the cube's product arrives
// and per tile the epilogue DataCopyOut: out = acc / l, lse = m + ln(l). Statistics are
// fp32; rows that see no key keep m = -inf, l = 0 and produce out = 0 and lse = -inf
// (clamping m to the lowest float where it is subtracted keeps -inf - -inf out).
// Everything is vector work on UB; no scalar reads of UB, so no scalar-vector syncs.
#ifndef FLASH_CANN_FLASH_ATTENTION_VECTOR_H
#define FLASH_CANN_FLASH_ATTENTION_VECTOR_H

#include "flash_attention_common.h"

namespace flash_cann {

constexpr uint32_t kVectorCoresPerCube = 2;
enum class RowOp { kSubtract, kMultiply };
constexpr uint32_t kFloatsPerRepeat = 64;  // 256 bytes of fp32 per vector repeat
constexpr uint32_t kFloatsPerBlock = 8;    // 32 bytes of fp32
constexpr float kLowest = -3.40282347e+38f;
constexpr float kSmallest = 1.17549435e-38f;

template <typename T, bool CAUSAL, bool MASK>
class FlashAttentionVector {
public:
    __aicore__ inline void Init(GM_ADDR keyPaddingMask, GM_ADDR out, GM_ADDR softmaxLse,
                                GM_ADDR userWorkspace, const TilingData& tiling, AscendC::TPipe* pipe)
    {
        t_ = tiling;
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx()) / kVectorCoresPerCube;
        sub_ = static_cast<uint32_t>(AscendC::GetSubBlockIdx());
        negInf_ = -__builtin_inff();
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(out));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(softmaxLse));
        if (MASK) {
            mask_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(keyPaddingMask));
        }
        exchange_.Init(userWorkspace, core_, t_);

        const BufferBytes bytes = ComputeBufferBytes(t_, sizeof(T));
        pipe->InitBuffer(sQue_, 1, bytes.sUb);
        pipe->InitBuffer(pQue_, 1, bytes.pUb);
        pipe->InitBuffer(rowBuf_, bytes.rowUb * (kRowStats - 1));
        pipe->InitBuffer(lseQue_, 1, bytes.rowUb);
        pipe->InitBuffer(brcBuf_, bytes.brcUb);
        pipe->InitBuffer(keyBuf_, bytes.keyUb * kKeyRows);
        pipe->InitBuffer(maskQue_, 1, bytes.maskUb);
        pipe->InitBuffer(maskHalfBuf_, bytes.maskHalfUb);
        pipe->InitBuffer(bitsBuf_, bytes.bitsUb);
        pipe->InitBuffer(oQue_, 1, bytes.oUb);
        pipe->InitBuffer(accBuf_, bytes.accUb);
        pipe->InitBuffer(outQue_, 1, bytes.outUb);

        const uint32_t rowFloats = bytes.rowUb / sizeof(float);
        rowMax_ = rowBuf_.template GetWithOffset<float>(rowFloats, 0);
        rowSum_ = rowBuf_.template GetWithOffset<float>(rowFloats, bytes.rowUb);
        blockMax_ = rowBuf_.template GetWithOffset<float>(rowFloats, 2 * bytes.rowUb);
        blockSum_ = rowBuf_.template GetWithOffset<float>(rowFloats, 3 * bytes.rowUb);
        alpha_ = rowBuf_.template GetWithOffset<float>(rowFloats, 4 * bytes.rowUb);
        broadcast_ = brcBuf_.template Get<float>();
        keyBias_ = keyBuf_.template GetWithOffset<float>(t_.blockK, 0);
        column_ = keyBuf_.template GetWithOffset<float>(t_.blockK, bytes.keyUb);
        keyScratch_ = keyBuf_.template GetWithOffset<float>(t_.blockK, 2 * bytes.keyUb);
        maskHalf_ = maskHalfBuf_.template Get<half>();
        bits_ = bitsBuf_.template Get<uint8_t>();
        acc_ = accBuf_.template Get<float>();
        AscendC::CreateVecIndex(column_, 0.0f, t_.blockK);  // column index, for causal limits
    }

    __aicore__ inline void Process()
    {
        if (core_ >= t_.usedCores) {
            return;
        }
        uint64_t cursor = t_.rowStart[core_];
        QueryTile tile;
        while (NextTile(t_, cursor, t_.rowStart[core_ + 1], tile)) {
            // This vector core's rows of the tile: the first or the second half.
            const uint32_t firstHalf = (tile.rows + 1) / 2;
            rows_ = sub_ == 0 ? firstHalf : tile.rows - firstHalf;
            rowOffset_ = sub_ == 0 ? 0 : firstHalf;
            InitTile();
            const uint32_t keyEnd = KeyEnd<CAUSAL>(t_, tile);
            const uint32_t blocks = (keyEnd + t_.blockK - 1) / t_.blockK;
            for (uint32_t block = NextVisibleBlock<MASK>(t_, mask_, tile.batch, keyEnd, 0);
                 block < blocks;
                 block = NextVisibleBlock<MASK>(t_, mask_, tile.batch, keyEnd, block + 1)) {
                const uint32_t slot = blockSeq_++ % 2;
                SoftMaxCompute(tile, keyEnd, block, slot);
                ProcessVec2(slot);
            }
            DataCopyOut(tile);
        }
    }

private:
    __aicore__ inline void InitTile()
    {
        if (rows_ == 0) {
            return;
        }
        AscendC::PipeBarrier<PIPE_V>();  // the previous tile's epilogue still reads m, l and acc
        AscendC::Duplicate(rowMax_, negInf_, rows_);
        AscendC::Duplicate(rowSum_, 0.0f, rows_);
        AscendC::Duplicate(acc_, 0.0f, rows_ * t_.headDimPad);
        AscendC::PipeBarrier<PIPE_V>();
    }

    // keyBias_[c] = 0 if column c of the block holds a key this tile may attend to,
    // -inf if it is past the block's last key or padded out by the key mask.
    __aicore__ inline void BuildKeyBias(const QueryTile& tile, uint32_t block, uint32_t columns)
    {
        const uint32_t bk = t_.blockK;
        AscendC::Duplicate(keyBias_, 0.0f, bk);
        AscendC::PipeBarrier<PIPE_V>();
        if (columns < bk) {
            AscendC::Compares(bits_, column_, static_cast<float>(columns), AscendC::CMPMODE::LT, bk);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Select(keyBias_, bits_, keyBias_, negInf_,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, bk);
            AscendC::PipeBarrier<PIPE_V>();
        }
        if (MASK) {
            AscendC::LocalTensor<uint8_t> maskBytes = maskQue_.template AllocTensor<uint8_t>();
            AscendC::DataCopyPad(maskBytes,
                                 mask_[uint64_t{tile.batch} * t_.seqlenK + uint64_t{block} * bk],
                                 AscendC::DataCopyExtParams(1, columns, 0, 0, 0),
                                 AscendC::DataCopyPadExtParams<uint8_t>(false, 0, 0, 0));
            maskQue_.EnQue(maskBytes);
            maskBytes = maskQue_.template DeQue<uint8_t>();
            // Bytes past `columns` are stale; the bias there is already -inf.
            AscendC::Cast(maskHalf_, maskBytes, AscendC::RoundMode::CAST_NONE, bk);
            maskQue_.FreeTensor(maskBytes);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Cast(keyScratch_, maskHalf_, AscendC::RoundMode::CAST_NONE, bk);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Compares(bits_, keyScratch_, 0.5f, AscendC::CMPMODE::GT, bk);  // true = attend
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Select(keyBias_, bits_, keyBias_, negInf_,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, bk);
            AscendC::PipeBarrier<PIPE_V>();
        }
    }

    // dst[r][c] (op)= rowValue[r] for the rows of a row-major [rows_][width] tile: the
    // per-row values are broadcast to one 32-byte block each (Brcb) and read with block
    // stride 0, 64 columns per instruction.
    template <RowOp OP>
    __aicore__ inline void RowBroadcast(const AscendC::LocalTensor<float>& dst,
                                        const AscendC::LocalTensor<float>& rowValue, uint32_t width)
    {
        AscendC::Brcb(broadcast_, rowValue, static_cast<uint8_t>((rows_ + 7) / 8),
                      AscendC::BrcbRepeatParams(1, 8));
        AscendC::PipeBarrier<PIPE_V>();
        const uint8_t pitch = static_cast<uint8_t>(width / kFloatsPerBlock);
        for (uint32_t col = 0; col < width; col += kFloatsPerRepeat) {
            const uint64_t mask = MinU32(kFloatsPerRepeat, width - col);
            const AscendC::BinaryRepeatParams params(1, 1, 0, pitch, pitch, 1);
            if constexpr (OP == RowOp::kSubtract) {
                AscendC::Sub(dst[col], dst[col], broadcast_, mask, static_cast<uint8_t>(rows_), params);
            } else {
                AscendC::Mul(dst[col], dst[col], broadcast_, mask, static_cast<uint8_t>(rows_), params);
            }
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    // result[r] = max (or sum) of row r of the [rows_][blockK] tile: per 32-byte block
    // (BlockReduce), then over the row's blocks (WholeReduce). `scratch` holds one value
    // per block.
    template <bool MAX>
    __aicore__ inline void RowReduce(const AscendC::LocalTensor<float>& result,
                                     const AscendC::LocalTensor<float>& tile,
                                     const AscendC::LocalTensor<float>& scratch)
    {
        const uint32_t bk = t_.blockK;
        const uint32_t repeatsPerRow = bk / kFloatsPerRepeat;
        const uint32_t rowsPerCall = 255 / repeatsPerRow;  // at most 255 repeats per call
        for (uint32_t row = 0; row < rows_; row += rowsPerCall) {
            const int32_t repeats = static_cast<int32_t>(MinU32(rowsPerCall, rows_ - row) * repeatsPerRow);
            if (MAX) {
                AscendC::BlockReduceMax(scratch[row * bk / kFloatsPerBlock], tile[row * bk], repeats,
                                        static_cast<int32_t>(kFloatsPerRepeat), 1, 1, 8);
            } else {
                AscendC::BlockReduceSum(scratch[row * bk / kFloatsPerBlock], tile[row * bk], repeats,
                                        static_cast<int32_t>(kFloatsPerRepeat), 1, 1, 8);
            }
        }
        AscendC::PipeBarrier<PIPE_V>();
        const int32_t perRow = static_cast<int32_t>(bk / kFloatsPerBlock);
        if (MAX) {
            AscendC::WholeReduceMax(result, scratch, perRow, static_cast<int32_t>(rows_), 1, 1,
                                    perRow / static_cast<int32_t>(kFloatsPerBlock),
                                    AscendC::ReduceOrder::ORDER_ONLY_VALUE);
        } else {
            AscendC::WholeReduceSum(result, scratch, perRow, static_cast<int32_t>(rows_), 1, 1,
                                    perRow / static_cast<int32_t>(kFloatsPerBlock));
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    // Causal rows of a block that crosses the diagonal: columns past the row's last
    // visible key become -inf.
    __aicore__ inline void MaskCausal(const AscendC::LocalTensor<float>& s, const QueryTile& tile,
                                      uint32_t block, uint32_t columns)
    {
        const uint32_t bk = t_.blockK;
        for (uint32_t r = 0; r < rows_; ++r) {
            const int64_t lastVisible = static_cast<int64_t>(tile.row0) + rowOffset_ + r +
                                        t_.causalOffset - static_cast<int64_t>(block) * bk;
            if (lastVisible >= static_cast<int64_t>(columns) - 1) {
                continue;  // the key bias already covers columns past the block's end
            }
            if (lastVisible < 0) {
                AscendC::Duplicate(s[r * bk], negInf_, bk);
            } else {
                AscendC::Compares(bits_, column_, static_cast<float>(lastVisible),
                                  AscendC::CMPMODE::LE, bk);
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Select(s[r * bk], bits_, s[r * bk], negInf_,
                                AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, bk);
            }
            AscendC::PipeBarrier<PIPE_V>();
        }
    }

    __aicore__ inline void SoftMaxCompute(const QueryTile& tile, uint32_t keyEnd, uint32_t block,
                                          uint32_t slot)
    {
        const uint32_t bk = t_.blockK;
        const uint32_t columns = MinU32(bk, keyEnd - block * bk);
        const uint32_t count = rows_ * bk;
        AscendC::CrossCoreWaitFlag(kFlagScores);
        if (rows_ > 0) {
            AscendC::LocalTensor<float> s = sQue_.template AllocTensor<float>();
            AscendC::DataCopy(s, exchange_.Scores(slot, rowOffset_ * bk), count);
            sQue_.EnQue(s);
            s = sQue_.template DeQue<float>();
            AscendC::Muls(s, s, t_.scale, count);
            AscendC::PipeBarrier<PIPE_V>();
            if (MASK || columns < bk) {
                BuildKeyBias(tile, block, columns);
                for (uint32_t col = 0; col < bk; col += kFloatsPerRepeat) {
                    const uint8_t pitch = static_cast<uint8_t>(bk / kFloatsPerBlock);
                    AscendC::Add(s[col], s[col], keyBias_[col], kFloatsPerRepeat,
                                 static_cast<uint8_t>(rows_),
                                 AscendC::BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
                }
                AscendC::PipeBarrier<PIPE_V>();
            }
            if (CAUSAL) {
                MaskCausal(s, tile, block, columns);
            }
            // The P buffer doubles as reduction scratch until P is written into it.
            AscendC::LocalTensor<T> p = pQue_.template AllocTensor<T>();
            const AscendC::LocalTensor<float> scratch = p.template ReinterpretCast<float>();
            RowReduce<true>(blockMax_, s, scratch);
            // m' = max(m, block max); alpha = exp(m - m'); subtract m' clamped to a finite
            // value, so rows with no visible key so far stay at -inf, never NaN.
            AscendC::Max(blockSum_, rowMax_, blockMax_, rows_);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Maxs(blockMax_, blockSum_, kLowest, rows_);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Sub(alpha_, rowMax_, blockMax_, rows_);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Exp(alpha_, alpha_, rows_);
            AscendC::Adds(rowMax_, blockSum_, 0.0f, rows_);
            RowBroadcast<RowOp::kSubtract>(s, blockMax_, bk);
            AscendC::Exp(s, s, count);
            AscendC::PipeBarrier<PIPE_V>();
            RowReduce<false>(blockSum_, s, scratch);
            AscendC::Mul(rowSum_, rowSum_, alpha_, rows_);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Add(rowSum_, rowSum_, blockSum_, rows_);
            AscendC::Cast(p, s, AscendC::RoundMode::CAST_RINT, count);
            sQue_.FreeTensor(s);
            pQue_.EnQue(p);
            p = pQue_.template DeQue<T>();
            AscendC::DataCopy(exchange_.Probs(slot, rowOffset_ * bk), p, count);
            pQue_.FreeTensor(p);
        }
        AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(kFlagProbs);
    }

    __aicore__ inline void ProcessVec2(uint32_t slot)
    {
        const uint32_t d = t_.headDimPad;
        if (rows_ > 0) {
            RowBroadcast<RowOp::kMultiply>(acc_, alpha_, d);
        }
        AscendC::CrossCoreWaitFlag(kFlagOutput);
        if (rows_ > 0) {
            AscendC::LocalTensor<float> o = oQue_.template AllocTensor<float>();
            AscendC::DataCopy(o, exchange_.Output(slot, rowOffset_ * d), rows_ * d);
            oQue_.EnQue(o);
            o = oQue_.template DeQue<float>();
            AscendC::Add(acc_, acc_, o, rows_ * d);
            AscendC::PipeBarrier<PIPE_V>();
            oQue_.FreeTensor(o);
        }
    }

    // out = acc / l (0 where l = 0), lse = m + ln(l) (-inf where l = 0).
    __aicore__ inline void DataCopyOut(const QueryTile& tile)
    {
        if (rows_ == 0) {
            return;
        }
        const uint32_t d = t_.headDimPad;
        const uint32_t row = tile.row0 + rowOffset_;
        AscendC::Maxs(blockSum_, rowSum_, kSmallest, rows_);
        AscendC::Duplicate(alpha_, 1.0f, rows_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Div(alpha_, alpha_, blockSum_, rows_);
        AscendC::PipeBarrier<PIPE_V>();
        RowBroadcast<RowOp::kMultiply>(acc_, alpha_, d);
        AscendC::LocalTensor<T> out = outQue_.template AllocTensor<T>();
        AscendC::Cast(out, acc_, AscendC::RoundMode::CAST_RINT, rows_ * d);
        outQue_.EnQue(out);
        out = outQue_.template DeQue<T>();
        const uint64_t outOffset = uint64_t{tile.batch} * t_.qStrideBatch +
                                   uint64_t{tile.headQ} * t_.qStrideHead + uint64_t{row} * t_.qStrideRow;
        AscendC::DataCopyPad(out_[outOffset], out,
                             AscendC::DataCopyExtParams(static_cast<uint16_t>(rows_), t_.headDim * sizeof(T), 0,
                                                        static_cast<uint32_t>((t_.qStrideRow - t_.headDim) * sizeof(T)), 0));
        outQue_.FreeTensor(out);

        AscendC::LocalTensor<float> lse = lseQue_.template AllocTensor<float>();
        AscendC::Ln(lse, rowSum_, rows_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Add(lse, lse, rowMax_, rows_);
        lseQue_.EnQue(lse);
        lse = lseQue_.template DeQue<float>();
        const uint64_t lseOffset = (uint64_t{tile.batch} * t_.headsQ + tile.headQ) * t_.seqlenQ + row;
        AscendC::DataCopyPad(lse_[lseOffset], lse,
                             AscendC::DataCopyExtParams(1, rows_ * sizeof(float), 0, 0, 0));
        lseQue_.FreeTensor(lse);
    }

    TilingData t_;
    uint32_t core_ = 0;
    uint32_t sub_ = 0;
    uint32_t rows_ = 0;       // this vector core's rows of the current tile
    uint32_t rowOffset_ = 0;  // their first row within the tile
    uint32_t blockSeq_ = 0;
    float negInf_ = 0;
    ExchangeBuffers<T> exchange_;
    AscendC::GlobalTensor<T> out_;
    AscendC::GlobalTensor<float> lse_;
    AscendC::GlobalTensor<uint8_t> mask_;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> sQue_, oQue_, maskQue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, 1> pQue_, outQue_, lseQue_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> rowBuf_, brcBuf_, keyBuf_, maskHalfBuf_, bitsBuf_,
        accBuf_;
    AscendC::LocalTensor<float> rowMax_, rowSum_, blockMax_, blockSum_, alpha_, broadcast_;
    AscendC::LocalTensor<float> keyBias_, column_, keyScratch_, acc_;
    AscendC::LocalTensor<half> maskHalf_;
    AscendC::LocalTensor<uint8_t> bits_;
};

}  // namespace flash_cann

#endif
