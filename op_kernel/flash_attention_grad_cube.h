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
// happen in the vector post-pass. The cube does not wait for the pre-pass: it starts on
// S and dP while the vector cores zero dQ and compute D, and its first dQ add follows its
// vector cores' first P/dS flag, which they raise only after the pre-pass barrier
// (SyncAll<true>, vector cores only). SyncAll<false> (every core) ends the main loop:
// every dQ add and dK/dV write lands before the post-pass reads them.
//
// Preload: the cube issues S and dP of step n+1 (possibly of the next unit) before it
// waits for P and dS of step n, so the vector cores always have a step to work on while
// the cube computes the products of the previous one (kGradStepsInFlight steps; two
// exchange slots; two L1 buffers of Q with dO and two of K with V). The L0C product scratch has
// l0cScratchBuffers copies (2 where they fit): Mmad fills one while Fixpipe drains the
// other.
#ifndef FLASH_CANN_FLASH_ATTENTION_GRAD_CUBE_H
#define FLASH_CANN_FLASH_ATTENTION_GRAD_CUBE_H

#include "flash_attention_fractal.h"
#include "flash_attention_grad_common.h"

namespace flash_cann {

// S: the element type of the S exchange slots (ScoreType; half on the fp16_scores path).
template <typename T, bool CAUSAL, bool MASK, bool DETERMINISTIC, typename S = float>
class FlashAttentionGradCube {
public:
    __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR gradOut,
                                GM_ADDR cuSeqlensQ, GM_ADDR cuSeqlensK, GM_ADDR userWorkspace,
                                const GradTilingData& tiling, AscendC::TPipe* pipe)
    {
        t_ = tiling;
        if (IsPacked(t_)) {
            seqlens_.Init(cuSeqlensQ, cuSeqlensK);
        }
        pipe_ = pipe;
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx());
        q_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(query));
        k_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(key));
        v_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(value));
        do_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(gradOut));
        buffers_.Init(userWorkspace, core_, t_);

        const GradBufferBytes bytes = ComputeGradBufferBytes(t_, sizeof(T));
        // Each L1 queue buffer holds a pair that is loaded, used and freed together: Q and
        // dO of a step, K and V of a unit, P and dS of a step. A freed queue buffer keeps an
        // id of TPipe's event pool until its next AllocTensor, and every A1 and B1 queue
        // takes its FreeTensor id from the same pool of eight MTE1_MTE2 ids: with one buffer
        // per block (2 Q + 2 dO + 2 K + 2 V + P + dS) the ten freed buffers of a core's last
        // steps would need ten (asc-devkit kernel_tquebind_impl.h, FreeBuffer). Paired,
        // they hold at most five.
        pipe->InitBuffer(qdoQue_, kGradStepsInFlight, bytes.qL1 + bytes.doL1);
        pipe->InitBuffer(kvQue_, kGradStepsInFlight, bytes.kL1 + bytes.vL1);
        pipe->InitBuffer(pdsQue_, 1, bytes.pL1 + bytes.dsL1);
        doOffset_ = bytes.qL1 / sizeof(T);
        vOffset_ = bytes.kL1 / sizeof(T);
        dsOffset_ = bytes.pL1 / sizeof(T);
        pipe->InitBuffer(aQue_, 1, bytes.l0a);
        pipe->InitBuffer(bQue_, 1, bytes.l0b);
        pipe->InitBuffer(cQue_, t_.l0cScratchBuffers, bytes.l0c);
        pipe->InitBuffer(dkAcc_, bytes.dkL0c);
        pipe->InitBuffer(dvAcc_, bytes.dvL0c);
        dk_ = dkAcc_.template Get<float>();
        dv_ = dvAcc_.template Get<float>();
    }

    __aicore__ inline void Process()
    {
        GradCoreSteps<CAUSAL, DETERMINISTIC> cursor(t_, seqlens_, core_);
        while (cursor.Next()) {
            InFlight& step = flight_[issued_ % kGradStepsInFlight];
            step.unit = cursor.unit;
            step.step = cursor.step;
            step.slot = issued_ % kGradExchangeSlots;
            if (step.step.first) {
                LoadKeyValue(step);
            } else {
                const InFlight& before = flight_[(issued_ + kGradStepsInFlight - 1) % kGradStepsInFlight];
                step.kL1 = before.kL1;
                step.vL1 = before.vL1;
            }
            ComputeScores(step);
            ++issued_;
            if (issued_ - finished_ == kGradStepsInFlight) {
                FinishStep(flight_[finished_++ % kGradStepsInFlight]);
            }
        }
        while (finished_ < issued_) {
            FinishStep(flight_[finished_++ % kGradStepsInFlight]);
        }
        AscendC::SyncAll<false>();  // every dQ add and dK/dV write has landed
    }

private:
    // A step whose S and dP are issued and whose products are not yet done.
    struct InFlight {
        GradUnit unit;
        GradStep step;
        uint32_t slot;
        AscendC::LocalTensor<T> qL1, doL1, kL1, vL1;
    };

    __aicore__ inline void LoadKeyValue(InFlight& step)
    {
        const GradUnit& unit = step.unit;
        const uint64_t offset = KeyElement(t_, unit, unit.key0);
        AscendC::LocalTensor<T> kv = kvQue_.template AllocTensor<T>();
        LoadNz(kv, k_[offset], unit.keys, t_.blockK, t_.headDim, t_.headDimPad, t_.kvStrideRow);
        LoadNz(kv[vOffset_], v_[offset], unit.keys, t_.blockK, t_.headDim, t_.headDimPad, t_.kvStrideRow);
        kvQue_.EnQue(kv);
        step.kL1 = kvQue_.template DeQue<T>();
        step.vL1 = step.kL1[vOffset_];
    }

    // The products of a step whose S and dP were issued; after a unit's last step, its
    // dK and dV leave L0C and its K and V buffers are released.
    __aicore__ inline void FinishStep(InFlight& step)
    {
        rows16_ = AlignUp(step.step.rows, kCubeBlock);
        AccumulateKeyValueGrad(step);
        AccumulateQueryGrad(step);
        qdoQue_.FreeTensor(step.qL1);
        pdsQue_.FreeTensor(pL1_);
        if (step.step.last) {
            WriteKeyValueGrad(step.unit);
            kvQue_.FreeTensor(step.kL1);
        }
    }

    // One product into L0C and out through Fixpipe (row-major; fp32, or fp16 through
    // F322F16 for D = half) to `dst`: the caller has loaded the operands into `a` and `b`.
    template <typename D>
    __aicore__ inline void MultiplyOut(const AscendC::GlobalTensor<D>& dst, AscendC::LocalTensor<T>& a,
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
        AscendC::FixpipeParamsV220 params(static_cast<uint16_t>(n), static_cast<uint16_t>(rowsOut),
                                          static_cast<uint16_t>(m), pitch, false);
        params.quantPre = ScoreType<D>::kFixpipeMode;
        AscendC::Fixpipe<D, float, AscendC::CFG_ROW_MAJOR>(dst, c, params);
        if (atomicAdd) {
            AscendC::SetAtomicNone();
        }
        cQue_.FreeTensor(c);
    }

    // S = Q K^T and dP = dO V^T of the step, into exchange slot `slot`.
    __aicore__ inline void ComputeScores(InFlight& in)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t bk = t_.blockK;
        const GradStep& step = in.step;
        const uint32_t rows16 = AlignUp(step.rows, kCubeBlock);
        const uint64_t offset = QueryElement(t_, in.unit, step.headQ, step.row0);
        AscendC::LocalTensor<T> qdo = qdoQue_.template AllocTensor<T>();
        LoadNz(qdo, q_[offset], step.rows, rows16, t_.headDim, d, t_.qStrideRow);
        LoadNz(qdo[doOffset_], do_[offset], step.rows, rows16, t_.headDim, d, t_.qStrideRow);
        qdoQue_.EnQue(qdo);
        in.qL1 = qdoQue_.template DeQue<T>();
        in.doL1 = in.qL1[doOffset_];

        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, in.qL1, rows16, d);
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        LoadRightTransposed(b, in.kL1, bk, d);
        MultiplyOut(buffers_.Scores(in.slot, 0), a, b, rows16, bk, d, rows16, bk, false);

        a = aQue_.template AllocTensor<T>();
        LoadLeft(a, in.doL1, rows16, d);
        b = bQue_.template AllocTensor<T>();
        LoadRightTransposed(b, in.vL1, bk, d);
        MultiplyOut(buffers_.ProbsGrad(in.slot, 0), a, b, rows16, bk, d, rows16, bk, false);
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagGradScores);
    }

    // dV += P^T dO and dK += dS^T Q, in L0C; the unit's first step initialises them.
    __aicore__ inline void AccumulateKeyValueGrad(const InFlight& in)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t bk = t_.blockK;
        const GradStep& step = in.step;
        AscendC::CrossCoreWaitFlag(kFlagGradProbs);
        AscendC::LocalTensor<T> pds = pdsQue_.template AllocTensor<T>();
        LoadNz(pds, buffers_.Probs(in.slot, 0), step.rows, rows16_, bk, bk, bk);
        LoadNz(pds[dsOffset_], buffers_.ScoresGrad(in.slot, 0), step.rows, rows16_, bk, bk, bk);
        pdsQue_.EnQue(pds);
        pL1_ = pdsQue_.template DeQue<T>();
        dsL1_ = pL1_[dsOffset_];

        const AscendC::MmadParams params(static_cast<uint16_t>(bk), static_cast<uint16_t>(d),
                                         static_cast<uint16_t>(rows16_), 0, false, step.first);
        Accumulate(dv_, pL1_, in.doL1, params);
        Accumulate(dk_, dsL1_, in.qL1, params);
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
    __aicore__ inline void AccumulateQueryGrad(const InFlight& in)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t bk = t_.blockK;
        const GradUnit& unit = in.unit;
        const GradStep& step = in.step;
        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, dsL1_, rows16_, bk);
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        LoadRight(b, in.kL1, bk, d);
        const uint64_t row = QueryRowIndex(t_, unit, step.headQ, step.row0);
        MultiplyOut(buffers_.QueryGrad(DETERMINISTIC ? unit.dqSlot : 0, row), a, b, rows16_, d, bk,
                    step.rows, d, true);
    }

    // dK and dV of the unit's keys: L0C -> fp32 workspace.
    __aicore__ inline void WriteKeyValueGrad(const GradUnit& unit)
    {
        const uint32_t d = t_.headDimPad;
        const uint64_t row = KeyRowIndex(t_, unit, unit.key0);
        const AscendC::FixpipeParamsV220 params(static_cast<uint16_t>(d), static_cast<uint16_t>(unit.keys),
                                                static_cast<uint16_t>(t_.blockK), d, false);
        // The accumulators are not queue buffers: order their Mmads and Fixpipes explicitly
        // (the dQ product's queue hand-off happens to order them today). The ids come from
        // TPipe's event pool: cQue_'s FreeTensor, just before, took the lowest free FIX_M id
        // (and each freed L0C buffer keeps one until its next AllocTensor), so a fixed
        // EVENT_ID0 would set an id that is already set. FetchEventID names a free id; each
        // pair's WaitFlag follows its SetFlag with no queue call in between, so the id is
        // still free when it is waited on.
        const AscendC::TEventID toFix = pipe_->FetchEventID<AscendC::HardEvent::M_FIX>();
        AscendC::SetFlag<AscendC::HardEvent::M_FIX>(toFix);
        AscendC::WaitFlag<AscendC::HardEvent::M_FIX>(toFix);
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(buffers_.KeyGrad(row), dk_, params);
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(buffers_.ValueGrad(row), dv_, params);
        // The next unit's first Mmad overwrites the accumulators (with no product in between
        // when that unit's only step is the core's last).
        const AscendC::TEventID toCube = pipe_->FetchEventID<AscendC::HardEvent::FIX_M>();
        AscendC::SetFlag<AscendC::HardEvent::FIX_M>(toCube);
        AscendC::WaitFlag<AscendC::HardEvent::FIX_M>(toCube);
    }

    GradTilingData t_;
    DeviceSeqlens seqlens_;  // layout TND only
    AscendC::TPipe* pipe_ = nullptr;
    uint32_t core_ = 0;
    uint32_t rows16_ = 0;  // rows of the step being finished, padded to 16
    uint32_t doOffset_ = 0, vOffset_ = 0, dsOffset_ = 0;  // the second block of each L1 pair (elements)
    uint32_t issued_ = 0;
    uint32_t finished_ = 0;
    InFlight flight_[kGradStepsInFlight];
    GradBuffers<T, S> buffers_;
    AscendC::GlobalTensor<T> q_, k_, v_, do_;
    AscendC::TQue<AscendC::TPosition::A1, 1> qdoQue_, pdsQue_;
    AscendC::TQue<AscendC::TPosition::B1, 1> kvQue_;
    AscendC::TQue<AscendC::TPosition::A2, 1> aQue_;
    AscendC::TQue<AscendC::TPosition::B2, 1> bQue_;
    AscendC::TQue<AscendC::TPosition::CO1, 1> cQue_;
    AscendC::TBuf<AscendC::TPosition::CO1> dkAcc_, dvAcc_;
    AscendC::LocalTensor<T> pL1_, dsL1_;
    AscendC::LocalTensor<float> dk_, dv_;
};

}  // namespace flash_cann

#endif
