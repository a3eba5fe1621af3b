// The cube (AIC) half of the FlashAttention backward kernel: all the matrix products.
//
// Key pass, per work unit (a key block of one batch / kv head; flash_cann_grad_tiling.h),
// K and V are loaded into L1 once. Per step (a query block of one query head of the group):
//   ComputeScores           Q, dO -> L1; S = Q K^T and dP = dO V^T (L0C, in pieces of
//                           productRows rows) -> exchange slot -> flag the AIVs
//   AccumulateKeyValueGrad  wait for the AIVs' P and dS -> L1; dV += P^T dO and
//                           dK += dS^T Q, accumulated in L0C over the unit's steps
//   AddQueryGrad            fast dQ only: dQ += dS K, fp32 atomic adds (Fixpipe) into the
//                           workspace, in pieces of productRows rows x dqColumns columns
// After the unit's last step, WriteKeyValueGrad: dK, dV leave L0C once, into the fp32
// workspace (one core owns a unit: no other core writes those rows).
// Query pass (deterministic dQ only), per query unit (a query block of one batch / query
// head) Q and dO stay in L1; per step (a key block it sees, ascending): K, V -> L1, S and
// dP as above, wait for dS, dQ += dS K accumulated in L0C where dK and dV were
// (AccumulateQueryGradInL0c); after the unit's last step WriteQueryGrad stores dQ once: no
// atomics, and the sum's order is the blocks'.
// Scale and cast happen in the vector post-pass. The cube does not wait for the pre-pass:
// it starts on S and dP while the vector cores zero dQ and compute D, and its first dQ
// write follows its vector cores' first P/dS flag, which they raise only after the
// pre-pass barrier (SyncAll<true>, vector cores only). SyncAll<false> (every core) ends
// the main loop: every dQ write and dK/dV write lands before the post-pass reads them.
//
// Preload: the cube issues S and dP of step n+1 (possibly of the next unit) before it
// waits for P and dS of step n, so the vector cores always have a step to work on while
// the cube computes the products of the previous one (kGradStepsInFlight steps; two
// exchange slots; two L1 buffers of Q with dO and two of K with V). The L0C product
// scratch has l0cScratchBuffers copies of one piece (2 where they fit): Mmad fills one
// while Fixpipe drains the other.
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
        // dK and dV of a unit (key pass) or dQ of a query unit (the deterministic query
        // pass), one region: blockQ x D <= 2 blockK x D (GradBufferBytes).
        pipe->InitBuffer(accumulators_, bytes.dkL0c + bytes.dvL0c);
        dk_ = accumulators_.template GetWithOffset<float>(bytes.dkL0c / sizeof(float), 0);
        dv_ = accumulators_.template GetWithOffset<float>(bytes.dvL0c / sizeof(float), bytes.dkL0c);
        dq_ = accumulators_.template Get<float>();
    }

    __aicore__ inline void Process()
    {
        if constexpr (ScoreType<S>::kHalf) {
            // The first Q block's offset panel is the pre-pass's: the cube waits for it
            // (the products of the first steps no longer overlap the pre-pass).
            AscendC::CrossCoreWaitFlag(kFlagGradOffsets);
        }
        RunPass<false>();
        if constexpr (DETERMINISTIC) {
            RunPass<true>();
        }
        AscendC::SyncAll<false>();  // every dQ store or add and dK/dV write has landed
    }

private:
    // A step whose S and dP are issued and whose products are not yet done.
    struct InFlight {
        GradUnit unit;
        GradStep step;
        uint32_t slot;
        AscendC::LocalTensor<T> qL1, doL1, kL1, vL1;
    };

    // One pass over this core's steps: the key pass (K, V resident for a unit; Q, dO per
    // step) or the deterministic dQ's query pass (Q, dO resident for a query unit; K, V
    // per step). S and dP of the next step issue before the products of this one.
    template <bool QUERY_PASS>
    __aicore__ inline void RunPass()
    {
        GradCoreSteps<CAUSAL, QUERY_PASS> cursor(t_, seqlens_, core_);
        while (cursor.Next()) {
            InFlight& step = flight_[issued_ % kGradStepsInFlight];
            const InFlight& before = flight_[(issued_ + kGradStepsInFlight - 1) % kGradStepsInFlight];
            step.unit = cursor.unit;
            step.step = cursor.step;
            step.slot = issued_ % kGradExchangeSlots;
            if (QUERY_PASS || step.step.first) {
                LoadKeyValue(step);
            } else {
                step.kL1 = before.kL1;
                step.vL1 = before.vL1;
            }
            if (!QUERY_PASS || step.step.first) {
                LoadQueryBlock(step);
            } else {
                step.qL1 = before.qL1;
                step.doL1 = before.doL1;
            }
            ComputeScores(step);
            ++issued_;
            if (issued_ - finished_ == kGradStepsInFlight) {
                FinishStep<QUERY_PASS>(flight_[finished_++ % kGradStepsInFlight]);
            }
        }
        while (finished_ < issued_) {
            FinishStep<QUERY_PASS>(flight_[finished_++ % kGradStepsInFlight]);
        }
    }

    __aicore__ inline void LoadKeyValue(InFlight& step)
    {
        const GradUnit& unit = step.unit;
        const uint64_t offset = KeyElement(t_, unit, unit.key0);
        AscendC::LocalTensor<T> kv = kvQue_.template AllocTensor<T>();
        if constexpr (ScoreType<S>::kHalf) {  // K's ones panel (flash_attention_scores.h)
            AscendC::InitConstValue(kv[t_.blockK * t_.headDimPad],
                                    AscendC::InitConstValueParams<T>(
                                        1, static_cast<uint16_t>(t_.blockK * kScoreOffsetColumns * sizeof(T) /
                                                                 kByteBlock),
                                        0, T(1.0f)));
        }
        LoadNz(kv, k_[offset], unit.keys, t_.blockK, t_.headDim, t_.headDimPad, t_.kvStrideRow);
        LoadNz(kv[vOffset_], v_[offset], unit.keys, t_.blockK, t_.headDim, t_.headDimPad, t_.kvStrideRow);
        kvQue_.EnQue(kv);
        step.kL1 = kvQue_.template DeQue<T>();
        step.vL1 = step.kL1[vOffset_];
    }

    __aicore__ inline void LoadQueryBlock(InFlight& step)
    {
        const uint32_t rows16 = AlignUp(step.step.rows, kCubeBlock);
        const uint64_t offset = QueryElement(t_, step.unit, step.step.headQ, step.step.row0);
        AscendC::LocalTensor<T> qdo = qdoQue_.template AllocTensor<T>();
        LoadNz(qdo, q_[offset], step.step.rows, rows16, t_.headDim, t_.headDimPad, t_.qStrideRow);
        if constexpr (ScoreType<S>::kHalf) {  // Q's offset panel, after its last panel
            const uint64_t row = QueryRowIndex(t_, step.unit, step.step.headQ, step.step.row0);
            LoadNz(qdo[rows16 * t_.headDimPad], buffers_.Offsets(row), step.step.rows, rows16, kScoreOffsetColumns,
                   kScoreOffsetColumns, kScoreOffsetColumns);
        }
        LoadNz(qdo[doOffset_], do_[offset], step.step.rows, rows16, t_.headDim, t_.headDimPad, t_.qStrideRow);
        qdoQue_.EnQue(qdo);
        step.qL1 = qdoQue_.template DeQue<T>();
        step.doL1 = step.qL1[doOffset_];
    }

    // The products of a step whose S and dP were issued. Key pass: dV, dK (and the fast
    // dQ); after a unit's last step its dK and dV leave L0C and its K and V are released.
    // Query pass: dQ; after a query unit's last step its dQ leaves L0C and its Q and dO are
    // released.
    template <bool QUERY_PASS>
    __aicore__ inline void FinishStep(InFlight& step)
    {
        rows16_ = AlignUp(step.step.rows, kCubeBlock);
        if constexpr (QUERY_PASS) {
            AccumulateQueryGradInL0c(step);
            kvQue_.FreeTensor(step.kL1);
        } else {
            AccumulateKeyValueGrad(step);
            if constexpr (!DETERMINISTIC) {
                AddQueryGrad(step);
            }
            qdoQue_.FreeTensor(step.qL1);
        }
        pdsQue_.FreeTensor(pL1_);
        if (step.step.last) {
            if constexpr (QUERY_PASS) {
                WriteQueryGrad(step);
                qdoQue_.FreeTensor(step.qL1);
            } else {
                WriteKeyValueGrad(step.unit);
                kvQue_.FreeTensor(step.kL1);
            }
        }
    }

    // C = A B of the operands in a (m rows, Zz) and b (Zn), out through Fixpipe
    // (row-major; fp32, or fp16 through F322F16 for D = half) to `dst` (row pitch `pitch`, the first rowsOut rows), in pieces of
    // productRows rows: each piece is a Mmad into one L0C scratch copy and its Fixpipe, so
    // the next piece's Mmad fills the other copy while this one drains. The caller frees
    // a and b after the last piece's Mmad (lastUse).
    template <typename D>
    __aicore__ inline void MultiplyInPieces(const AscendC::GlobalTensor<D>& dst, AscendC::LocalTensor<T>& a,
                                            AscendC::LocalTensor<T>& b, uint32_t m, uint32_t n, uint32_t k,
                                            uint32_t rowsOut, uint32_t pitch, bool atomicAdd, bool freeA,
                                            bool freeB)
    {
        for (uint32_t row0 = 0; row0 < m; row0 += t_.productRows) {
            const uint32_t rows = MinU32(t_.productRows, m - row0);
            AscendC::LocalTensor<float> c = cQue_.template AllocTensor<float>();
            // A in Zz: a row block of 16 rows is k / 16 fractals, contiguous.
            AscendC::Mmad(c, a[row0 * k], b,
                          AscendC::MmadParams(static_cast<uint16_t>(rows), static_cast<uint16_t>(n),
                                              static_cast<uint16_t>(k), 0, false, true));
            if (row0 + rows >= m) {
                if (freeA) {
                    aQue_.FreeTensor(a);
                }
                if (freeB) {
                    bQue_.FreeTensor(b);
                }
            }
            cQue_.EnQue(c);
            c = cQue_.template DeQue<float>();
            if (atomicAdd) {
                AscendC::SetAtomicAdd<float>();
            }
            AscendC::FixpipeParamsV220 params(static_cast<uint16_t>(n),
                                              static_cast<uint16_t>(MinU32(rows, rowsOut - row0)),
                                              static_cast<uint16_t>(rows), pitch, false);
            params.quantPre = ScoreType<D>::kFixpipeMode;
            AscendC::Fixpipe<D, float, AscendC::CFG_ROW_MAJOR>(dst[uint64_t{row0} * pitch], c, params);
            if (atomicAdd) {
                AscendC::SetAtomicNone();
            }
            cQue_.FreeTensor(c);
        }
    }

    // One product out to `dst`: the caller has loaded the operands into `a` and `b`.
    template <typename D>
    __aicore__ inline void MultiplyOut(const AscendC::GlobalTensor<D>& dst, AscendC::LocalTensor<T>& a,
                                       AscendC::LocalTensor<T>& b, uint32_t m, uint32_t n, uint32_t k,
                                       uint32_t rowsOut, uint32_t pitch)
    {
        aQue_.EnQue(a);
        a = aQue_.template DeQue<T>();
        bQue_.EnQue(b);
        b = bQue_.template DeQue<T>();
        MultiplyInPieces(dst, a, b, m, n, k, rowsOut, pitch, false, true, true);
    }

    // S = Q K^T and dP = dO V^T of the step, into exchange slot `slot`. With fp16 scores
    // S runs over ScoreDepth: Q's offset panel times K's ones panel subtracts each row's
    // offset c in L0C, before the Fixpipe rounds S - c to fp16.
    __aicore__ inline void ComputeScores(InFlight& in)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t ds = ScoreDepth(t_);
        const uint32_t bk = t_.blockK;
        const uint32_t rows16 = AlignUp(in.step.rows, kCubeBlock);
        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, in.qL1, rows16, ds);
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        LoadRightTransposed(b, in.kL1, bk, ds);
        MultiplyOut(buffers_.Scores(in.slot, 0), a, b, rows16, bk, ds, rows16, bk);

        a = aQue_.template AllocTensor<T>();
        LoadLeft(a, in.doL1, rows16, d);
        b = bQue_.template AllocTensor<T>();
        LoadRightTransposed(b, in.vL1, bk, d);
        MultiplyOut(buffers_.ProbsGrad(in.slot, 0), a, b, rows16, bk, d, rows16, bk);
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagGradScores);
    }

    // Waits for the AIVs' P and dS of the step (dS only in the query pass) and loads them
    // into L1 (pL1_, dsL1_).
    __aicore__ inline void LoadProbs(const InFlight& in, bool withProbs)
    {
        const uint32_t bk = t_.blockK;
        AscendC::CrossCoreWaitFlag(kFlagGradProbs);
        AscendC::LocalTensor<T> pds = pdsQue_.template AllocTensor<T>();
        if (withProbs) {
            LoadNz(pds, buffers_.Probs(in.slot, 0), in.step.rows, rows16_, bk, bk, bk);
        }
        LoadNz(pds[dsOffset_], buffers_.ScoresGrad(in.slot, 0), in.step.rows, rows16_, bk, bk, bk);
        pdsQue_.EnQue(pds);
        pL1_ = pdsQue_.template DeQue<T>();
        dsL1_ = pL1_[dsOffset_];
    }

    // dV += P^T dO and dK += dS^T Q, in L0C; the unit's first step initialises them.
    __aicore__ inline void AccumulateKeyValueGrad(const InFlight& in)
    {
        LoadProbs(in, true);
        const AscendC::MmadParams params(static_cast<uint16_t>(t_.blockK), static_cast<uint16_t>(t_.headDimPad),
                                         static_cast<uint16_t>(rows16_), 0, false, in.step.first);
        Accumulate(dv_, pL1_, in.doL1, params, true);
        Accumulate(dk_, dsL1_, in.qL1, params, true);
    }

    // acc (+)= left^T right (transposeLeft: dV, dK; left rows16_ x blockK, right rows16_ x
    // D) or left right (dQ; left rows16_ x blockK, right blockK x D), operands in L1.
    __aicore__ inline void Accumulate(const AscendC::LocalTensor<float>& acc, const AscendC::LocalTensor<T>& left,
                                      const AscendC::LocalTensor<T>& right, const AscendC::MmadParams& params,
                                      bool transposeLeft)
    {
        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        if (transposeLeft) {  // dV, dK: P^T, dS^T (blockK rows); dO, Q (rows16_ x D)
            LoadLeftTransposed(a, left, rows16_, t_.blockK);
            LoadRight(b, right, rows16_, t_.headDimPad);
        } else {  // dQ: dS (rows16_ x blockK); K (blockK x D)
            LoadLeft(a, left, rows16_, t_.blockK);
            LoadRight(b, right, t_.blockK, t_.headDimPad);
        }
        aQue_.EnQue(a);
        a = aQue_.template DeQue<T>();
        bQue_.EnQue(b);
        b = bQue_.template DeQue<T>();
        AscendC::Mmad(acc, a, b, params);
        aQue_.FreeTensor(a);
        bQue_.FreeTensor(b);
    }

    // Fast dQ: dQ += dS K, an fp32 atomic add into the workspace's accumulator, in column
    // pieces of dqColumns (one Mmad of n = dqColumns over a range of K's column panels
    // each; K's Nz panel p starts at p * 16 * blockK) and row pieces of productRows. dS is
    // loaded into L0A once for all of them.
    __aicore__ inline void AddQueryGrad(const InFlight& in)
    {
        const uint32_t d = t_.headDimPad;
        const uint32_t bk = t_.blockK;
        const uint64_t row = QueryRowIndex(t_, in.unit, in.step.headQ, in.step.row0);
        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, dsL1_, rows16_, bk);
        aQue_.EnQue(a);
        a = aQue_.template DeQue<T>();
        for (uint32_t col0 = 0; col0 < d; col0 += t_.dqColumns) {
            const uint32_t cols = MinU32(t_.dqColumns, d - col0);
            AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
            LoadRight(b, in.kL1[col0 * bk], bk, cols);
            bQue_.EnQue(b);
            b = bQue_.template DeQue<T>();
            MultiplyInPieces(buffers_.QueryGrad(row)[col0], a, b, rows16_, cols, bk, in.step.rows, d, true,
                             col0 + cols >= d, true);
        }
    }

    // Deterministic dQ (query pass): dQ of the query unit += dS K in L0C, in the place of
    // the dK/dV accumulators; the query unit's first step initialises it.
    __aicore__ inline void AccumulateQueryGradInL0c(const InFlight& in)
    {
        LoadProbs(in, false);
        const AscendC::MmadParams params(static_cast<uint16_t>(rows16_), static_cast<uint16_t>(t_.headDimPad),
                                         static_cast<uint16_t>(t_.blockK), 0, false, in.step.first);
        Accumulate(dq_, dsL1_, in.kL1, params, false);
    }

    // The accumulators are not queue buffers: order their Mmads and Fixpipes explicitly
    // (the products' queue hand-offs happen to order them today). The ids come from TPipe's
    // event pool: cQue_'s FreeTensor took the lowest free FIX_M id (and each freed L0C
    // buffer keeps one until its next AllocTensor), so a fixed EVENT_ID0 would set an id
    // that is already set. FetchEventID names a free id; each pair's WaitFlag follows its
    // SetFlag with no queue call in between, so the id is still free when it is waited on.
    template <typename Write>
    __aicore__ inline void WriteAccumulators(Write write)
    {
        const AscendC::TEventID toFix = pipe_->FetchEventID<AscendC::HardEvent::M_FIX>();
        AscendC::SetFlag<AscendC::HardEvent::M_FIX>(toFix);
        AscendC::WaitFlag<AscendC::HardEvent::M_FIX>(toFix);
        write();
        // The next unit's first Mmad overwrites the accumulators (with no product in between
        // when that unit's only step is the core's last).
        const AscendC::TEventID toCube = pipe_->FetchEventID<AscendC::HardEvent::FIX_M>();
        AscendC::SetFlag<AscendC::HardEvent::FIX_M>(toCube);
        AscendC::WaitFlag<AscendC::HardEvent::FIX_M>(toCube);
    }

    // dK and dV of the unit's keys: L0C -> fp32 workspace.
    __aicore__ inline void WriteKeyValueGrad(const GradUnit& unit)
    {
        const uint32_t d = t_.headDimPad;
        const uint64_t row = KeyRowIndex(t_, unit, unit.key0);
        const AscendC::FixpipeParamsV220 params(static_cast<uint16_t>(d), static_cast<uint16_t>(unit.keys),
                                                static_cast<uint16_t>(t_.blockK), d, false);
        WriteAccumulators([&] {
            AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(buffers_.KeyGrad(row), dk_, params);
            AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(buffers_.ValueGrad(row), dv_, params);
        });
    }

    // dQ of the query unit's rows: L0C -> fp32 workspace, a plain store (one core owns the
    // rows: no atomics).
    __aicore__ inline void WriteQueryGrad(const InFlight& in)
    {
        const uint32_t d = t_.headDimPad;
        const uint64_t row = QueryRowIndex(t_, in.unit, in.step.headQ, in.step.row0);
        const AscendC::FixpipeParamsV220 params(static_cast<uint16_t>(d), static_cast<uint16_t>(in.step.rows),
                                                static_cast<uint16_t>(rows16_), d, false);
        WriteAccumulators(
            [&] { AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(buffers_.QueryGrad(row), dq_, params); });
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
    AscendC::TBuf<AscendC::TPosition::CO1> accumulators_;
    AscendC::LocalTensor<T> pL1_, dsL1_;
    AscendC::LocalTensor<float> dk_, dv_, dq_;
};

}  // namespace flash_cann

#endif
