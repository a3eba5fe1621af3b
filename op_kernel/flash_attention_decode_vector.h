// The vector (AIV) half of the decode kernel: the online softmax of every unit's rows,
// its partial (out, lse) into the workspace, and, after a SyncAll, the combine of the
// splits.
//
// Per unit (flash_cann_decode_tiling.h), the two vector cores split the tile's rows:
//   SoftmaxRound(0), then per round r >= 1: SoftmaxRound(r), UpdateOutput(r - 1); then
//   UpdateOutput(last) and WritePartial.
//   SoftmaxRound  wait for S; per slice of vecRows rows: scale (softcap), ALiBi per row,
//                 each row's band [its first visible key, its last] (cache_leftpad, the
//                 sequence's length, causal and window bottom-right aligned to it, the
//                 round's tail) as at most two compare + select per row; then the
//                 forward's online softmax (m, l, alpha ring); P -> workspace; one flag
//   UpdateOutput  wait for O; acc = acc alpha + O
//   WritePartial  out_s = acc / l (0 where l = 0), lse_s = m + ln(l) (-inf there), fp32
// Rows are few in decode (the group's heads x the new tokens), so the per-row work is a
// handful of instructions per row and round; the slice-wide work is the forward's.
//
// Combine (every vector core of the launch, after SyncAll<true>, vector cores only): the (sequence, kv head,
// tile) groups are dealt round-robin; per run of rows sharing a query position, in split
// order: M = max_s lse_s (and the sink), e_s = exp(lse_s - M), lse = M + ln(sum e_s (+
// e_sink)), out = sum_s (e_s / sum) out_s. The order is fixed by the shape, so the result
// is bitwise the same for every run and core count. The sink joins once, here, as a term
// with no output (a row that sees no key: out = 0, lse = sink).
#ifndef FLASH_CANN_FLASH_ATTENTION_DECODE_VECTOR_H
#define FLASH_CANN_FLASH_ATTENTION_DECODE_VECTOR_H

#include "flash_attention_decode_common.h"
#include "flash_attention_features.h"
#include "flash_attention_vector_ops.h"

namespace flash_cann {

template <typename T>
class FlashAttentionDecodeVector {
public:
    __aicore__ inline void Init(const DecodeArgs& a, const DecodeTiling& tiling, AscendC::TPipe* pipe)
    {
        t_ = tiling;
        const VariantTiling& v = t_.variant;
        alibi_ = v.alibi != static_cast<uint32_t>(Alibi::kNone);
        softcap_ = v.softcap > 0.0f;
        sinks_ = v.sinks != 0u;
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx()) / kVectorCoresPerCube;
        sub_ = static_cast<uint32_t>(AscendC::GetSubBlockIdx());
        negInf_ = -__builtin_inff();
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(a.out));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(a.softmaxLse));
        if (alibi_) {
            slopes_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(a.alibiSlopes));
        }
        if (sinks_) {
            sinkLogits_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(a.sinks));
        }
        sequences_.Init(a, t_);
        exchange_.Init(a.userWorkspace, core_, t_);

        const DecodeBufferBytes bytes = ComputeDecodeBufferBytes(t_, sizeof(T));
        pipe->InitBuffer(sQue_, kVecBuffers, bytes.sUb);
        pipe->InitBuffer(pQue_, kVecBuffers, bytes.pUb);
        pipe->InitBuffer(oQue_, kVecBuffers, bytes.oUb);
        pipe->InitBuffer(outQue_, kVecBuffers, bytes.outUb);
        pipe->InitBuffer(partialQue_, kVecBuffers, bytes.oUb);
        pipe->InitBuffer(accBuf_, bytes.accUb);
        pipe->InitBuffer(rowBuf_, bytes.rowUb * kRowStats);
        pipe->InitBuffer(lseQue_, 1, bytes.rowUb);
        pipe->InitBuffer(brcBuf_, bytes.brcUb);
        pipe->InitBuffer(lseOutQue_, 1, bytes.brcUb);
        pipe->InitBuffer(keyBuf_, bytes.keyUb * kDecodeKeyRows);
        pipe->InitBuffer(bitsBuf_, bytes.bitsUb);
        pipe->InitBuffer(splitQue_, 1, bytes.splitUb);
        if (softcap_) {  // features.h's Softcap: tanh and a scratch tile of one slice
            pipe->InitBuffer(softcapBuf_, bytes.sUb * 2);
            tanh_ = softcapBuf_.template GetWithOffset<float>(bytes.sUb / sizeof(float), 0);
            softcapScratch_ = softcapBuf_.template GetWithOffset<float>(bytes.sUb / sizeof(float), bytes.sUb);
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
        const uint32_t w = DecodeRoundKeys(t_);
        column_ = keyBuf_.template GetWithOffset<float>(w, 0);
        distance_ = keyBuf_.template GetWithOffset<float>(w, bytes.keyUb);
        keyScratch_ = keyBuf_.template GetWithOffset<float>(w, 2 * bytes.keyUb);
        bits_ = bitsBuf_.template Get<uint8_t>();
        acc_ = accBuf_.template Get<float>();
        splitRow_ = bytes.splitUb / (t_.splits + 1u) / sizeof(float);
        // column_ is first read by MaskRows, after the barrier that follows each slice's
        // Muls: that orders this write too.
        AscendC::CreateVecIndex(column_, 0.0f, w);
    }

    __aicore__ inline void Process()
    {
        if (core_ < t_.usedCores) {
            for (uint32_t index = t_.unitStart[core_]; index < t_.unitStart[core_ + 1]; ++index) {
                ProcessUnit(sequences_.Resolve(index));
            }
        }
        // Every unit's partial is in the workspace: the vector cores wrote them, and only
        // they read them (the cube has no part in the combine).
        AscendC::SyncAll<true>();
        Combine();
    }

private:
    __aicore__ inline uint32_t SliceRows(uint32_t first) const
    {
        return MinU32(t_.vecRows, rows_ - first);
    }

    __aicore__ inline void ProcessUnit(const DecodeUnit& unit)
    {
        if (unit.rows == 0) {
            return;  // a tile past the sequence's rows: nothing to write, the combine skips it
        }
        const uint32_t firstHalf = (unit.rows + 1) / 2;
        rows_ = sub_ == 0 ? firstHalf : unit.rows - firstHalf;
        rowOffset_ = sub_ == 0 ? 0 : firstHalf;
        const uint32_t rounds = DecodeRounds(t_, unit);
        if (rows_ > 0) {
            AscendC::Duplicate(rowMax_, negInf_, rows_);
            AscendC::Duplicate(rowSum_, 0.0f, rows_);
            if (rounds == 0) {  // no key: out_s = 0, lse_s = -inf
                AscendC::Duplicate(acc_, 0.0f, rows_ * t_.headDimPad);
            }
            AscendC::PipeBarrier<PIPE_V>();  // m, l (acc) -> the first round or the partial
        }
        for (uint32_t round = 0; round < rounds; ++round) {
            SoftmaxRound(unit, MakeDecodeRound(t_, unit, round), roundSeq_ + round);
            if (round > 0) {
                UpdateOutput(roundSeq_ + round - 1, round == 1);
            }
        }
        if (rounds > 0) {
            UpdateOutput(roundSeq_ + rounds - 1, rounds == 1);
        }
        roundSeq_ += rounds;
        WritePartial(unit);
    }

    // result[r] = max (or sum) of row r of a [rows][width] tile, width <= 512: per
    // 32-byte block, then over the row's blocks (at most 64: one WholeReduce repeat).
    template <bool MAX>
    __aicore__ inline void RowReduce(const AscendC::LocalTensor<float>& result, const AscendC::LocalTensor<float>& tile,
                                     const AscendC::LocalTensor<float>& scratch, uint32_t rows, uint32_t width)
    {
        const int32_t repeats = static_cast<int32_t>(rows * width / kFloatsPerRepeat);
        if (MAX) {
            AscendC::BlockReduceMax(scratch, tile, repeats, static_cast<int32_t>(kFloatsPerRepeat), 1, 1, 8);
        } else {
            AscendC::BlockReduceSum(scratch, tile, repeats, static_cast<int32_t>(kFloatsPerRepeat), 1, 1, 8);
        }
        AscendC::PipeBarrier<PIPE_V>();  // BlockReduce -> WholeReduce
        const uint32_t perRow = width / kFloatsPerBlock;
        const int32_t pitch = static_cast<int32_t>(perRow / kFloatsPerBlock);
        if (MAX) {
            AscendC::WholeReduceMax(result, scratch, static_cast<int32_t>(perRow), static_cast<int32_t>(rows), 1, 1,
                                    pitch, AscendC::ReduceOrder::ORDER_ONLY_VALUE);
        } else {
            AscendC::WholeReduceSum(result, scratch, static_cast<int32_t>(perRow), static_cast<int32_t>(rows), 1, 1,
                                    pitch);
        }
        AscendC::PipeBarrier<PIPE_V>();  // result -> its reader; scratch -> its next writer
    }

    // Query position and head (within the group) of this vector core's row `row` of the unit.
    __aicore__ inline uint32_t Position(const DecodeUnit& unit, uint32_t row) const
    {
        return (unit.row0 + rowOffset_ + row) / t_.group;
    }
    __aicore__ inline uint32_t HeadQ(const DecodeUnit& unit, uint32_t row) const
    {
        return unit.headKv * t_.group + (unit.row0 + rowOffset_ + row) % t_.group;
    }

    // row[c] <- -inf where !(c mode bound), over the round's width.
    __aicore__ inline void Clip(const AscendC::LocalTensor<float>& row, int64_t bound, AscendC::CMPMODE mode,
                                uint32_t width)
    {
        AscendC::Compares(bits_, column_, static_cast<float>(bound), mode, width);
        AscendC::PipeBarrier<PIPE_V>();  // Compares -> Select
        AscendC::Select(row, bits_, row, negInf_, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, width);
        AscendC::PipeBarrier<PIPE_V>();  // row -> row max; bits_ -> the next Compares
    }

    // Per row of a slice: ALiBi (s -= slope |key - diagonal|), then the row's band: keys
    // before max(leftpad, window's left edge) or after min(its last visible key, the
    // round's last key) become -inf.
    __aicore__ inline void MaskRows(const AscendC::LocalTensor<float>& s, const DecodeUnit& unit,
                                    const DecodeRound& round, uint32_t first, uint32_t rows)
    {
        const uint32_t w = round.width;
        for (uint32_t r = 0; r < rows; ++r) {
            const AscendC::LocalTensor<float> row = s[r * w];
            const int64_t position = Position(unit, first + r);
            if (alibi_) {
                const uint32_t head = HeadQ(unit, first + r);
                const uint64_t at = t_.variant.alibi == static_cast<uint32_t>(Alibi::kPerHead)
                                        ? head
                                        : uint64_t{unit.batch} * t_.headsQ + head;
                const int64_t diagonal = position + unit.length - unit.seqRows - round.key0;
                AscendC::Adds(distance_, column_, static_cast<float>(-diagonal), w);
                AscendC::PipeBarrier<PIPE_V>();  // Adds -> Abs
                AscendC::Abs(distance_, distance_, w);
                AscendC::PipeBarrier<PIPE_V>();  // Abs -> Axpy
                AscendC::Axpy(row, distance_, -slopes_.GetValue(at), w);
                AscendC::PipeBarrier<PIPE_V>();  // row -> band / row max; distance_ -> next Adds
            }
            const KeyBand band = RowBand(t_, position, unit.seqRows, unit.length, unit.leftpad);
            const int64_t low = band.first - static_cast<int64_t>(round.key0);
            const int64_t high = MinI64(band.last - static_cast<int64_t>(round.key0),
                                        static_cast<int64_t>(round.columns) - 1);
            if (high < low || high < 0 || low >= static_cast<int64_t>(w)) {
                AscendC::Duplicate(row, negInf_, w);
                AscendC::PipeBarrier<PIPE_V>();  // row -> row max
                continue;
            }
            if (low > 0) {
                Clip(row, low, AscendC::CMPMODE::GE, w);
            }
            if (high < static_cast<int64_t>(w) - 1) {
                Clip(row, high, AscendC::CMPMODE::LE, w);
            }
        }
    }

    __aicore__ inline void SoftmaxRound(const DecodeUnit& unit, const DecodeRound& round, uint32_t seq)
    {
        AscendC::CrossCoreWaitFlag(kFlagScores);
        for (uint32_t first = 0; first < rows_; first += t_.vecRows) {
            SoftmaxSlice(unit, round, seq, first, SliceRows(first));
        }
        AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(kFlagProbs);
    }

    __aicore__ inline void SoftmaxSlice(const DecodeUnit& unit, const DecodeRound& round, uint32_t seq,
                                        uint32_t first, uint32_t rows)
    {
        const uint32_t w = round.width;
        const uint32_t count = rows * w;
        AscendC::LocalTensor<float> s = sQue_.template AllocTensor<float>();
        AscendC::DataCopy(s, exchange_.Scores(seq, (rowOffset_ + first) * w), count);
        sQue_.EnQue(s);
        s = sQue_.template DeQue<float>();
        AscendC::Muls(s, s, t_.scale, count);
        AscendC::PipeBarrier<PIPE_V>();  // Muls -> softcap / rows / row max
        if (softcap_) {
            Softcap(s, tanh_, softcapScratch_, t_.variant.softcap, count);
        }
        MaskRows(s, unit, round, first, rows);
        // The forward's online softmax (flash_attention_vector.h, SoftmaxSlice).
        AscendC::LocalTensor<T> p = pQue_.template AllocTensor<T>();
        const AscendC::LocalTensor<float> scratch = p.template ReinterpretCast<float>();
        const AscendC::LocalTensor<float> m = rowMax_[first];
        const AscendC::LocalTensor<float> l = rowSum_[first];
        const AscendC::LocalTensor<float> alpha = alpha_[seq % kAlphaRing][first];
        RowReduce<true>(sliceMax_, s, scratch, rows, w);
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
        AscendC::Mul(l, l, alpha, rows);
        AscendC::PipeBarrier<PIPE_V>();  // Mul -> Add
        AscendC::Add(l, l, sliceSum_, rows);
        AscendC::Cast(p, s, AscendC::RoundMode::CAST_RINT, count);
        sQue_.FreeTensor(s);
        pQue_.EnQue(p);
        p = pQue_.template DeQue<T>();
        AscendC::DataCopy(exchange_.Probs(seq, (rowOffset_ + first) * w), p, count);
        pQue_.FreeTensor(p);
    }

    // acc = acc * alpha + O for the round with sequence number `seq` (acc = O in the
    // unit's first round).
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
                RowBroadcast<RowOp::kMultiply>(acc, alpha_[seq % kAlphaRing][first], broadcast_, rows, d);
                AscendC::Add(acc, acc, o, rows * d);
            }
            oQue_.FreeTensor(o);
        }
    }

    // The unit's partial: out_s = acc / max(l, smallest) (0 where l = 0), lse_s = m + ln(l)
    // (-inf where l = 0), fp32 rows of headDimPad into the unit's workspace slot.
    __aicore__ inline void WritePartial(const DecodeUnit& unit)
    {
        if (rows_ == 0) {
            return;
        }
        const uint32_t d = t_.headDimPad;
        const AscendC::LocalTensor<float> reciprocal = sliceMax_;
        AscendC::Maxs(sliceSum_, rowSum_, kSmallest, rows_);
        AscendC::Duplicate(reciprocal, 1.0f, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Maxs, Duplicate -> Div
        AscendC::Div(reciprocal, reciprocal, sliceSum_, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Div -> Brcb
        for (uint32_t first = 0; first < rows_; first += t_.vecRows) {
            const uint32_t rows = SliceRows(first);
            AscendC::LocalTensor<float> o = partialQue_.template AllocTensor<float>();
            AscendC::Adds(o, acc_[first * d], 0.0f, rows * d);
            // Adds -> the row scaling: ordered by RowBroadcast's barrier after its Brcb.
            RowBroadcast<RowOp::kMultiply>(o, reciprocal[first], broadcast_, rows, d);
            partialQue_.EnQue(o);
            o = partialQue_.template DeQue<float>();
            AscendC::DataCopy(exchange_.PartialOut(unit.index, rowOffset_ + first), o, rows * d);
            partialQue_.FreeTensor(o);
        }
        AscendC::LocalTensor<float> lse = lseQue_.template AllocTensor<float>();
        AscendC::Ln(lse, rowSum_, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Ln -> Add
        AscendC::Add(lse, lse, rowMax_, rows_);
        lseQue_.EnQue(lse);
        lse = lseQue_.template DeQue<float>();
        AscendC::DataCopyPad(exchange_.PartialLse(unit.index, rowOffset_), lse,
                             AscendC::DataCopyExtParams(1, rows_ * sizeof(float), 0, 0, 0));
        lseQue_.FreeTensor(lse);
        AscendC::PipeBarrier<PIPE_V>();  // Ln/Add/Div read m and l before the next unit resets them
    }

    // The splits of every row, combined in split order (see the file comment).
    __aicore__ inline void Combine()
    {
        const uint32_t vectorCores = static_cast<uint32_t>(AscendC::GetBlockNum()) * kVectorCoresPerCube;
        const uint32_t me = core_ * kVectorCoresPerCube + sub_;
        const uint32_t groups = t_.batch * t_.headsKv * t_.rowTiles;
        for (uint32_t group = me; group < groups; group += vectorCores) {
            const uint32_t tile = group % t_.rowTiles;
            const uint32_t headKv = group / t_.rowTiles % t_.headsKv;
            const uint32_t batch = group / t_.rowTiles / t_.headsKv;
            uint32_t rowBase = 0;
            uint32_t seqRows = 0;
            sequences_.QueryRows(batch, rowBase, seqRows);
            const uint32_t packed = seqRows * t_.group;
            const uint32_t row0 = tile * t_.blockQ;
            const uint32_t rows = row0 < packed ? MinU32(t_.blockQ, packed - row0) : 0;
            const uint32_t unit0 = group * t_.splits;
            for (uint32_t row = 0; row < rows;) {
                // A run of rows of one query position: consecutive heads, consecutive in GM.
                const uint32_t head = (row0 + row) % t_.group;
                const uint32_t run = MinU32(MinU32(t_.group - head, rows - row), t_.vecRows);
                CombineRun(batch, headKv * t_.group + head, rowBase + (row0 + row) / t_.group, (row0 + row) / t_.group,
                           unit0, row, run);
                row += run;
            }
        }
    }

    // Rows `row` .. row + n - 1 of the group whose units start at `unit0`: query heads
    // headQ .. headQ + n - 1 of query row `queryRow` (position `position` of its sequence).
    __aicore__ inline void CombineRun(uint32_t batch, uint32_t headQ, uint32_t queryRow, uint32_t position,
                                      uint32_t unit0, uint32_t row, uint32_t n)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t splits = t_.splits;
        AscendC::LocalTensor<float> lse = splitQue_.template AllocTensor<float>();
        for (uint32_t s = 0; s < splits; ++s) {
            AscendC::DataCopyPad(lse[s * splitRow_], exchange_.PartialLse(unit0 + s, row),
                                 AscendC::DataCopyExtParams(1, n * sizeof(float), 0, 0, 0),
                                 AscendC::DataCopyPadExtParams<float>(false, 0, 0, 0));
        }
        if (sinks_) {  // the heads' sinks are consecutive too
            AscendC::DataCopyPad(lse[splits * splitRow_], sinkLogits_[headQ],
                                 AscendC::DataCopyExtParams(1, n * sizeof(float), 0, 0, 0),
                                 AscendC::DataCopyPadExtParams<float>(false, 0, 0, 0));
        }
        splitQue_.EnQue(lse);
        lse = splitQue_.template DeQue<float>();
        const uint32_t terms = splits + (sinks_ ? 1u : 0u);
        const AscendC::LocalTensor<float> top = rowMax_;
        const AscendC::LocalTensor<float> sum = rowSum_;
        const AscendC::LocalTensor<float> weight = sliceMax_;
        // M = max over the terms, in order, clamped so that -inf - M stays -inf.
        AscendC::Adds(top, lse, 0.0f, n);
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t s = 1; s < terms; ++s) {
            AscendC::Max(top, top, lse[s * splitRow_], n);
            AscendC::PipeBarrier<PIPE_V>();
        }
        AscendC::Maxs(top, top, kLowest, n);
        AscendC::PipeBarrier<PIPE_V>();
        // e_s = exp(lse_s - M) in place; sum = e_0 + e_1 + ... in order.
        for (uint32_t s = 0; s < terms; ++s) {
            AscendC::Sub(lse[s * splitRow_], lse[s * splitRow_], top, n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Exp(lse, lse, terms * splitRow_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(sum, lse, 0.0f, n);
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t s = 1; s < terms; ++s) {
            AscendC::Add(sum, sum, lse[s * splitRow_], n);
            AscendC::PipeBarrier<PIPE_V>();
        }
        // lse = M + ln(sum) (-inf for a row with no term); 1 / max(sum, smallest).
        AscendC::LocalTensor<float> lseOut = lseOutQue_.template AllocTensor<float>();
        AscendC::Ln(sliceSum_, sum, n);
        AscendC::Maxs(weight, sum, kSmallest, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Add(sliceSum_, sliceSum_, top, n);
        AscendC::PipeBarrier<PIPE_V>();  // Add reads M before it becomes the reciprocal
        AscendC::Duplicate(top, 1.0f, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Div(top, top, weight, n);
        AscendC::Brcb(lseOut, sliceSum_, static_cast<uint8_t>((n + 7) / 8), AscendC::BrcbRepeatParams(1, 8));
        AscendC::PipeBarrier<PIPE_V>();
        // out = sum_s (e_s / sum) out_s, in split order.
        for (uint32_t s = 0; s < splits; ++s) {
            AscendC::Mul(weight, lse[s * splitRow_], top, n);
            AscendC::PipeBarrier<PIPE_V>();  // weight -> its broadcast
            AscendC::LocalTensor<float> o = sQue_.template AllocTensor<float>();
            AscendC::DataCopy(o, exchange_.PartialOut(unit0 + s, row), n * d);
            sQue_.EnQue(o);
            o = sQue_.template DeQue<float>();
            RowBroadcast<RowOp::kMultiply>(o, weight, broadcast_, n, d);
            if (s == 0) {
                AscendC::Adds(acc_, o, 0.0f, n * d);
            } else {
                AscendC::Add(acc_, acc_, o, n * d);
            }
            AscendC::PipeBarrier<PIPE_V>();  // acc -> the next term or the cast; weight -> next Mul
            sQue_.FreeTensor(o);
        }
        splitQue_.FreeTensor(lse);
        AscendC::LocalTensor<T> out = outQue_.template AllocTensor<T>();
        AscendC::Cast(out, acc_, AscendC::RoundMode::CAST_RINT, n * d);
        outQue_.EnQue(out);
        out = outQue_.template DeQue<T>();
        const uint64_t outOffset = (uint64_t{queryRow} * t_.headsQ + headQ) * t_.headDim;
        AscendC::DataCopyPad(out_[outOffset], out, AscendC::DataCopyExtParams(static_cast<uint16_t>(n),
                                                                            t_.headDim * sizeof(T), 0, 0, 0));
        outQue_.FreeTensor(out);
        // softmax_lse: BSND (batch, heads_q, seqlen_q), TND (heads_q, tokens): the run's
        // heads are `pitch` floats apart.
        const bool tnd = t_.layout == static_cast<uint32_t>(DecodeLayout::TND);
        const uint64_t pitch = tnd ? t_.tokensQ : t_.seqlenQ;
        const uint64_t lseOffset = tnd ? uint64_t{headQ} * t_.tokensQ + queryRow
                                       : (uint64_t{batch} * t_.headsQ + headQ) * t_.seqlenQ + position;
        lseOutQue_.EnQue(lseOut);
        lseOut = lseOutQue_.template DeQue<float>();
        AscendC::DataCopyPad(lse_[lseOffset], lseOut,
                             AscendC::DataCopyExtParams(static_cast<uint16_t>(n), sizeof(float), 0,
                                                        static_cast<uint32_t>((pitch - 1) * sizeof(float)), 0));
        lseOutQue_.FreeTensor(lseOut);
        // The next run rewrites the statistics rows and acc only after the barriers of its
        // own first steps, which follow every read of this run's.
    }

    DecodeTiling t_;
    uint32_t core_ = 0;
    uint32_t sub_ = 0;
    uint32_t rows_ = 0;       // this vector core's rows of the current unit
    uint32_t rowOffset_ = 0;  // their first row within the unit's tile
    uint32_t roundSeq_ = 0;   // rounds before the current unit (exchange slots)
    uint32_t splitRow_ = 0;   // floats per term row of the combine's split buffer
    float negInf_ = 0;
    bool alibi_ = false;
    bool softcap_ = false;
    bool sinks_ = false;
    DecodeSequences sequences_;
    DecodeExchange<T> exchange_;
    AscendC::GlobalTensor<T> out_;
    AscendC::GlobalTensor<float> lse_, slopes_, sinkLogits_;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> sQue_, oQue_, splitQue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, 1> pQue_, outQue_, partialQue_, lseQue_, lseOutQue_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> rowBuf_, brcBuf_, keyBuf_, bitsBuf_, accBuf_, softcapBuf_;
    AscendC::LocalTensor<float> rowMax_, rowSum_, sliceMax_, sliceSum_, broadcast_;
    AscendC::LocalTensor<float> alpha_[kAlphaRing];
    AscendC::LocalTensor<float> column_, distance_, keyScratch_, acc_, tanh_, softcapScratch_;
    AscendC::LocalTensor<uint8_t> bits_;
};

}  // namespace flash_cann

#endif
