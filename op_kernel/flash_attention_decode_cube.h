// The cube (AIC) half of the decode kernel: S = Q K^T and O = P V for every unit of the
// core (flash_cann_decode_tiling.h), with K and V gathered from the cache's pages.
//
// Per unit: the tile's Q rows (the group's query heads x the sequence's query rows,
// position-major) are loaded once into L1 and L0A and serve every key of the unit, so
// each K/V page is read once per kv head group. The unit's keys are walked in rounds
// of keyStack sub-blocks of blockK keys:
//   ComputeScores(0), then per round r: ComputeScores(r + 1), ComputeOutput(r)
// so S of the next round is in the workspace before the cube waits for P of this one
// (one round ahead: the forward runs two, but a decode unit has few rows, and its time
// goes to the K/V loads, which run ahead through the L1 rings regardless).
// A sub-block's rows are gathered from the pages that hold them: one ND->NZ copy per
// page segment (block_table, or the contiguous cache's row of cache_batch_idx), read on
// the scalar unit from GM.
#ifndef FLASH_CANN_FLASH_ATTENTION_DECODE_CUBE_H
#define FLASH_CANN_FLASH_ATTENTION_DECODE_CUBE_H

#include "flash_attention_cube.h"
#include "flash_attention_decode_common.h"
#include "flash_attention_fractal.h"

namespace flash_cann {

template <typename T>
class FlashAttentionDecodeCube {
    using L1Ring = EventRing<T, AscendC::HardEvent::MTE2_MTE1, AscendC::HardEvent::MTE1_MTE2>;
    using L0Ring = EventRing<T, AscendC::HardEvent::MTE1_M, AscendC::HardEvent::M_MTE1>;
    using L0cRing = EventRing<float, AscendC::HardEvent::M_FIX, AscendC::HardEvent::FIX_M>;

public:
    __aicore__ inline void Init(const DecodeArgs& a, const DecodeTiling& tiling, AscendC::TPipe* pipe)
    {
        t_ = tiling;
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx());
        q_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(a.query));
        k_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(a.kCache));
        v_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(a.vCache));
        if (t_.paged != 0) {
            blockTable_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(a.blockTable));
        } else if (t_.hasBatchIdx != 0) {
            batchIdx_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(a.cacheBatchIdx));
        }
        sequences_.Init(a, t_);
        exchange_.Init(a.userWorkspace, core_, t_);

        const DecodeBufferBytes bytes = ComputeDecodeBufferBytes(t_, sizeof(T));
        pipe->InitBuffer(qL1Buf_, bytes.qL1);
        pipe->InitBuffer(kL1Buf_, bytes.kvL1 * 2);
        pipe->InitBuffer(vL1Buf_, bytes.kvL1 * 2);
        pipe->InitBuffer(pL1Buf_, bytes.pL1 * 2);
        pipe->InitBuffer(qL0aBuf_, bytes.qL0a);
        pipe->InitBuffer(pL0aBuf_, bytes.pL0a * 2);
        pipe->InitBuffer(l0bBuf_, bytes.l0b * 2);
        pipe->InitBuffer(oL0cBuf_, bytes.oL0c);
        pipe->InitBuffer(sL0cBuf_, bytes.sL0c * 2);
        qL1_.Init(pipe, qL1Buf_.template Get<T>(), 0, 1);
        kL1_.Init(pipe, kL1Buf_.template Get<T>(), bytes.kvL1 / sizeof(T), 2);
        vL1_.Init(pipe, vL1Buf_.template Get<T>(), bytes.kvL1 / sizeof(T), 2);
        pL1_.Init(pipe, pL1Buf_.template Get<T>(), bytes.pL1 / sizeof(T), 2);
        qL0a_.Init(pipe, qL0aBuf_.template Get<T>(), 0, 1);
        pL0a_.Init(pipe, pL0aBuf_.template Get<T>(), bytes.pL0a / sizeof(T), 2);
        l0b_.Init(pipe, l0bBuf_.template Get<T>(), bytes.l0b / sizeof(T), 2);
        oL0c_.Init(pipe, oL0cBuf_.template Get<float>(), 0, 1);
        sL0c_.Init(pipe, sL0cBuf_.template Get<float>(), bytes.sL0c / sizeof(float), 2);
    }

    __aicore__ inline void Process()
    {
        if (core_ < t_.usedCores) {
            for (uint32_t index = t_.unitStart[core_]; index < t_.unitStart[core_ + 1]; ++index) {
                const DecodeUnit unit = sequences_.Resolve(index);
                const uint32_t rounds = unit.rows == 0 ? 0 : DecodeRounds(t_, unit);
                if (rounds == 0) {
                    continue;  // no row or no key: the vector cores write the empty partial
                }
                BeginUnit(unit);
                ComputeScores(0);
                for (uint32_t round = 0; round < rounds; ++round) {
                    if (round + 1 < rounds) {
                        ComputeScores(round + 1);
                    }
                    ComputeOutput(round);
                }
                qL0a_.EndUse();  // the unit's last S product has read Q
            }
        }
        qL1_.Drain();
        kL1_.Drain();
        vL1_.Drain();
        pL1_.Drain();
        qL0a_.Drain();
        pL0a_.Drain();
        l0b_.Drain();
        oL0c_.Drain();
        sL0c_.Drain();
    }

private:
    // `rows` rows (GM row pitch `pitch`) -> Nz rows [at, at + rows) of an L1 buffer whose
    // column blocks hold `padRows` rows.
    __aicore__ inline void CopyRows(const AscendC::LocalTensor<T>& l1, uint32_t at,
                                    const AscendC::GlobalTensor<T>& src, uint32_t rows, uint32_t padRows,
                                    uint64_t pitch)
    {
        AscendC::DataCopy(l1[at * kCubeBlock], src,
                          AscendC::Nd2NzParams(1, static_cast<uint16_t>(rows), static_cast<uint16_t>(t_.headDim),
                                               0, static_cast<uint16_t>(pitch), static_cast<uint16_t>(padRows), 1,
                                               0));
    }

    __aicore__ inline void BeginUnit(const DecodeUnit& unit)
    {
        unit_ = unit;
        blocks_ = (unit.keyEnd - unit.keyBegin + t_.blockK - 1) / t_.blockK;
        keysIssued_ = valuesIssued_ = 0;
        rows16_ = AlignUp(unit.rows, kCubeBlock);
        cacheRow_ = t_.hasBatchIdx != 0 ? static_cast<uint32_t>(batchIdx_.GetValue(unit.batch)) : unit.batch;
        // Q: per query position, its run of the group's heads (consecutive in GM), into
        // consecutive Nz rows. Rows past unit.rows are stale: they only reach S and O rows
        // nobody reads.
        const AscendC::LocalTensor<T> qL1 = qL1_.BeginFill();
        for (uint32_t row = 0; row < unit.rows;) {
            const uint32_t packed = unit.row0 + row;
            const uint32_t position = packed / t_.group;
            const uint32_t head = packed % t_.group;
            const uint32_t run = MinU32(t_.group - head, unit.rows - row);
            const uint64_t offset =
                (uint64_t{unit.rowBase + position} * t_.headsQ + uint64_t{unit.headKv} * t_.group + head) *
                t_.headDim;
            CopyRows(qL1, row, q_[offset], run, rows16_, t_.headDim);
            row += run;
        }
        qL1_.EndFill();
        const AscendC::LocalTensor<T> q = qL1_.BeginUse();
        LoadLeft(qL0a_.BeginFill(), q, rows16_, t_.headDimPad);
        qL1_.EndUse();
        qL0a_.EndFill();
        qA_ = qL0a_.BeginUse();
    }

    // Sub-block `block` of the unit (keys keyBegin + block * blockK onwards) of the cache
    // `cache` -> Nz in L1, gathered page segment by page segment; rows past the unit's
    // last key are zeroed (they are padded columns of S and the padded reduction
    // dimension of P.V: stale L1 data there would reach the results).
    __aicore__ inline void LoadKeys(const AscendC::LocalTensor<T>& l1, const AscendC::GlobalTensor<T>& cache,
                                    uint32_t block)
    {
        const uint32_t key0 = unit_.keyBegin + block * t_.blockK;
        const uint32_t rows = MinU32(t_.blockK, unit_.keyEnd - key0);
        if (rows < t_.blockK) {
            AscendC::InitConstValue(
                l1[rows * kCubeBlock],
                AscendC::InitConstValueParams<T>(static_cast<uint16_t>(t_.headDimPad / kCubeBlock),
                                                 static_cast<uint16_t>(t_.blockK - rows),
                                                 static_cast<uint16_t>(rows), T(0.0f)));
        }
        const uint64_t pitch = uint64_t{t_.headsKv} * t_.headDim;
        for (uint32_t row = 0; row < rows;) {
            const uint32_t key = key0 + row;
            uint32_t cacheBlock = cacheRow_;
            uint32_t inBlock = key;
            if (t_.paged != 0) {
                const uint32_t page = key / t_.blockRows;
                cacheBlock = static_cast<uint32_t>(
                    blockTable_.GetValue(uint64_t{unit_.batch} * t_.maxBlocks + page));
                inBlock = key - page * t_.blockRows;
            }
            const uint32_t run = MinU32(t_.blockRows - inBlock, rows - row);
            const uint64_t offset = (uint64_t{cacheBlock} * t_.blockRows + inBlock) * pitch +
                                    uint64_t{unit_.headKv} * t_.headDim;
            CopyRows(l1, row, cache[offset], run, t_.blockK, pitch);
            row += run;
        }
    }

    __aicore__ inline void IssueKeys()
    {
        for (; keysIssued_ < blocks_ && kL1_.InFlight() < kL1_.Copies(); ++keysIssued_) {
            LoadKeys(kL1_.BeginFill(), k_, keysIssued_);
            kL1_.EndFill();
        }
    }

    __aicore__ inline void IssueValues()
    {
        for (; valuesIssued_ < blocks_ && vL1_.InFlight() < vL1_.Copies(); ++valuesIssued_) {
            LoadKeys(vL1_.BeginFill(), v_, valuesIssued_);
            vL1_.EndFill();
        }
    }

    __aicore__ inline void IssueProbs(const DecodeRound& round, uint32_t seq)
    {
        for (; probsIssued_ < round.subBlocks && pL1_.InFlight() < pL1_.Copies(); ++probsIssued_) {
            AscendC::DataCopy(pL1_.BeginFill(), exchange_.Probs(seq, probsIssued_ * t_.blockK),
                              AscendC::Nd2NzParams(1, static_cast<uint16_t>(unit_.rows),
                                                   static_cast<uint16_t>(t_.blockK), 0,
                                                   static_cast<uint16_t>(round.width),
                                                   static_cast<uint16_t>(rows16_), 1, 0));
            pL1_.EndFill();
        }
    }

    // S = Q K^T for every sub-block of round `index`, into the next S slot.
    __aicore__ inline void ComputeScores(uint32_t index)
    {
        const DecodeRound round = MakeDecodeRound(t_, unit_, index);
        const uint32_t seq = scoreSeq_++;
        const uint32_t bk = t_.blockK;
        const uint32_t d = t_.headDimPad;
        for (uint32_t sub = 0; sub < round.subBlocks; ++sub) {
            IssueKeys();
            const AscendC::LocalTensor<T> kL1 = kL1_.BeginUse();
            LoadRightTransposed(l0b_.BeginFill(), kL1, bk, d);  // K in Nz is the Zn of K^T
            kL1_.EndUse();
            l0b_.EndFill();
            IssueKeys();

            const AscendC::LocalTensor<float> c = sL0c_.BeginFill();
            AscendC::Mmad(c, qA_, l0b_.BeginUse(),
                          AscendC::MmadParams(static_cast<uint16_t>(rows16_), static_cast<uint16_t>(bk),
                                              static_cast<uint16_t>(d), 0, false, true));
            l0b_.EndUse();
            sL0c_.EndFill();
            AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(
                exchange_.Scores(seq, sub * bk), sL0c_.BeginUse(),
                AscendC::FixpipeParamsV220(static_cast<uint16_t>(bk), static_cast<uint16_t>(rows16_),
                                           static_cast<uint16_t>(rows16_), round.width, false));
            sL0c_.EndUse();
        }
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagScores);
    }

    // O = P V of round `index`, accumulated over its sub-blocks in L0C, into the next O slot.
    __aicore__ inline void ComputeOutput(uint32_t index)
    {
        const DecodeRound round = MakeDecodeRound(t_, unit_, index);
        const uint32_t seq = outputSeq_++;
        const uint32_t bk = t_.blockK;
        const uint32_t d = t_.headDimPad;
        IssueValues();  // V of this round and K of the next do not wait for the vector cores
        IssueKeys();
        AscendC::CrossCoreWaitFlag(kFlagProbs);
        probsIssued_ = 0;
        IssueProbs(round, seq);
        const AscendC::LocalTensor<float> o = oL0c_.BeginFill();
        for (uint32_t sub = 0; sub < round.subBlocks; ++sub) {
            const AscendC::LocalTensor<T> pL1 = pL1_.BeginUse();
            LoadLeft(pL0a_.BeginFill(), pL1, rows16_, bk);
            pL1_.EndUse();
            pL0a_.EndFill();
            IssueProbs(round, seq);

            IssueValues();
            const AscendC::LocalTensor<T> vL1 = vL1_.BeginUse();
            LoadRight(l0b_.BeginFill(), vL1, bk, d);
            vL1_.EndUse();
            l0b_.EndFill();
            IssueValues();

            const AscendC::LocalTensor<T> a = pL0a_.BeginUse();
            if (sub > 0) {
                AscendC::PipeBarrier<PIPE_M>();  // this product accumulates onto the previous one in L0C
            }
            AscendC::Mmad(o, a, l0b_.BeginUse(),
                          AscendC::MmadParams(static_cast<uint16_t>(rows16_), static_cast<uint16_t>(d),
                                              static_cast<uint16_t>(bk), 0, false, sub == 0));
            pL0a_.EndUse();
            l0b_.EndUse();
        }
        oL0c_.EndFill();
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(
            exchange_.Output(seq, 0), oL0c_.BeginUse(),
            AscendC::FixpipeParamsV220(static_cast<uint16_t>(d), static_cast<uint16_t>(rows16_),
                                       static_cast<uint16_t>(rows16_), d, false));
        oL0c_.EndUse();
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagOutput);
    }

    DecodeTiling t_;
    uint32_t core_ = 0;
    DecodeUnit unit_{};
    uint32_t cacheRow_ = 0;     // contiguous cache: the sequence's row (cache_batch_idx)
    uint32_t blocks_ = 0;       // key sub-blocks of the unit
    uint32_t keysIssued_ = 0;
    uint32_t valuesIssued_ = 0;
    uint32_t probsIssued_ = 0;
    uint32_t rows16_ = 0;
    uint32_t scoreSeq_ = 0;     // rounds of the core whose S was written (exchange slots)
    uint32_t outputSeq_ = 0;
    DecodeSequences sequences_;
    DecodeExchange<T> exchange_;
    AscendC::GlobalTensor<T> q_, k_, v_;
    AscendC::GlobalTensor<int32_t> blockTable_, batchIdx_;
    AscendC::TBuf<AscendC::TPosition::A1> qL1Buf_, pL1Buf_;
    AscendC::TBuf<AscendC::TPosition::B1> kL1Buf_, vL1Buf_;
    AscendC::TBuf<AscendC::TPosition::A2> qL0aBuf_, pL0aBuf_;
    AscendC::TBuf<AscendC::TPosition::B2> l0bBuf_;
    AscendC::TBuf<AscendC::TPosition::CO1> oL0cBuf_, sL0cBuf_;
    L1Ring qL1_, kL1_, vL1_, pL1_;
    L0Ring qL0a_, pL0a_, l0b_;
    L0cRing oL0c_, sL0c_;
    AscendC::LocalTensor<T> qA_;
};

}  // namespace flash_cann

#endif
