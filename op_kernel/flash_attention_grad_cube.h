// The cube (AIC) half of the FlashAttention backward kernel: all five matrix products.
//
// Per work unit (a key block of one batch / kv head; flash_cann_grad_tiling.h), K and V
// are loaded into L1 once. Per step (a query block of one query head of the group):
//   ComputeScores           Q, dO -> L1; S = Q K^T and dP = dO V^T (L0C) -> exchange
//                           slot -> flag the AIVs
//   AccumulateKeyValueGrad  wait for the AIVs' P and dS -> L1; dV += P^T dO and
//                           dK += dS^T Q, accumulated in L0C over the unit's steps
//   AccumulateQueryGrad     dQ += dS K: fp32 atomic add (Fixpipe) into the dQ
//                           accumulator slot of the unit's key-block chunk
// After the unit's last step, WriteKeyValueGrad: dK, dV leave L0C once, into the fp32
// workspace (one core owns a unit: no other core writes those rows). Scale and cast
// happen in the vector post-pass. SyncAll brackets the main loop: the pre-pass (zeroed
// accumulators, D) must be complete before it, and every dQ add before the post-pass.
#ifndef FLASH_CANN_FLASH_ATTENTION_GRAD_CUBE_H
#define FLASH_CANN_FLASH_ATTENTION_GRAD_CUBE_H

#include "flash_attention_fractal.h"
#include "flash_attention_grad_common.h"

namespace flash_cann {

template <typename T, bool CAUSAL, bool MASK, bool DETERMINISTIC>
class FlashAttentionGradCube {
public:
    __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR gradOut,
                                GM_ADDR userWorkspace, const GradTilingData& tiling, AscendC::TPipe* pipe)
    {
        t_ = tiling;
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx());
        q_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(query));
        k_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(key));
        v_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(value));
        do_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(gradOut));
        buffers_.Init(userWorkspace, core_, t_);

        const GradBufferBytes bytes = ComputeGradBufferBytes(t_, sizeof(T));
        pipe->InitBuffer(qQue_, 1, bytes.qL1);
        pipe->InitBuffer(doQue_, 1, bytes.doL1);
        pipe->InitBuffer(kQue_, 1, bytes.kL1);
        pipe->InitBuffer(vQue_, 1, bytes.vL1);
        pipe->InitBuffer(pQue_, 1, bytes.pL1);
        pipe->InitBuffer(dsQue_, 1, bytes.dsL1);
        pipe->InitBuffer(aQue_, 1, bytes.l0a);
        pipe->InitBuffer(bQue_, 1, bytes.l0b);
        pipe->InitBuffer(cQue_, 1, bytes.l0c);
        pipe->InitBuffer(dkAcc_, bytes.dkL0c);
        pipe->InitBuffer(dvAcc_, bytes.dvL0c);
    }

    __aicore__ inline void Process()
    {
        AscendC::SyncAll<false>();  // the pre-pass has zeroed dQ and written D
        for (uint64_t unit = t_.unitStart[core_]; unit < t_.unitStart[core_ + 1]; ++unit) {
            ProcessUnit(UnitAt<CAUSAL>(t_, unit));
        }
        AscendC::SyncAll<false>();  // every dQ add and dK/dV write has landed
    }

private:
    __aicore__ inline void ProcessUnit(const GradUnit& unit)
    {
        const uint64_t kvOffset = uint64_t{unit.batch} * t_.kvStrideBatch +
                                  uint64_t{unit.headKv} * t_.kvStrideHead + uint64_t{unit.key0} * t_.kvStrideRow;
        kL1_ = kQue_.template AllocTensor<T>();
        LoadNz(kL1_, k_[kvOffset], unit.keys, t_.blockK, t_.headDim, t_.headDimPad, t_.kvStrideRow);
        kQue_.EnQue(kL1_);
        kL1_ = kQue_.template DeQue<T>();
        vL1_ = vQue_.template AllocTensor<T>();
        LoadNz(vL1_, v_[kvOffset], unit.keys, t_.blockK, t_.headDim, t_.headDimPad, t_.kvStrideRow);
        vQue_.EnQue(vL1_);
        vL1_ = vQue_.template DeQue<T>();

        dk_ = dkAcc_.template Get<float>();
        dv_ = dvAcc_.template Get<float>();
        GradStep step;
        for (uint32_t index = 0; StepAt(t_, unit, index, step); ++index) {
            const uint32_t slot = stepSeq_++ % kGradExchangeSlots;
            rows16_ = AlignUp(step.rows, kCubeBlock);
            ComputeScores(unit, step, slot);
            AccumulateKeyValueGrad(step, slot);
            AccumulateQueryGrad(unit, step);
            qQue_.FreeTensor(qL1_);
            doQue_.FreeTensor(doL1_);
            pQue_.FreeTensor(pL1_);
            dsQue_.FreeTensor(dsL1_);
        }
        WriteKeyValueGrad(unit);
        kQue_.FreeTensor(kL1_);
        vQue_.FreeTensor(vL1_);
    }

    // One product into L0C and out through Fixpipe (row-major, fp32) to `dst`: the
    // caller has loaded the operands into `a` and `b`.
    __aicore__ inline void MultiplyOut(const AscendC::GlobalTensor<float>& dst, AscendC::LocalTensor<T>& a,
                                       AscendC::LocalTensor<T>& b, uint32_t m, uint32_t n, uint32_t k,
                                       uint32_t rowsOut, uint32_t pitch, bool atomicAdd)
    {
        aQue_.EnQue(a);
        a = aQue_.template DeQue<T>();
        bQue_.EnQue(b);
        b = bQue_.template DeQue<T>();
        AscendC::LocalTensor<float> c = cQue_.template AllocTensor<float>();
        AscendC::Mmad(c, a, b, AscendC::MmadParams(static_cast<uint16_t>(m), static_cast<uint16_t>(n),
                                                   static_cast<uint16_t>(k), 0, false, true));
        aQue_.FreeTensor(a);
        bQue_.FreeTensor(b);
        cQue_.EnQue(c);
        c = cQue_.template DeQue<float>();
        if (atomicAdd) {
            AscendC::SetAtomicAdd<float>();
        }
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(
            dst, c, AscendC::FixpipeParamsV220(static_cast<uint16_t>(n), static_cast<uint16_t>(rowsOut),
                                               static_cast<uint16_t>(m), pitch, false));
        if (atomicAdd) {
            AscendC::SetAtomicNone();
        }
        cQue_.FreeTensor(c);
    }

    // S = Q K^T and dP = dO V^T of the step, into exchange slot `slot`.
    __aicore__ inline void ComputeScores(const GradUnit& unit, const GradStep& step, uint32_t slot)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t bk = t_.blockK;
        const uint64_t offset = uint64_t{unit.batch} * t_.qStrideBatch + uint64_t{step.headQ} * t_.qStrideHead +
                                uint64_t{step.row0} * t_.qStrideRow;
        qL1_ = qQue_.template AllocTensor<T>();
        LoadNz(qL1_, q_[offset], step.rows, rows16_, t_.headDim, d, t_.qStrideRow);
        qQue_.EnQue(qL1_);
        qL1_ = qQue_.template DeQue<T>();
        doL1_ = doQue_.template AllocTensor<T>();
        LoadNz(doL1_, do_[offset], step.rows, rows16_, t_.headDim, d, t_.qStrideRow);
        doQue_.EnQue(doL1_);
        doL1_ = doQue_.template DeQue<T>();

        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, qL1_, rows16_, d);
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        LoadRightTransposed(b, kL1_, bk, d);
        MultiplyOut(buffers_.Scores(slot, 0), a, b, rows16_, bk, d, rows16_, bk, false);

        a = aQue_.template AllocTensor<T>();
        LoadLeft(a, doL1_, rows16_, d);
        b = bQue_.template AllocTensor<T>();
        LoadRightTransposed(b, vL1_, bk, d);
        MultiplyOut(buffers_.ProbsGrad(slot, 0), a, b, rows16_, bk, d, rows16_, bk, false);
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagGradScores);
    }

    // dV += P^T dO and dK += dS^T Q, in L0C; the unit's first step initialises them.
    __aicore__ inline void AccumulateKeyValueGrad(const GradStep& step, uint32_t slot)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t bk = t_.blockK;
        AscendC::CrossCoreWaitFlag(kFlagGradProbs);
        pL1_ = pQue_.template AllocTensor<T>();
        LoadNz(pL1_, buffers_.Probs(slot, 0), step.rows, rows16_, bk, bk, bk);
        pQue_.EnQue(pL1_);
        pL1_ = pQue_.template DeQue<T>();
        dsL1_ = dsQue_.template AllocTensor<T>();
        LoadNz(dsL1_, buffers_.ScoresGrad(slot, 0), step.rows, rows16_, bk, bk, bk);
        dsQue_.EnQue(dsL1_);
        dsL1_ = dsQue_.template DeQue<T>();

        const AscendC::MmadParams params(static_cast<uint16_t>(bk), static_cast<uint16_t>(d),
                                         static_cast<uint16_t>(rows16_), 0, false, step.first);
        Accumulate(dv_, pL1_, doL1_, params);
        Accumulate(dk_, dsL1_, qL1_, params);
    }

    // acc (+)= left^T right, with left and right rows16_ rows in L1.
    __aicore__ inline void Accumulate(const AscendC::LocalTensor<float>& acc, const AscendC::LocalTensor<T>& left,
                                      const AscendC::LocalTensor<T>& right, const AscendC::MmadParams& params)
    {
        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeftTransposed(a, left, rows16_, t_.blockK);
        aQue_.EnQue(a);
        a = aQue_.template DeQue<T>();
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        LoadRight(b, right, rows16_, t_.headDimPad);
        bQue_.EnQue(b);
        b = bQue_.template DeQue<T>();
        AscendC::Mmad(acc, a, b, params);
        aQue_.FreeTensor(a);
        bQue_.FreeTensor(b);
    }

    // dQ += dS K: atomic add into the accumulator slot (fast: the one shared slot;
    // deterministic: the slot of the unit's key-block chunk, which only this core adds to).
    __aicore__ inline void AccumulateQueryGrad(const GradUnit& unit, const GradStep& step)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t bk = t_.blockK;
        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, dsL1_, rows16_, bk);
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        LoadRight(b, kL1_, bk, d);
        const uint64_t row = (uint64_t{unit.batch} * t_.headsQ + step.headQ) * t_.seqlenQ + step.row0;
        MultiplyOut(buffers_.QueryGrad(DETERMINISTIC ? unit.dqSlot : 0, row), a, b, rows16_, d, bk,
                    step.rows, d, true);
    }

    // dK and dV of the unit's keys: L0C -> fp32 workspace.
    __aicore__ inline void WriteKeyValueGrad(const GradUnit& unit)
    {
        const uint32_t d = t_.headDimPad;
        const uint64_t row = (uint64_t{unit.batch} * t_.headsKv + unit.headKv) * t_.seqlenK + unit.key0;
        const AscendC::FixpipeParamsV220 params(static_cast<uint16_t>(d), static_cast<uint16_t>(unit.keys),
                                                static_cast<uint16_t>(t_.blockK), d, false);
        AscendC::SetFlag<AscendC::HardEvent::M_FIX>(EVENT_ID0);
        AscendC::WaitFlag<AscendC::HardEvent::M_FIX>(EVENT_ID0);
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(buffers_.KeyGrad(row), dk_, params);
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(buffers_.ValueGrad(row), dv_, params);
        // The next unit's first Mmad overwrites the accumulators.
        AscendC::SetFlag<AscendC::HardEvent::FIX_M>(EVENT_ID0);
        AscendC::WaitFlag<AscendC::HardEvent::FIX_M>(EVENT_ID0);
    }

    GradTilingData t_;
    uint32_t core_ = 0;
    uint32_t rows16_ = 0;
    uint32_t stepSeq_ = 0;
    GradBuffers<T> buffers_;
    AscendC::GlobalTensor<T> q_, k_, v_, do_;
    AscendC::TQue<AscendC::TPosition::A1, 1> qQue_, doQue_, pQue_, dsQue_;
    AscendC::TQue<AscendC::TPosition::B1, 1> kQue_, vQue_;
    AscendC::TQue<AscendC::TPosition::A2, 1> aQue_;
    AscendC::TQue<AscendC::TPosition::B2, 1> bQue_;
    AscendC::TQue<AscendC::TPosition::CO1, 1> cQue_;
    AscendC::TBuf<AscendC::TPosition::CO1> dkAcc_, dvAcc_;
    AscendC::LocalTensor<T> qL1_, doL1_, kL1_, vL1_, pL1_, dsL1_;
    AscendC::LocalTensor<float> dk_, dv_;
};

}  // namespace flash_cann

#endif
