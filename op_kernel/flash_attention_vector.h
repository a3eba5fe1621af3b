// The vector (AIV) half of the FlashAttention forward kernel: the online softmax, with
// the output update one round behind it.
//
// The two vector cores of an AI core split each query tile's rows. Per tile, with the
// rounds of flash_cann_tiling.h (MakeRound):
//   SoftmaxRound(0), then per round r >= 1: SoftmaxRound(r), UpdateOutput(r - 1); then
//   UpdateOutput(last) and DataCopyOut.
// SoftmaxRound(r) runs while the cube computes P.V(r - 1) and S(r + 1): it waits only
// for S(r). UpdateOutput(r - 1) then needs O(r - 1) = P(r - 1) V(r - 1) and the rescale
// factor alpha(r - 1) that SoftmaxRound(r - 1) left in a ring of kAlphaRing entries.
//   SoftmaxRound  wait for S; per slice of vecRows rows (double-buffered): scale; key
//                 bias (tail and key padding, one row per round); causal diagonal as
//                 one 2-D compare + select; row max m'; alpha = exp(m - m') into the
//                 ring; P = exp(S - m'); l = l alpha + rowsum(P); P -> workspace; one
//                 flag to the cube per round
//   UpdateOutput  wait for O; per slice: acc = acc alpha + O (acc = O in a tile's first
//                 round)
//   DataCopyOut   out = acc / l, lse = m + ln(l)
// Statistics are fp32; rows that see no key keep m = -inf, l = 0 and produce out = 0 and
// lse = -inf (clamping m to the lowest float where it is subtracted keeps -inf - -inf
// out). No scalar reads of UB, so no scalar-vector syncs. Every PipeBarrier<PIPE_V>
// separates a vector instruction from a later one that reads what it wrote (or
// overwrites what it read); independent instructions are not separated.
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
        pipe->InitBuffer(sQue_, kVecBuffers, bytes.sUb);
        pipe->InitBuffer(pQue_, kVecBuffers, bytes.pUb);
        pipe->InitBuffer(oQue_, kVecBuffers, bytes.oUb);
        pipe->InitBuffer(outQue_, kVecBuffers, bytes.outUb);
        pipe->InitBuffer(accBuf_, bytes.accUb);
        pipe->InitBuffer(rowBuf_, bytes.rowUb * kRowStats);
        pipe->InitBuffer(lseQue_, 1, bytes.rowUb);
        pipe->InitBuffer(brcBuf_, bytes.brcUb);
        pipe->InitBuffer(keyBuf_, bytes.keyUb * kKeyRows);
        pipe->InitBuffer(bitsBuf_, bytes.bitsUb);
        if (MASK) {
            pipe->InitBuffer(maskQue_, 1, bytes.maskUb);
            pipe->InitBuffer(maskHalfBuf_, bytes.maskHalfUb);
            maskHalf_ = maskHalfBuf_.template Get<half>();
        }
        if (CAUSAL) {
            pipe->InitBuffer(diagBuf_, bytes.diagUb);
            diag_ = diagBuf_.template Get<float>();
        }

        const uint32_t rowFloats = bytes.rowUb / sizeof(float);
        rowMax_ = rowBuf_.template GetWithOffset<float>(rowFloats, 0);
        rowSum_ = rowBuf_.template GetWithOffset<float>(rowFloats, bytes.rowUb);
        sliceMax_ = rowBuf_.template GetWithOffset<float>(rowFloats, 2 * bytes.rowUb);
        sliceSum_ = rowBuf_.template GetWithOffset<float>(rowFloats, 3 * bytes.rowUb);
        for (uint32_t i = 0; i < kAlphaRing; ++i) {
            alpha_[i] = rowBuf_.template GetWithOffset<float>(rowFloats, (4 + i) * bytes.rowUb);
        }
        broadcast_ = brcBuf_.template Get<float>();
        const uint32_t w = RoundKeys(t_);
        keyBias_ = keyBuf_.template GetWithOffset<float>(w, 0);
        column_ = keyBuf_.template GetWithOffset<float>(w, bytes.keyUb);
        keyScratch_ = keyBuf_.template GetWithOffset<float>(w, 2 * bytes.keyUb);
        bits_ = bitsBuf_.template Get<uint8_t>();
        acc_ = accBuf_.template Get<float>();
        AscendC::CreateVecIndex(column_, 0.0f, w);  // column index, for the round's last key
        AscendC::PipeBarrier<PIPE_V>();  // column_ -> every round's Compares
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
            const uint32_t keyEnd = KeyEnd<CAUSAL>(t_, tile);
            const uint32_t rounds = RoundCount(t_, keyEnd);
            InitTile(rounds);
            for (uint32_t round = 0; round < rounds; ++round) {
                SoftmaxRound(tile, MakeRound(t_, keyEnd, round), roundSeq_ + round);
                if (round > 0) {
                    UpdateOutput(roundSeq_ + round - 1, round == 1);
                }
            }
            if (rounds > 0) {
                UpdateOutput(roundSeq_ + rounds - 1, rounds == 1);
            }
            roundSeq_ += rounds;
            DataCopyOut(tile);
        }
    }

private:
    __aicore__ inline uint32_t SliceRows(uint32_t first) const
    {
        return MinU32(t_.vecRows, rows_ - first);
    }

    __aicore__ inline void InitTile(uint32_t rounds)
    {
        if (rows_ == 0) {
            return;
        }
        AscendC::Duplicate(rowMax_, negInf_, rows_);
        AscendC::Duplicate(rowSum_, 0.0f, rows_);
        if (rounds == 0) {  // no key at all: out = acc / max(l, tiny) = 0
            AscendC::Duplicate(acc_, 0.0f, rows_ * t_.headDimPad);
            AscendC::PipeBarrier<PIPE_V>();  // m, l, acc -> the epilogue that follows at once
        }
    }

    // keyBias_[c] = 0 if column c of the round holds a key the tile may attend to, -inf
    // if it is past the round's last key or padded out by the key mask. Built once per
    // round with vector ops from one copy of the round's mask bytes.
    __aicore__ inline void BuildKeyBias(const QueryTile& tile, const KeyRound& round)
    {
        const uint32_t w = round.width;
        AscendC::Duplicate(keyBias_, 0.0f, w);
        if (round.columns < w) {
            AscendC::Compares(bits_, column_, static_cast<float>(round.columns), AscendC::CMPMODE::LT, w);
            AscendC::PipeBarrier<PIPE_V>();  // Duplicate and Compares -> Select
            AscendC::Select(keyBias_, bits_, keyBias_, negInf_,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, w);
        }
        if (MASK) {
            AscendC::LocalTensor<uint8_t> maskBytes = maskQue_.template AllocTensor<uint8_t>();
            AscendC::DataCopyPad(maskBytes, mask_[uint64_t{tile.batch} * t_.seqlenK + round.key0],
                                 AscendC::DataCopyExtParams(1, round.columns, 0, 0, 0),
                                 AscendC::DataCopyPadExtParams<uint8_t>(false, 0, 0, 0));
            maskQue_.EnQue(maskBytes);
            maskBytes = maskQue_.template DeQue<uint8_t>();
            // Bytes past `columns` are stale; the bias there is already -inf.
            AscendC::Cast(maskHalf_, maskBytes, AscendC::RoundMode::CAST_NONE, w);
            AscendC::PipeBarrier<PIPE_V>();  // Cast -> Cast
            maskQue_.FreeTensor(maskBytes);
            AscendC::Cast(keyScratch_, maskHalf_, AscendC::RoundMode::CAST_NONE, w);
            AscendC::PipeBarrier<PIPE_V>();  // Cast -> Compares; Select above -> Compares (bits)
            AscendC::Compares(bits_, keyScratch_, 0.5f, AscendC::CMPMODE::GT, w);  // true = attend
            AscendC::PipeBarrier<PIPE_V>();  // Compares -> Select
            AscendC::Select(keyBias_, bits_, keyBias_, negInf_,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, w);
        }
        // keyBias_ and bits_ are next touched after the barrier that follows each slice's
        // Muls, so no barrier is needed here.
    }

    // diag_[r][c] = c - r for a slice of width `width`: row r of a slice sees column c iff
    // c - r <= (first row's last visible key - round's first key). Rebuilt only when the
    // round width changes (a tile's last round can be narrower).
    __aicore__ inline void PrepareDiagonal(uint32_t width)
    {
        if (diagWidth_ == width) {
            return;
        }
        diagWidth_ = width;
        AscendC::CreateVecIndex(diag_, 0.0f, t_.vecRows * width);  // r * width + c
        AscendC::CreateVecIndex(keyScratch_, 0.0f, kFloatsPerRepeat);
        AscendC::PipeBarrier<PIPE_V>();  // CreateVecIndex -> Muls
        AscendC::Muls(keyScratch_, keyScratch_, static_cast<float>(width + 1), kFloatsPerRepeat);
        AscendC::PipeBarrier<PIPE_V>();  // Muls -> Brcb in RowBroadcast
        RowBroadcast<RowOp::kSubtract>(diag_, keyScratch_, t_.vecRows, width);
    }

    // dst[r][c] (op)= rowValue[r] for the `rows` rows of a row-major [rows][width] tile:
    // the per-row values are broadcast to one 32-byte block each (Brcb) and read with
    // block stride 0, 64 columns per instruction.
    template <RowOp OP>
    __aicore__ inline void RowBroadcast(const AscendC::LocalTensor<float>& dst,
                                        const AscendC::LocalTensor<float>& rowValue, uint32_t rows,
                                        uint32_t width)
    {
        AscendC::Brcb(broadcast_, rowValue, static_cast<uint8_t>((rows + 7) / 8),
                      AscendC::BrcbRepeatParams(1, 8));
        AscendC::PipeBarrier<PIPE_V>();  // Brcb -> the row operation
        const uint8_t pitch = static_cast<uint8_t>(width / kFloatsPerBlock);
        for (uint32_t col = 0; col < width; col += kFloatsPerRepeat) {
            const uint64_t mask = MinU32(kFloatsPerRepeat, width - col);
            const AscendC::BinaryRepeatParams params(1, 1, 0, pitch, pitch, 1);
            if constexpr (OP == RowOp::kSubtract) {
                AscendC::Sub(dst[col], dst[col], broadcast_, mask, static_cast<uint8_t>(rows), params);
            } else {
                AscendC::Mul(dst[col], dst[col], broadcast_, mask, static_cast<uint8_t>(rows), params);
            }
        }
        AscendC::PipeBarrier<PIPE_V>();  // dst -> its next reader; broadcast_ -> next Brcb
    }

    // result[r] = max (or sum) of row r of a [rows][width] tile (width <= 512): per 32-byte
    // block (BlockReduce), then over the row's blocks (WholeReduce). `scratch` holds one
    // value per block.
    template <bool MAX>
    __aicore__ inline void RowReduce(const AscendC::LocalTensor<float>& result,
                                     const AscendC::LocalTensor<float>& tile,
                                     const AscendC::LocalTensor<float>& scratch, uint32_t rows,
                                     uint32_t width)
    {
        const uint32_t repeatsPerRow = width / kFloatsPerRepeat;
        const uint32_t rowsPerCall = 255 / repeatsPerRow;  // at most 255 repeats per call
        for (uint32_t row = 0; row < rows; row += rowsPerCall) {
            const int32_t repeats = static_cast<int32_t>(MinU32(rowsPerCall, rows - row) * repeatsPerRow);
            if (MAX) {
                AscendC::BlockReduceMax(scratch[row * width / kFloatsPerBlock], tile[row * width], repeats,
                                        static_cast<int32_t>(kFloatsPerRepeat), 1, 1, 8);
            } else {
                AscendC::BlockReduceSum(scratch[row * width / kFloatsPerBlock], tile[row * width], repeats,
                                        static_cast<int32_t>(kFloatsPerRepeat), 1, 1, 8);
            }
        }
        AscendC::PipeBarrier<PIPE_V>();  // BlockReduce -> WholeReduce
        const int32_t perRow = static_cast<int32_t>(width / kFloatsPerBlock);
        if (MAX) {
            AscendC::WholeReduceMax(result, scratch, perRow, static_cast<int32_t>(rows), 1, 1,
                                    perRow / static_cast<int32_t>(kFloatsPerBlock),
                                    AscendC::ReduceOrder::ORDER_ONLY_VALUE);
        } else {
            AscendC::WholeReduceSum(result, scratch, perRow, static_cast<int32_t>(rows), 1, 1,
                                    perRow / static_cast<int32_t>(kFloatsPerBlock));
        }
        AscendC::PipeBarrier<PIPE_V>();  // result -> its reader; scratch -> its next writer
    }

    // Causal rows of a slice that crosses the diagonal: columns past each row's last
    // visible key become -inf, for the whole slice at once.
    __aicore__ inline void MaskCausal(const AscendC::LocalTensor<float>& s, const QueryTile& tile,
                                      const KeyRound& round, uint32_t first, uint32_t rows)
    {
        const int64_t limit = static_cast<int64_t>(tile.row0) + rowOffset_ + first + t_.causalOffset -
                              static_cast<int64_t>(round.key0);
        if (limit >= static_cast<int64_t>(round.columns) - 1) {
            return;  // every row sees every key of the round
        }
        // Below -vecRows no row sees any column: clamp so the float compare stays exact.
        const float clamped = static_cast<float>(limit < -static_cast<int64_t>(t_.vecRows)
                                                     ? -static_cast<int64_t>(t_.vecRows) - 1
                                                     : limit);
        const uint32_t count = rows * round.width;
        AscendC::Compares(bits_, diag_, clamped, AscendC::CMPMODE::LE, count);
        AscendC::PipeBarrier<PIPE_V>();  // Compares -> Select
        AscendC::Select(s, bits_, s, negInf_, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
        AscendC::PipeBarrier<PIPE_V>();  // s -> row max; bits_ -> next Compares
    }

    __aicore__ inline void SoftmaxRound(const QueryTile& tile, const KeyRound& round, uint32_t seq)
    {
        AscendC::CrossCoreWaitFlag(kFlagScores);
        if (rows_ > 0) {
            const bool bias = MASK || round.columns < round.width;
            if (bias) {
                BuildKeyBias(tile, round);
            }
            if (CAUSAL) {
                PrepareDiagonal(round.width);
            }
            for (uint32_t first = 0; first < rows_; first += t_.vecRows) {
                SoftmaxSlice(tile, round, seq, first, SliceRows(first), bias);
            }
        }
        AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(kFlagProbs);
    }

    __aicore__ inline void SoftmaxSlice(const QueryTile& tile, const KeyRound& round, uint32_t seq,
                                        uint32_t first, uint32_t rows, bool bias)
    {
        const uint32_t w = round.width;
        const uint32_t count = rows * w;
        const uint32_t slot = seq % 2;
        AscendC::LocalTensor<float> s = sQue_.template AllocTensor<float>();
        AscendC::DataCopy(s, exchange_.Scores(slot, (rowOffset_ + first) * w), count);
        sQue_.EnQue(s);
        s = sQue_.template DeQue<float>();
        AscendC::Muls(s, s, t_.scale, count);
        AscendC::PipeBarrier<PIPE_V>();  // Muls -> bias / causal / row max
        if (bias) {
            const uint8_t pitch = static_cast<uint8_t>(w / kFloatsPerBlock);
            for (uint32_t col = 0; col < w; col += kFloatsPerRepeat) {
                AscendC::Add(s[col], s[col], keyBias_[col], kFloatsPerRepeat, static_cast<uint8_t>(rows),
                             AscendC::BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
            }
            AscendC::PipeBarrier<PIPE_V>();  // Add -> causal / row max
        }
        if (CAUSAL) {
            MaskCausal(s, tile, round, first, rows);
        }
        // The P buffer doubles as reduction scratch until P is written into it.
        AscendC::LocalTensor<T> p = pQue_.template AllocTensor<T>();
        const AscendC::LocalTensor<float> scratch = p.template ReinterpretCast<float>();
        const AscendC::LocalTensor<float> m = rowMax_[first];
        const AscendC::LocalTensor<float> l = rowSum_[first];
        const AscendC::LocalTensor<float> alpha = alpha_[seq % kAlphaRing][first];
        RowReduce<true>(sliceMax_, s, scratch, rows, w);
        // m' = max(m, slice max); alpha = exp(m - m'); subtract m' clamped to a finite
        // value, so rows with no visible key so far stay at -inf, never NaN.
        AscendC::Max(sliceSum_, m, sliceMax_, rows);
        AscendC::PipeBarrier<PIPE_V>();  // Max -> Maxs
        AscendC::Maxs(sliceMax_, sliceSum_, kLowest, rows);
        AscendC::PipeBarrier<PIPE_V>();  // Maxs -> Sub, and the broadcast of m'
        AscendC::Sub(alpha, m, sliceMax_, rows);
        AscendC::PipeBarrier<PIPE_V>();  // Sub -> Exp; Sub reads m before Adds rewrites it
        AscendC::Exp(alpha, alpha, rows);
        AscendC::Adds(m, sliceSum_, 0.0f, rows);
        RowBroadcast<RowOp::kSubtract>(s, sliceMax_, rows, w);
        AscendC::Exp(s, s, count);
        AscendC::PipeBarrier<PIPE_V>();  // Exp -> row sum (which also rewrites sliceSum_)
        RowReduce<false>(sliceSum_, s, scratch, rows, w);
        AscendC::Mul(l, l, alpha, rows);
        AscendC::PipeBarrier<PIPE_V>();  // Mul -> Add
        AscendC::Add(l, l, sliceSum_, rows);
        AscendC::Cast(p, s, AscendC::RoundMode::CAST_RINT, count);
        sQue_.FreeTensor(s);
        pQue_.EnQue(p);
        p = pQue_.template DeQue<T>();
        AscendC::DataCopy(exchange_.Probs(slot, (rowOffset_ + first) * w), p, count);
        pQue_.FreeTensor(p);
    }

    // acc = acc * alpha + O for the round with sequence number `seq` (acc = O in the
    // tile's first round).
    __aicore__ inline void UpdateOutput(uint32_t seq, bool firstRound)
    {
        const uint32_t d = t_.headDimPad;
        AscendC::CrossCoreWaitFlag(kFlagOutput);
        for (uint32_t first = 0; first < rows_; first += t_.vecRows) {
            const uint32_t rows = SliceRows(first);
            AscendC::LocalTensor<float> o = oQue_.template AllocTensor<float>();
            AscendC::DataCopy(o, exchange_.Output(seq % 2, (rowOffset_ + first) * d), rows * d);
            oQue_.EnQue(o);
            o = oQue_.template DeQue<float>();
            const AscendC::LocalTensor<float> acc = acc_[first * d];
            if (firstRound) {
                AscendC::Adds(acc, o, 0.0f, rows * d);
            } else {
                RowBroadcast<RowOp::kMultiply>(acc, alpha_[seq % kAlphaRing][first], rows, d);
                AscendC::Add(acc, acc, o, rows * d);
            }
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
        // After a round, the last l and acc writes are ordered before this point by the
        // hand-offs of the O update (P out -> cube -> O in); InitTile orders the no-round case.
        const AscendC::LocalTensor<float> reciprocal = sliceMax_;
        AscendC::Maxs(sliceSum_, rowSum_, kSmallest, rows_);
        AscendC::Duplicate(reciprocal, 1.0f, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Maxs, Duplicate -> Div
        AscendC::Div(reciprocal, reciprocal, sliceSum_, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Div -> Brcb
        const uint64_t outOffset = uint64_t{tile.batch} * t_.qStrideBatch +
                                   uint64_t{tile.headQ} * t_.qStrideHead + uint64_t{row} * t_.qStrideRow;
        for (uint32_t first = 0; first < rows_; first += t_.vecRows) {
            const uint32_t rows = SliceRows(first);
            RowBroadcast<RowOp::kMultiply>(acc_[first * d], reciprocal[first], rows, d);
            AscendC::LocalTensor<T> out = outQue_.template AllocTensor<T>();
            AscendC::Cast(out, acc_[first * d], AscendC::RoundMode::CAST_RINT, rows * d);
            outQue_.EnQue(out);
            out = outQue_.template DeQue<T>();
            AscendC::DataCopyPad(out_[outOffset + uint64_t{first} * t_.qStrideRow], out,
                                 AscendC::DataCopyExtParams(static_cast<uint16_t>(rows), t_.headDim * sizeof(T), 0,
                                                            static_cast<uint32_t>((t_.qStrideRow - t_.headDim) * sizeof(T)), 0));
            outQue_.FreeTensor(out);
        }

        AscendC::LocalTensor<float> lse = lseQue_.template AllocTensor<float>();
        AscendC::Ln(lse, rowSum_, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Ln -> Add
        AscendC::Add(lse, lse, rowMax_, rows_);
        lseQue_.EnQue(lse);
        lse = lseQue_.template DeQue<float>();
        const uint64_t lseOffset = (uint64_t{tile.batch} * t_.headsQ + tile.headQ) * t_.seqlenQ + row;
        AscendC::DataCopyPad(lse_[lseOffset], lse,
                             AscendC::DataCopyExtParams(1, rows_ * sizeof(float), 0, 0, 0));
        lseQue_.FreeTensor(lse);
        AscendC::PipeBarrier<PIPE_V>();  // Ln/Add read m and l before the next tile resets them
    }

    TilingData t_;
    uint32_t core_ = 0;
    uint32_t sub_ = 0;
    uint32_t rows_ = 0;       // this vector core's rows of the current tile
    uint32_t rowOffset_ = 0;  // their first row within the tile
    uint32_t roundSeq_ = 0;   // rounds before the current tile (workspace slot = seq % 2)
    uint32_t diagWidth_ = 0;  // width the causal template was built for
    float negInf_ = 0;
    ExchangeBuffers<T> exchange_;
    AscendC::GlobalTensor<T> out_;
    AscendC::GlobalTensor<float> lse_;
    AscendC::GlobalTensor<uint8_t> mask_;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> sQue_, oQue_, maskQue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, 1> pQue_, outQue_, lseQue_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> rowBuf_, brcBuf_, keyBuf_, maskHalfBuf_, bitsBuf_,
        accBuf_, diagBuf_;
    AscendC::LocalTensor<float> rowMax_, rowSum_, sliceMax_, sliceSum_, broadcast_;
    AscendC::LocalTensor<float> alpha_[kAlphaRing];
    AscendC::LocalTensor<float> keyBias_, column_, keyScratch_, acc_, diag_;
    AscendC::LocalTensor<half> maskHalf_;
    AscendC::LocalTensor<uint8_t> bits_;
};

}  // namespace flash_cann

#endif
