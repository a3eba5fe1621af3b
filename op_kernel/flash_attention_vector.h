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
//   SoftmaxRound  wait for S; per slice of vecRows rows (double-buffered): scale
//                 (softcap: s = c tanh(s / c)); ALiBi bias; key bias (tail and key
//                 padding, one row per round); the band (causal diagonal, sliding
//                 window) as one 2-D compare + select per side; row max m';
//                 alpha = exp(m - m') into the ring; P = exp(S - m');
//                 l = l alpha + rowsum(P); dropout; P -> workspace; one flag to the
//                 cube per round
//   UpdateOutput  wait for O; per slice: acc = acc alpha + O (acc = O in a tile's first
//                 round)
//   DataCopyOut   out = acc / l, lse = m + ln(l) (dropout: out = acc / l / (1 - p))
// Statistics are fp32; rows that see no key keep m = -inf, l = 0 and produce out = 0 and
// lse = -inf (clamping m to the lowest float where it is subtracted keeps -inf - -inf
// out). With attention sinks, every tile starts from m = sink, l = 1 (= exp(sink - m)):
// the sink joins each row's denominator, and a row that sees no key gives out = 0 and
// lse = sink.
//
// Dropout: once a slice's row sums have taken the undropped P, P = keep ? P : 0 with the
// Philox keep mask of the slice (flash_attention_philox.h; the counter is (key column,
// query row, query head, batch + offset), bit-identical to contract.variant.keep_mask),
// so P.V sums only the kept probabilities; 1 / (1 - p) is folded into the epilogue's
// 1 / l, and lse is not affected.
//
// FEATURES (the tiling key's F digit) compiles in the features of VariantTiling; which
// of them a launch uses is read from the tiling data (runtime branches, one binary).
//
// No scalar reads of UB, so no scalar-vector syncs (a tile's slope and sink are scalar
// reads of GM inputs). Every PipeBarrier<PIPE_V> separates a vector instruction from a
// later one that reads what it wrote (or overwrites what it read); independent
// instructions are not separated.
#ifndef FLASH_CANN_FLASH_ATTENTION_VECTOR_H
#define FLASH_CANN_FLASH_ATTENTION_VECTOR_H

#include "flash_attention_common.h"
#include "flash_attention_philox.h"
#include "flash_attention_vector_ops.h"

namespace flash_cann {

template <typename T, bool CAUSAL, bool MASK, bool FEATURES>
class FlashAttentionVector {
public:
    __aicore__ inline void Init(GM_ADDR keyPaddingMask, GM_ADDR cuSeqlensQ, GM_ADDR cuSeqlensK,
                                GM_ADDR alibiSlopes, GM_ADDR rngState, GM_ADDR sinks, GM_ADDR out,
                                GM_ADDR softmaxLse, GM_ADDR userWorkspace, const TilingData& tiling,
                                AscendC::TPipe* pipe)
    {
        t_ = tiling;
        if (t_.layout == static_cast<uint32_t>(Layout::TND)) {
            seqlens_.Init(cuSeqlensQ, cuSeqlensK);
        }
        const VariantTiling& v = t_.variant;
        // The band's bounds in diagonals (-1: open); causal is the right bound 0.
        rightBound_ = CAUSAL ? 0 : (FEATURES ? v.windowRight : -1);
        leftBound_ = FEATURES ? v.windowLeft : -1;
        alibi_ = FEATURES && v.alibi != static_cast<uint32_t>(Alibi::kNone);
        softcap_ = FEATURES && v.softcap > 0.0f;
        sinks_ = FEATURES && v.sinks != 0u;
        dropout_ = FEATURES && v.dropoutP > 0.0f;
        // The c - r template serves the band masks and the ALiBi distances.
        band_ = rightBound_ >= 0 || leftBound_ >= 0 || alibi_;
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx()) / kVectorCoresPerCube;
        sub_ = static_cast<uint32_t>(AscendC::GetSubBlockIdx());
        negInf_ = -__builtin_inff();
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(out));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(softmaxLse));
        if (MASK) {
            mask_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(keyPaddingMask));
        }
        if (alibi_) {
            slopes_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(alibiSlopes));
        }
        if (sinks_) {
            sinkLogits_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(sinks));
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
        if (band_) {
            pipe->InitBuffer(diagBuf_, bytes.diagUb);
            diag_ = diagBuf_.template Get<float>();
        }
        if (alibi_) {
            pipe->InitBuffer(alibiBuf_, bytes.alibiUb);
            distance_ = alibiBuf_.template Get<float>();
        }
        if (dropout_) {
            static_assert(DropoutScratchBytes(kMaxRoundKeys) == PhiloxScratchBytes(kMaxRoundKeys),
                          "the planner's dropout scratch must be PhiloxDropout's");
            pipe->InitBuffer(philoxBuf_, bytes.philoxUb);
            pipe->InitBuffer(keepBuf_, bytes.keepUb);
            keep_ = keepBuf_.template Get<uint8_t>();
            philox_.Init(rngState, v.dropoutThreshold, philoxBuf_.template Get<uint8_t>(),
                         RoundKeys(t_));
            outScale_ = 1.0f / (1.0f - v.dropoutP);
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
        CoreTiles<CAUSAL> tiles;
        tiles.Start(t_, seqlens_, core_);
        QueryTile tile;
        while (tiles.Next(tile)) {
            // This vector core's rows of the tile: the first or the second half.
            const uint32_t firstHalf = (tile.rows + 1) / 2;
            rows_ = sub_ == 0 ? firstHalf : tile.rows - firstHalf;
            rowOffset_ = sub_ == 0 ? 0 : firstHalf;
            const KeyRange keys = TileKeys<CAUSAL>(t_, tile);
            const uint32_t rounds = RoundCount(t_, keys);
            InitTile(tile, rounds);
            for (uint32_t round = 0; round < rounds; ++round) {
                SoftmaxRound(tile, MakeRound(t_, keys, round), roundSeq_ + round);
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

    __aicore__ inline void InitTile(const QueryTile& tile, uint32_t rounds)
    {
        if (rows_ == 0) {
            return;
        }
        if (sinks_) {  // the sink's term exp(sink - m) = 1 of the denominator, with m = sink
            AscendC::Duplicate(rowMax_, sinkLogits_.GetValue(tile.headQ), rows_);
            AscendC::Duplicate(rowSum_, 1.0f, rows_);
        } else {
            AscendC::Duplicate(rowMax_, negInf_, rows_);
            AscendC::Duplicate(rowSum_, 0.0f, rows_);
        }
        if (alibi_) {
            const uint64_t row = t_.variant.alibi == static_cast<uint32_t>(Alibi::kPerHead)
                                     ? 0
                                     : uint64_t{tile.batch} * t_.headsQ;
            slope_ = slopes_.GetValue(row + tile.headQ);
        }
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

    // diag_[r][c] = c - r for a slice of width `width`: with d = (the slice's first row +
    // causalOffset - the round's first key), the diagonal of row r is at column r + d, so
    // row r sees column c iff d - left <= c - r <= d + right, and its ALiBi distance is
    // |c - r - d|. Rebuilt only when the round width changes (a tile's last round can be
    // narrower).
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
        RowBroadcast<RowOp::kSubtract>(diag_, keyScratch_, broadcast_, t_.vecRows, width);
    }

    // result[r] = max (or sum) of row r of a [rows][width] tile (width <= kMaxRoundKeys):
    // per 32-byte block (BlockReduce); a row wider than 512 keys has more blocks than one
    // WholeReduce repeat takes (64 floats), so its blocks past the 64th are first folded
    // onto the first ones (one Max/Add per row); then over the row's first (up to) 64 block
    // results (WholeReduce). `scratch` holds one value per block.
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
        AscendC::PipeBarrier<PIPE_V>();  // BlockReduce -> fold / WholeReduce
        const uint32_t perRow = width / kFloatsPerBlock;
        const int32_t pitch = static_cast<int32_t>(perRow / kFloatsPerBlock);
        if (perRow > kFloatsPerRepeat) {
            const uint64_t extra = perRow - kFloatsPerRepeat;
            const AscendC::BinaryRepeatParams params(1, 1, 1, static_cast<uint8_t>(pitch),
                                                     static_cast<uint8_t>(pitch), static_cast<uint8_t>(pitch));
            if (MAX) {
                AscendC::Max(scratch, scratch, scratch[kFloatsPerRepeat], extra, static_cast<uint8_t>(rows),
                             params);
            } else {
                AscendC::Add(scratch, scratch, scratch[kFloatsPerRepeat], extra, static_cast<uint8_t>(rows),
                             params);
            }
            AscendC::PipeBarrier<PIPE_V>();  // fold -> WholeReduce
        }
        const int32_t mask = static_cast<int32_t>(MinU32(perRow, kFloatsPerRepeat));
        if (MAX) {
            AscendC::WholeReduceMax(result, scratch, mask, static_cast<int32_t>(rows), 1, 1, pitch,
                                    AscendC::ReduceOrder::ORDER_ONLY_VALUE);
        } else {
            AscendC::WholeReduceSum(result, scratch, mask, static_cast<int32_t>(rows), 1, 1, pitch);
        }
        AscendC::PipeBarrier<PIPE_V>();  // result -> its reader; scratch -> its next writer
    }

    // Diagonal of a slice's first row, in the round's columns (d of PrepareDiagonal).
    __aicore__ inline int64_t SliceDiagonal(const QueryTile& tile, const KeyRound& round,
                                            uint32_t first) const
    {
        return static_cast<int64_t>(tile.row0) + rowOffset_ + first + tile.causalOffset -
               static_cast<int64_t>(round.key0);
    }

    // A threshold on c - r, clamped to the template's range [-vecRows, width - 1] widened
    // by one on each side (what lies beyond compares alike), so the float compare is exact.
    __aicore__ inline float BandThreshold(int64_t diagonal, uint32_t width) const
    {
        const int64_t low = -static_cast<int64_t>(t_.vecRows) - 1;
        const int64_t high = width;
        return static_cast<float>(diagonal < low ? low : (diagonal > high ? high : diagonal));
    }

    // The band of a slice: columns right of each row's d + right or left of its d - left
    // become -inf, each side as one 2-D compare + select over the whole slice, and only
    // where the side cuts some row of the slice.
    __aicore__ inline void MaskBand(const AscendC::LocalTensor<float>& s, const QueryTile& tile,
                                    const KeyRound& round, uint32_t first, uint32_t rows)
    {
        const int64_t diagonal = SliceDiagonal(tile, round, first);
        const uint32_t count = rows * round.width;
        // Row 0 sees the fewest keys on the right, the last row the fewest on the left.
        if (rightBound_ >= 0 && diagonal + rightBound_ < static_cast<int64_t>(round.columns) - 1) {
            AscendC::Compares(bits_, diag_, BandThreshold(diagonal + rightBound_, round.width),
                              AscendC::CMPMODE::LE, count);
            AscendC::PipeBarrier<PIPE_V>();  // Compares -> Select
            AscendC::Select(s, bits_, s, negInf_, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
            AscendC::PipeBarrier<PIPE_V>();  // s -> row max / next Select; bits_ -> next Compares
        }
        if (leftBound_ >= 0 && diagonal - leftBound_ + static_cast<int64_t>(rows) - 1 > 0) {
            AscendC::Compares(bits_, diag_, BandThreshold(diagonal - leftBound_, round.width),
                              AscendC::CMPMODE::GE, count);
            AscendC::PipeBarrier<PIPE_V>();  // Compares -> Select
            AscendC::Select(s, bits_, s, negInf_, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
            AscendC::PipeBarrier<PIPE_V>();  // s -> row max; bits_ -> next Compares
        }
    }

    // s -= slope * |i + causalOffset - j| = slope * |c - r - d|, from the c - r template.
    __aicore__ inline void AddAlibi(const AscendC::LocalTensor<float>& s, const QueryTile& tile,
                                    const KeyRound& round, uint32_t first, uint32_t rows)
    {
        const uint32_t count = rows * round.width;
        AscendC::Adds(distance_, diag_, static_cast<float>(-SliceDiagonal(tile, round, first)), count);
        AscendC::PipeBarrier<PIPE_V>();  // Adds -> Abs
        AscendC::Abs(distance_, distance_, count);
        AscendC::PipeBarrier<PIPE_V>();  // Abs -> Axpy
        AscendC::Axpy(s, distance_, -slope_, count);
        AscendC::PipeBarrier<PIPE_V>();  // s -> key bias / band / row max
    }

    // s = softcap * tanh(x) for x = s / softcap (already scaled by 2 / softcap: the Muls
    // before it folds that in), as softcap - 2 softcap / (exp(2x) + 1): Exp and Reciprocal
    // are plain vector instructions (the Tanh of the advanced API needs a scratch buffer
    // as large as the slice), and the form saturates cleanly, exp(2x) = inf giving 1 and
    // exp(2x) = 0 giving -1.
    __aicore__ inline void Softcap(const AscendC::LocalTensor<float>& s, uint32_t count)
    {
        const float cap = t_.variant.softcap;
        AscendC::Exp(s, s, count);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(s, s, 1.0f, count);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Reciprocal(s, s, count);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Muls(s, s, -2.0f * cap, count);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(s, s, cap, count);
        AscendC::PipeBarrier<PIPE_V>();  // s -> ALiBi / key bias / band / row max
    }

    __aicore__ inline void SoftmaxRound(const QueryTile& tile, const KeyRound& round, uint32_t seq)
    {
        AscendC::CrossCoreWaitFlag(kFlagScores);
        if (rows_ > 0) {
            const bool bias = MASK || round.columns < round.width;
            if (bias) {
                BuildKeyBias(tile, round);
            }
            if (band_) {
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
        AscendC::LocalTensor<float> s = sQue_.template AllocTensor<float>();
        AscendC::DataCopy(s, exchange_.Scores(seq, (rowOffset_ + first) * w), count);
        sQue_.EnQue(s);
        s = sQue_.template DeQue<float>();
        // With softcap the scale also carries the 2 / softcap of tanh's argument.
        AscendC::Muls(s, s, softcap_ ? 2.0f * t_.scale / t_.variant.softcap : t_.scale, count);
        AscendC::PipeBarrier<PIPE_V>();  // Muls -> softcap / ALiBi / bias / band / row max
        if (softcap_) {
            Softcap(s, count);
        }
        if (alibi_) {
            AddAlibi(s, tile, round, first, rows);
        }
        if (bias) {
            const uint8_t pitch = static_cast<uint8_t>(w / kFloatsPerBlock);
            for (uint32_t col = 0; col < w; col += kFloatsPerRepeat) {
                AscendC::Add(s[col], s[col], keyBias_[col], kFloatsPerRepeat, static_cast<uint8_t>(rows),
                             AscendC::BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
            }
            AscendC::PipeBarrier<PIPE_V>();  // Add -> causal / row max
        }
        if (band_) {
            MaskBand(s, tile, round, first, rows);
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
        RowBroadcast<RowOp::kSubtract>(s, sliceMax_, broadcast_, rows, w);
        AscendC::Exp(s, s, count);
        AscendC::PipeBarrier<PIPE_V>();  // Exp -> row sum (which also rewrites sliceSum_)
        RowReduce<false>(sliceSum_, s, scratch, rows, w);
        if (dropout_) {  // after the row sum: l takes the undropped P
            Dropout(s, tile, round, first, rows);
        }
        AscendC::Mul(l, l, alpha, rows);
        AscendC::PipeBarrier<PIPE_V>();  // Mul -> Add; dropout's Selects -> Cast
        AscendC::Add(l, l, sliceSum_, rows);
        AscendC::Cast(p, s, AscendC::RoundMode::CAST_RINT, count);
        sQue_.FreeTensor(s);
        pQue_.EnQue(p);
        p = pQue_.template DeQue<T>();
        AscendC::DataCopy(exchange_.Probs(seq, (rowOffset_ + first) * w), p, count);
        pQue_.FreeTensor(p);
    }

    // P = keep ? P : 0 for a slice, in passes of RoundKeys elements (whole rows): the
    // keep bits of a pass, then one Select. Generate orders its own writes of keep_
    // after the previous pass's Select has read them (its barriers come first).
    __aicore__ inline void Dropout(const AscendC::LocalTensor<float>& s, const QueryTile& tile,
                                   const KeyRound& round, uint32_t first, uint32_t rows)
    {
        const uint32_t w = round.width;
        const uint32_t passRows = RoundKeys(t_) / w;
        const uint32_t row0 = tile.row0 + rowOffset_ + first;
        for (uint32_t r = 0; r < rows; r += passRows) {
            const uint32_t n = MinU32(passRows, rows - r);
            philox_.Generate(keep_, tile.batch, tile.headQ, row0 + r, n, round.key0, w);
            AscendC::PipeBarrier<PIPE_V>();  // keep bits -> Select
            AscendC::Select(s[r * w], keep_, s[r * w], 0.0f,
                            AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, n * w);
        }
        // The caller's next barrier (Mul -> Add of l) orders the Selects before the cast to P.
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
            AscendC::DataCopy(o, exchange_.Output(seq, (rowOffset_ + first) * d), rows * d);
            oQue_.EnQue(o);
            o = oQue_.template DeQue<float>();
            const AscendC::LocalTensor<float> acc = acc_[first * d];
            if (firstRound) {
                AscendC::Adds(acc, o, 0.0f, rows * d);
            } else {
                RowBroadcast<RowOp::kMultiply>(acc, alpha_[seq % kAlphaRing][first], broadcast_,
                                               rows, d);
                AscendC::Add(acc, acc, o, rows * d);
            }
            oQue_.FreeTensor(o);
        }
    }

    // out = acc / l (0 where l = 0; with dropout acc / l / (1 - p)), lse = m + ln(l)
    // (-inf where l = 0).
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
        AscendC::Duplicate(reciprocal, outScale_, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Maxs, Duplicate -> Div
        AscendC::Div(reciprocal, reciprocal, sliceSum_, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Div -> Brcb
        const uint64_t outOffset = tile.qBase + uint64_t{row} * t_.qStrideRow;
        for (uint32_t first = 0; first < rows_; first += t_.vecRows) {
            const uint32_t rows = SliceRows(first);
            RowBroadcast<RowOp::kMultiply>(acc_[first * d], reciprocal[first], broadcast_, rows, d);
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
        const uint64_t lseOffset = tile.lseBase + row;
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
    uint32_t roundSeq_ = 0;   // rounds before the current tile (workspace slots: Workspace)
    uint32_t diagWidth_ = 0;  // width the band template was built for
    float negInf_ = 0;
    int64_t rightBound_ = -1;  // band: row i sees keys i + causalOffset - left ..
    int64_t leftBound_ = -1;   //   i + causalOffset + right (-1: that side open)
    bool band_ = false;        // the c - r template is built (a band side or ALiBi)
    bool alibi_ = false;
    bool softcap_ = false;
    bool sinks_ = false;
    bool dropout_ = false;
    float outScale_ = 1.0f;    // 1 / (1 - dropout_p): the kept probabilities' rescale
    float slope_ = 0;          // the current tile's ALiBi slope
    ExchangeBuffers<T> exchange_;
    DeviceSeqlens seqlens_;  // layout TND only
    AscendC::GlobalTensor<T> out_;
    AscendC::GlobalTensor<float> lse_, slopes_, sinkLogits_;
    AscendC::GlobalTensor<uint8_t> mask_;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> sQue_, oQue_, maskQue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, 1> pQue_, outQue_, lseQue_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> rowBuf_, brcBuf_, keyBuf_, maskHalfBuf_, bitsBuf_,
        accBuf_, diagBuf_, alibiBuf_, philoxBuf_, keepBuf_;
    AscendC::LocalTensor<float> rowMax_, rowSum_, sliceMax_, sliceSum_, broadcast_;
    AscendC::LocalTensor<float> alpha_[kAlphaRing];
    AscendC::LocalTensor<float> keyBias_, column_, keyScratch_, acc_, diag_, distance_;
    AscendC::LocalTensor<half> maskHalf_;
    AscendC::LocalTensor<uint8_t> bits_, keep_;
    PhiloxDropout philox_;
};

}  // namespace flash_cann

#endif
