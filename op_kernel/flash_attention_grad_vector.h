// The vector (AIV) half of the FlashAttention backward kernel.
//
//   PrePass       ZeroAccumulators: the fp32 dQ <- 0 (the fast dQ adds into it; rows no
//                 key is seen by stay 0 with the deterministic dQ), and dK, dV of the
//                 units a sliding window hides from every query (no step writes them);
//                 ComputeDelta: D = rowsum(dO * O) - dLSE
//                 per query row (dLSE is optional: softmax_lse is a differentiable
//                 output); then SyncAll of the vector cores (the cube is already
//                 computing S and dP).
//   SoftmaxGrad   per step of the main loop (the cube's query block x key block), on this
//                 vector core's half of the rows: the scores as the forward made them,
//                 s = S scale, softcapped (t = tanh(s / softcap), s = softcap t), ALiBi
//                 (s -= slope |i + offset - j|), masked (key bias, causal, window);
//                 P = exp(s - lse) from the saved lse, dS = P (dP - D), times 1 - t^2
//                 with softcap; P and dS in the input dtype -> exchange slot -> flag the
//                 cube. Rows whose lse is -inf (they see no key) have every column
//                 masked; lse is clamped to the lowest float so their P is exp(-inf) = 0,
//                 never NaN, and their gradients are zero. The deterministic dQ's query
//                 pass runs the same per step (the cube's S and dP again) and stores dS
//                 only (its cube reads no P).
//   PostPass      after SyncAll: dQ = scale * dQ, dK = scale * dK, dV; cast; DataCopyPad
//                 into the output layout
//                 (row pitch of BNSD/BSND, head_dim not a multiple of 16). SinkGrad:
//                 grad_sinks[h] = -sum_{b,i} exp(sink_h - lse) D, in a fixed order.
// The pre- and post-passes split their rows evenly over all vector cores of the launch.
#ifndef FLASH_CANN_FLASH_ATTENTION_GRAD_VECTOR_H
#define FLASH_CANN_FLASH_ATTENTION_GRAD_VECTOR_H

#include "flash_attention_grad_common.h"
#include "flash_attention_features.h"
#include "flash_attention_philox.h"
#include "flash_attention_vector_ops.h"

namespace flash_cann {

static_assert(GradPhiloxScratchBytes(96) == PhiloxScratchBytes(GradDropoutPass(96)) &&
                  GradPhiloxScratchBytes(128) == PhiloxScratchBytes(GradDropoutPass(128)),
              "the planner's dropout scratch is PhiloxDropout's");

// The zeroing pass moves whole 512-byte units (the workspace alignment).
constexpr uint32_t kZeroUnitFloats = kGradWorkspaceAlign / sizeof(float);

// S: the element type of the S exchange slots (half on the fp16_scores path: each loaded
// block is clamped and widened to fp32 once, WidenScores; the rest is the fp32 path's).
template <typename T, bool CAUSAL, bool MASK, bool DETERMINISTIC, typename S = float>
class FlashAttentionGradVector {
public:
    __aicore__ inline void Init(const GradTensors& gm, GM_ADDR userWorkspace, const GradTilingData& tiling,
                                AscendC::TPipe* pipe)
    {
        t_ = tiling;
        pipe_ = pipe;
        aiv_ = static_cast<uint32_t>(AscendC::GetBlockIdx());
        core_ = aiv_ / kVectorCoresPerCube;
        sub_ = static_cast<uint32_t>(AscendC::GetSubBlockIdx());
        out_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(gm.out));
        do_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(gm.gradOut));
        lse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(gm.softmaxLse));
        hasGradLse_ = gm.gradSoftmaxLse != nullptr;
        if (hasGradLse_) {
            gradLse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(gm.gradSoftmaxLse));
        }
        dq_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(gm.gradQuery));
        dk_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(gm.gradKey));
        dv_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(gm.gradValue));
        gradSinks_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(gm.gradSinks));
        hasSinks_ = t_.variant.sinks != 0u;
        if (hasSinks_) {
            sinks_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(gm.sinks));
        }
        buffers_.Init(userWorkspace, core_, t_);
        if (IsPacked(t_)) {
            seqlens_.Init(gm.cuSeqlensQ, gm.cuSeqlensK);
        }

        const GradBufferBytes bytes = ComputeGradBufferBytes(t_, sizeof(T));
        pipe->InitBuffer(sQue_, 1, bytes.sUb);
        if constexpr (ScoreType<S>::kHalf) {
            pipe->InitBuffer(scoreBuf_, bytes.sF32Ub);
            scores_ = scoreBuf_.template Get<float>();
        }
        pipe->InitBuffer(dpQue_, 1, bytes.dpUb);
        pipe->InitBuffer(pQue_, 1, bytes.pUb);
        pipe->InitBuffer(dsQue_, 1, bytes.dsUb);
        pipe->InitBuffer(lseQue_, 1, bytes.rowUb);
        pipe->InitBuffer(deltaQue_, 1, bytes.rowUb);
        pipe->InitBuffer(brcBuf_, bytes.brcUb);
        masking_.Init(pipe, gm.keyPaddingMask, t_, bytes.keyUb, bytes.maskUb, bytes.maskHalfUb, bytes.bitsUb);
        InitFeatures(gm, bytes);
        pipe->InitBuffer(passInQue_, 2, bytes.passInUb);
        pipe->InitBuffer(passLoadQue_, 1, bytes.passAccUb);
        pipe->InitBuffer(passBuf_, 2 * bytes.passAccUb);
        pipe->InitBuffer(passOutQue_, 1, bytes.passOutUb);
        pipe->InitBuffer(rowOutQue_, 1, bytes.passRowUb);
        pipe->InitBuffer(rowBuf_, bytes.passRowUb);
        broadcast_ = brcBuf_.template Get<float>();
        acc_ = passBuf_.template GetWithOffset<float>(bytes.passAccUb / sizeof(float), 0);
        operand_ = passBuf_.template GetWithOffset<float>(bytes.passAccUb / sizeof(float), bytes.passAccUb);
        rowPartial_ = rowBuf_.template Get<float>();
    }

    __aicore__ inline void Process()
    {
        ZeroAccumulators();
        ComputeDelta();
        // Every vector core's dQ zeroing and D precede any step: the cube's dQ adds wait for
        // this core's P/dS flags, so the cube need not join this barrier.
        AscendC::SyncAll<true>();
        if constexpr (ScoreType<S>::kHalf) {
            // Every row's offset panel (ComputeDelta) precedes the cube's first S.
            AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(kFlagGradOffsets);
        }
        RunPass<false>();
        if constexpr (DETERMINISTIC) {
            RunPass<true>();
        }
        AscendC::SyncAll<false>();
        PostPass();
        SinkGrad();
    }

private:
    // The cube's steps of one pass (the key pass, or the deterministic dQ's query pass,
    // whose cube reads dS only), in the cube's order; the exchange slots alternate across
    // both passes as the cube's do.
    template <bool QUERY_PASS>
    __aicore__ inline void RunPass()
    {
        GradCoreSteps<CAUSAL, QUERY_PASS> cursor(t_, seqlens_, core_);
        while (cursor.Next()) {
            SoftmaxGrad(cursor.unit, cursor.step, steps_++ % kGradExchangeSlots, !QUERY_PASS);
        }
    }

    __aicore__ inline uint32_t Aivs() const { return t_.usedCores * kVectorCoresPerCube; }

    // The feature buffers, only for the features the call uses (GradBufferBytes).
    __aicore__ inline void InitFeatures(const GradTensors& gm, const GradBufferBytes& bytes)
    {
        const VariantTiling& v = t_.variant;
        softcap_ = v.softcap;
        windowed_ = IsWindowed(v);
        alibi_ = v.alibi != 0u;
        if (bytes.featureUb > 0) {
            pipe_->InitBuffer(featureBuf_, bytes.featureUb);
            feature_ = featureBuf_.template Get<float>();
        }
        if (bytes.tanhUb > 0) {
            pipe_->InitBuffer(tanhBuf_, bytes.tanhUb);
            tanh_ = tanhBuf_.template Get<float>();
        }
        if (alibi_) {
            alibiBias_.Init(pipe_, gm.alibiSlopes, v, t_.headsQ, t_.blockQ / 2, t_.blockK);
        }
        if (windowed_) {
            band_.Init(pipe_, v, t_.blockK, bytes.bandKeyUb, bytes.bandBitsUb);
        }
        dropout_ = v.dropoutP > 0.0f;
        if (dropout_) {
            pipe_->InitBuffer(philoxBuf_, bytes.philoxUb);
            pipe_->InitBuffer(keepBuf_, bytes.keepUb);
            keep_ = keepBuf_.template Get<uint8_t>();
            philox_.Init(gm.rngState, v.dropoutThreshold, philoxBuf_.template Get<uint8_t>(),
                         GradDropoutPass(t_.blockK));
            keepScale_ = 1.0f / (1.0f - v.dropoutP);
        }
    }

    // ---- pre-pass -------------------------------------------------------------------

    // The dQ accumulator <- 0 (the fast dQ adds into it; the deterministic query pass
    // stores the rows of every query unit that sees a key, and the others stay 0), and dK,
    // dV of the units no query sees (a window can hide a key
    // block from every query: the walk skips the unit, so no step writes them).
    __aicore__ inline void ZeroAccumulators()
    {
        const GradWorkspace ws(t_, sizeof(T));
        uint64_t begin, end;
        // Packed sequences: which key blocks no query sees is known only on the device,
        // and tokens outside every sequence have no unit; dK and dV (which follow the dQ
        // slots) are zeroed whole, so every key row without a step has gradient 0.
        const uint64_t zeroBytes = (IsPacked(t_) ? ws.exchange : ws.dk) - ws.dq;
        PassRange(zeroBytes / kGradWorkspaceAlign, aiv_, Aivs(), begin, end);
        const uint32_t chunk = acc_.GetSize() / kZeroUnitFloats * kZeroUnitFloats;
        AscendC::Duplicate(acc_, 0.0f, static_cast<int32_t>(chunk));
        // V_MTE3 and MTE3_V are the VECOUT queues' EnQue and FreeTensor events: their ids
        // come from TPipe's event pool. No queue has run yet, but a fixed id would collide
        // with a freed VECOUT buffer's (which keeps its MTE3_V id until its next
        // AllocTensor) if this moved; FetchEventID names a free id, and nothing of the pool
        // runs between each SetFlag and its WaitFlag.
        const AscendC::TEventID toStore = pipe_->FetchEventID<AscendC::HardEvent::V_MTE3>();
        AscendC::SetFlag<AscendC::HardEvent::V_MTE3>(toStore);
        AscendC::WaitFlag<AscendC::HardEvent::V_MTE3>(toStore);
        const AscendC::GlobalTensor<float> dq = buffers_.QueryGradRegion();
        for (uint64_t at = begin * kZeroUnitFloats; at < end * kZeroUnitFloats; at += chunk) {
            const uint64_t left = end * kZeroUnitFloats - at;
            AscendC::DataCopy(dq[at], acc_, static_cast<uint32_t>(left < chunk ? left : chunk));
        }
        if (windowed_ && !IsPacked(t_)) {
            PassRange(t_.units, aiv_, Aivs(), begin, end);
            for (uint64_t unit = begin; unit < end; ++unit) {
                const GradUnit u = UnitAt<CAUSAL>(t_, unit);
                if (u.firstQueryBlock == u.endQueryBlock) {
                    const uint64_t row = (uint64_t{u.batch} * t_.headsKv + u.headKv) * t_.seqlenK + u.key0;
                    ZeroRows(buffers_.KeyGrad(row), u.keys * t_.headDimPad, chunk);
                    ZeroRows(buffers_.ValueGrad(row), u.keys * t_.headDimPad, chunk);
                }
            }
        }
        const AscendC::TEventID toVector = pipe_->FetchEventID<AscendC::HardEvent::MTE3_V>();
        AscendC::SetFlag<AscendC::HardEvent::MTE3_V>(toVector);
        AscendC::WaitFlag<AscendC::HardEvent::MTE3_V>(toVector);
    }

    // `count` fp32 zeros from acc_ (zeroed, `chunk` of them) into dst.
    __aicore__ inline void ZeroRows(const AscendC::GlobalTensor<float>& dst, uint32_t count, uint32_t chunk)
    {
        for (uint32_t at = 0; at < count; at += chunk) {
            AscendC::DataCopy(dst[at], acc_, MinU32(chunk, count - at));
        }
    }

    // `rows` rows of head_dim elements (GM row pitch `pitch`) -> UB rows of headDimPad,
    // the padding columns zero.
    __aicore__ inline void LoadRows(const AscendC::LocalTensor<T>& dst, const AscendC::GlobalTensor<T>& src,
                                    uint32_t rows, uint64_t pitch)
    {
        const uint32_t d = t_.headDim;
        AscendC::DataCopyPad(dst, src,
                             AscendC::DataCopyExtParams(static_cast<uint16_t>(rows), d * sizeof(T),
                                                        static_cast<uint32_t>((pitch - d) * sizeof(T)), 0, 0),
                             AscendC::DataCopyPadExtParams<T>(true, 0, static_cast<uint8_t>(t_.headDimPad - d),
                                                              T(0.0f)));
    }

    // result[r] = sum of row r of the [rows][headDimPad] fp32 tile acc_, 64 columns at a
    // time (one repeat per row), the column groups added in order.
    __aicore__ inline void RowSum(const AscendC::LocalTensor<float>& result, uint32_t rows)
    {
        const uint32_t d = t_.headDimPad;
        const int32_t pitch = static_cast<int32_t>(d / kFloatsPerBlock);
        for (uint32_t col = 0; col < d; col += kFloatsPerRepeat) {
            const int32_t mask = static_cast<int32_t>(MinU32(kFloatsPerRepeat, d - col));
            AscendC::WholeReduceSum(col == 0 ? result : rowPartial_, acc_[col], mask,
                                    static_cast<int32_t>(rows), 1, 1, pitch);
            AscendC::PipeBarrier<PIPE_V>();
            if (col > 0) {
                AscendC::Add(result, result, rowPartial_, static_cast<int32_t>(rows));
                AscendC::PipeBarrier<PIPE_V>();
            }
        }
    }

    // D = rowsum(dO * O) - dLSE, for this vector core's share of the query rows.
    __aicore__ inline void ComputeDelta()
    {
        const uint32_t d = t_.headDimPad;
        uint64_t cursor, end;
        PassRange(GradQueryRows(t_), aiv_, Aivs(), cursor, end);
        PassChunk chunk;
        const uint32_t perPair = GradQueryRowsPerPair(t_);
        while (NextPassChunk(t_, perPair, cursor, end, chunk)) {
            const uint64_t offset = QueryOffset(chunk);
            const uint64_t row = chunk.pair * perPair + chunk.row0;
            const uint32_t count = chunk.rows * d;
            AscendC::LocalTensor<T> gradOut = passInQue_.template AllocTensor<T>();
            LoadRows(gradOut, do_[offset], chunk.rows, t_.qStrideRow);
            passInQue_.EnQue(gradOut);
            AscendC::LocalTensor<T> out = passInQue_.template AllocTensor<T>();
            LoadRows(out, out_[offset], chunk.rows, t_.qStrideRow);
            passInQue_.EnQue(out);
            gradOut = passInQue_.template DeQue<T>();
            out = passInQue_.template DeQue<T>();
            AscendC::Cast(acc_, gradOut, AscendC::RoundMode::CAST_NONE, count);
            AscendC::Cast(operand_, out, AscendC::RoundMode::CAST_NONE, count);
            passInQue_.FreeTensor(gradOut);
            passInQue_.FreeTensor(out);
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Mul(acc_, acc_, operand_, static_cast<int32_t>(count));
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::LocalTensor<float> delta = rowOutQue_.template AllocTensor<float>();
            RowSum(delta, chunk.rows);
            if (hasGradLse_) {
                // The load queue (fp32, passRows x D) holds the chunk's dLSE here.
                AscendC::LocalTensor<float> gradLse = passLoadQue_.template AllocTensor<float>();
                AscendC::DataCopyPad(gradLse, gradLse_[row],
                                     AscendC::DataCopyExtParams(1, chunk.rows * sizeof(float), 0, 0, 0),
                                     AscendC::DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
                passLoadQue_.EnQue(gradLse);
                gradLse = passLoadQue_.template DeQue<float>();
                AscendC::Sub(delta, delta, gradLse, static_cast<int32_t>(chunk.rows));
                passLoadQue_.FreeTensor(gradLse);
            }
            rowOutQue_.EnQue(delta);
            delta = rowOutQue_.template DeQue<float>();
            AscendC::DataCopyPad(buffers_.Delta(row), delta,
                                 AscendC::DataCopyExtParams(1, chunk.rows * sizeof(float), 0, 0, 0));
            rowOutQue_.FreeTensor(delta);
            if constexpr (ScoreType<S>::kHalf) {
                WriteOffsetPanel(row, chunk.row0, chunk.rows);
            }
        }
    }

    // fp16 scores: the rows' offset panel (-a in each of its kScoreOffsetColumns columns,
    // ScoreOffsetHalves) from their lse, into the workspace, where the cube loads it beside
    // Q. Rows firstRow .. of their sequence. acc_ and operand_ are free here (RowSum has
    // read acc_; the next chunk's Casts wait for the barrier at the end).
    __aicore__ inline void WriteOffsetPanel(uint64_t row, uint32_t firstRow, uint32_t rows)
    {
        // fp16 inputs only (the planner refuses fp16 scores for bf16): Brcb broadcasts half
        // into a panel of T, so a bf16 instantiation of this member would not compile.
        if constexpr (ScoreType<T>::kHalf) {
            AscendC::LocalTensor<float> lse = passLoadQue_.template AllocTensor<float>();
            AscendC::DataCopyPad(lse, lse_[row], AscendC::DataCopyExtParams(1, rows * sizeof(float), 0, 0, 0),
                                 AscendC::DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
            passLoadQue_.EnQue(lse);
            lse = passLoadQue_.template DeQue<float>();
            const AscendC::LocalTensor<half> negA = operand_.template ReinterpretCast<half>();
            OffsetShift(acc_, acc_[t_.passRows], firstRow, rows);
            ScoreOffsetHalves(negA, acc_, lse, t_.scale, rows);
            passLoadQue_.FreeTensor(lse);
            // Each row's -a over one 32-byte block: the panel's row of 16 halves.
            AscendC::LocalTensor<T> panel = passOutQue_.template AllocTensor<T>();
            AscendC::Brcb(panel, negA, static_cast<uint8_t>((rows + kFloatsPerBlock - 1) / kFloatsPerBlock),
                          AscendC::BrcbRepeatParams(1, kFloatsPerBlock));
            AscendC::PipeBarrier<PIPE_V>();  // Brcb's reads of operand_ -> the next chunk's Cast
            passOutQue_.EnQue(panel);
            panel = passOutQue_.template DeQue<T>();
            AscendC::DataCopy(buffers_.Offsets(row), panel, rows * kScoreOffsetColumns);
            passOutQue_.FreeTensor(panel);
        }
    }

    // ---- main loop ------------------------------------------------------------------

    // Per-row values (lse or D) of this vector core's rows -> UB.
    __aicore__ inline AscendC::LocalTensor<float> LoadRowValues(AscendC::TQue<AscendC::TPosition::VECIN, 1>& que,
                                                               const AscendC::GlobalTensor<float>& src)
    {
        AscendC::LocalTensor<float> values = que.template AllocTensor<float>();
        AscendC::DataCopyPad(values, src, AscendC::DataCopyExtParams(1, rows_ * sizeof(float), 0, 0, 0),
                             AscendC::DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
        que.EnQue(values);
        return que.template DeQue<float>();
    }

    template <typename U>
    __aicore__ inline AscendC::LocalTensor<U> LoadBlock(AscendC::TQue<AscendC::TPosition::VECIN, 1>& que,
                                                       const AscendC::GlobalTensor<U>& src)
    {
        AscendC::LocalTensor<U> block = que.template AllocTensor<U>();
        AscendC::DataCopy(block, src, rows_ * t_.blockK);
        que.EnQue(block);
        return que.template DeQue<U>();
    }

    // The block's scores as fp32: the loaded block itself, or (fp16 scores) clamped and
    // widened into scores_ (WidenScores).
    __aicore__ inline AscendC::LocalTensor<float> Widen(const AscendC::LocalTensor<S>& loaded, uint32_t count)
    {
        if constexpr (ScoreType<S>::kHalf) {
            WidenScores(scores_, loaded, count);
            return scores_;
        } else {
            return loaded;
        }
    }

    // fp16 scores: the shift of the offset (ScoreOffsetHalves: c = (lse - shift) / scale)
    // of rows firstRow .. firstRow + count - 1 of their sequence: half the log of the keys
    // the row sees. Where a row's probability mass sits is not known before its scores
    // are: at p ~ 1 (a peaked row; c = lse / scale is its max) or at p ~ 1 / n (a flat row
    // of n keys; its bulk is near (lse - ln n) / scale), and the rounding error of a score
    // is proportional to |s - c|, so the midpoint ln(n) / 2 halves the worst case of both
    // (docs/kernel-backward.md, "The fp16-score fast path", has the measured alternatives). n:
    // the causal bound and the window's sides, within [1, seqlenK] (a key mask is not
    // counted); packed sequences: the widest row's, as the pre-pass does not know a row's
    // sequence.
    __aicore__ inline void OffsetShift(const AscendC::LocalTensor<float>& shift,
                                       const AscendC::LocalTensor<float>& scratch, uint32_t firstRow, uint32_t count)
    {
        const int32_t n = static_cast<int32_t>(count);
        const int64_t left = t_.variant.windowLeft;
        const int64_t right = CAUSAL ? 0 : t_.variant.windowRight;
        const float lastKey = static_cast<float>(t_.seqlenK) - 1.0f;
        if (IsPacked(t_) || (left < 0 && right < 0)) {
            const int64_t width = left >= 0 && right >= 0 ? left + right + 1 : int64_t{t_.seqlenK};
            AscendC::Duplicate(shift, static_cast<float>(width < t_.seqlenK ? width : t_.seqlenK), n);
        } else {
            // Row i sees keys max(i + offset - left, 0) .. min(i + offset + right, seqlenK - 1).
            const float offset = static_cast<float>(t_.causalOffset);
            AscendC::CreateVecIndex(scratch, static_cast<float>(firstRow), count);
            AscendC::PipeBarrier<PIPE_V>();  // the row index -> the bounds
            if (right >= 0) {
                AscendC::Adds(shift, scratch, offset + static_cast<float>(right), n);
            } else {
                AscendC::Duplicate(shift, lastKey, n);
            }
            AscendC::PipeBarrier<PIPE_V>();  // Adds' reads of the row index -> its update
            if (left >= 0) {
                AscendC::Adds(scratch, scratch, offset - static_cast<float>(left), n);
            } else {
                AscendC::Duplicate(scratch, 0.0f, n);
            }
            AscendC::PipeBarrier<PIPE_V>();  // the bounds -> their clamps
            AscendC::Mins(shift, shift, lastKey, n);
            AscendC::Maxs(scratch, scratch, 0.0f, n);
            AscendC::PipeBarrier<PIPE_V>();  // the clamps -> Sub
            AscendC::Sub(shift, shift, scratch, n);
            AscendC::PipeBarrier<PIPE_V>();  // Sub -> Adds
            AscendC::Adds(shift, shift, 1.0f, n);
            AscendC::PipeBarrier<PIPE_V>();  // Adds -> Maxs
            AscendC::Maxs(shift, shift, 1.0f, n);
        }
        AscendC::PipeBarrier<PIPE_V>();  // the key count -> Ln
        AscendC::Ln(shift, shift, n);
        AscendC::PipeBarrier<PIPE_V>();  // Ln -> Muls
        AscendC::Muls(shift, shift, 0.5f, n);
        AscendC::PipeBarrier<PIPE_V>();  // Muls -> ScoreOffsetHalves
    }

    // fp16 scores: the cube's S is S - c (c = 16 a, ScoreOffsetHalves). Without softcap
    // S - c reaches exp scaled and shifted only (ALiBi, masks), so c scale folds into lse:
    // P = exp((S - c) scale - (lse - c scale)), lse <- lse - c scale, in fp32, for this
    // core's rows firstRow .. of their sequence; broadcast_ is scratch until RowBroadcast
    // fills it. softcap's tanh needs the scores themselves: -c scale per row goes to
    // feature_ (its scratch, free until Softcap) and AddOffsetToScores adds it back.
    __aicore__ inline void AddOffsetToLse(const AscendC::LocalTensor<float>& lse, uint32_t firstRow)
    {
        const uint32_t floats = AlignUp(rows_, kFloatsPerBlock);
        const AscendC::LocalTensor<float> work = softcap_ > 0.0f ? feature_ : broadcast_;
        const AscendC::LocalTensor<half> negA = broadcast_[2 * floats].template ReinterpretCast<half>();
        OffsetShift(work, broadcast_[floats], firstRow, rows_);
        ScoreOffsetHalves(negA, work, lse, t_.scale, rows_);
        AscendC::Cast(work, negA, AscendC::RoundMode::CAST_NONE, rows_);
        AscendC::PipeBarrier<PIPE_V>();  // Cast -> Muls
        AscendC::Muls(work, work, t_.scale * kScoreOffsetColumns, static_cast<int32_t>(rows_));  // -c scale
        if (softcap_ > 0.0f) {
            return;  // the next V step orders feature_'s write before its read (RowBroadcast)
        }
        AscendC::PipeBarrier<PIPE_V>();  // Muls -> Add
        // Add -> lse's clamp: WidenScores' barriers, in between, order them.
        AscendC::Add(lse, lse, work, static_cast<int32_t>(rows_));
    }

    // fp16 scores with softcap: s <- s + c scale (s = (S - c) scale), row by row.
    __aicore__ inline void AddOffsetToScores(const AscendC::LocalTensor<float>& s)
    {
        RowBroadcast<RowOp::kSubtract>(s, feature_, broadcast_, rows_, t_.blockK);
    }

    __aicore__ inline void StoreBlock(AscendC::TQue<AscendC::TPosition::VECOUT, 1>& que,
                                      const AscendC::GlobalTensor<T>& dst, const AscendC::LocalTensor<float>& src)
    {
        const uint32_t count = rows_ * t_.blockK;
        AscendC::LocalTensor<T> cast = que.template AllocTensor<T>();
        AscendC::Cast(cast, src, AscendC::RoundMode::CAST_RINT, count);
        que.EnQue(cast);
        cast = que.template DeQue<T>();
        AscendC::DataCopy(dst, cast, count);
        que.FreeTensor(cast);
    }

    __aicore__ inline void SoftmaxGrad(const GradUnit& unit, const GradStep& step, uint32_t slot, bool withProbs)
    {
        const uint32_t bk = t_.blockK;
        const uint32_t firstHalf = (step.rows + 1) / 2;
        rows_ = sub_ == 0 ? firstHalf : step.rows - firstHalf;
        const uint32_t rowOffset = sub_ == 0 ? 0 : firstHalf;
        const uint32_t count = rows_ * bk;
        AscendC::CrossCoreWaitFlag(kFlagGradScores);
        if (rows_ > 0) {
            const uint32_t firstRow = step.row0 + rowOffset;
            const uint64_t row = QueryRowIndex(t_, unit, step.headQ, firstRow);
            // A scalar read of GM, issued before the tile's loads are waited for.
            const float slope = alibi_ ? alibiBias_.Slope(unit.batch, step.headQ) : 0.0f;
            AscendC::LocalTensor<float> lse = LoadRowValues(lseQue_, lse_[row]);
            if constexpr (ScoreType<S>::kHalf) {
                AddOffsetToLse(lse, firstRow);
            }
            AscendC::LocalTensor<float> delta = LoadRowValues(deltaQue_, buffers_.Delta(row));
            AscendC::LocalTensor<S> loaded = LoadBlock(sQue_, buffers_.Scores(slot, rowOffset * bk));
            AscendC::LocalTensor<float> s = Widen(loaded, count);
            AscendC::LocalTensor<float> dp = LoadBlock(dpQue_, buffers_.ProbsGrad(slot, rowOffset * bk));
            // P = exp(features(S scale) + mask - lse)
            AscendC::Muls(s, s, t_.scale, static_cast<int32_t>(count));
            AscendC::Maxs(lse, lse, kLowest, static_cast<int32_t>(rows_));
            AscendC::PipeBarrier<PIPE_V>();
            if (softcap_ > 0.0f) {
                if constexpr (ScoreType<S>::kHalf) {
                    AddOffsetToScores(s);
                }
                Softcap(s, tanh_, feature_, softcap_, count);
            }
            if (alibi_) {
                alibiBias_.Apply(s, feature_, rows_, unit.causalOffset, firstRow, unit.key0, slope);
            }
            masking_.Apply(s, rows_, unit.batch, unit.causalOffset, firstRow, unit.key0, unit.keys);
            if (windowed_) {
                band_.Apply(s, rows_, unit.causalOffset, firstRow, unit.key0, unit.keys);
            }
            RowBroadcast<RowOp::kSubtract>(s, lse, broadcast_, rows_, bk);
            AscendC::Exp(s, s, static_cast<int32_t>(count));
            if (dropout_) {
                // The forward's keep mask Z, regenerated: dP <- dP Z / (1 - p) (the dropped
                // output's gradient reaches P through the kept entries only).
                // Whole repeats: 8 rows of blockK (a multiple of 16) are; the rows past the
                // step's (at most blockQ / 2 in all) draw bits nobody reads.
                philox_.Generate(keep_, unit.batch, step.headQ, firstRow, AlignUp(rows_, 8u), unit.key0, bk);
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Select(dp, keep_, dp, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Muls(dp, dp, keepScale_, static_cast<int32_t>(count));
            }
            // dS = P (dP - D)
            RowBroadcast<RowOp::kSubtract>(dp, delta, broadcast_, rows_, bk);
            AscendC::Mul(dp, dp, s, static_cast<int32_t>(count));
            AscendC::PipeBarrier<PIPE_V>();
            if (softcap_ > 0.0f) {
                // The softcap's chain rule: dS *= d(softcap tanh(x / softcap))/dx = 1 - t^2.
                AscendC::Mul(feature_, tanh_, tanh_, static_cast<int32_t>(count));
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Mul(feature_, feature_, dp, static_cast<int32_t>(count));
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Sub(dp, dp, feature_, static_cast<int32_t>(count));
                AscendC::PipeBarrier<PIPE_V>();
            }
            if (dropout_ && withProbs) {
                // dV += (P Z)^T dO: the cube takes the dropped P; its 1 / (1 - p) is
                // applied to dV once, in the post-pass.
                AscendC::Select(s, keep_, s, 0.0f, AscendC::SELMODE::VSEL_TENSOR_SCALAR_MODE, count);
                AscendC::PipeBarrier<PIPE_V>();
            }
            lseQue_.FreeTensor(lse);
            deltaQue_.FreeTensor(delta);
            if (withProbs) {  // the query pass's cube needs dS only
                StoreBlock(pQue_, buffers_.Probs(slot, rowOffset * bk), s);
            }
            StoreBlock(dsQue_, buffers_.ScoresGrad(slot, rowOffset * bk), dp);
            sQue_.FreeTensor(loaded);
            dpQue_.FreeTensor(dp);
        }
        AscendC::CrossCoreSetFlag<2, PIPE_MTE3>(kFlagGradProbs);
    }

    // ---- post-pass ------------------------------------------------------------------

    __aicore__ inline uint64_t QueryOffset(const PassChunk& chunk) const
    {
        const uint64_t batch = chunk.pair / t_.headsQ;
        return batch * t_.qStrideBatch + (chunk.pair - batch * t_.headsQ) * t_.qStrideHead +
               uint64_t{chunk.row0} * t_.qStrideRow;
    }

    __aicore__ inline uint64_t KeyOffset(const PassChunk& chunk) const
    {
        const uint64_t batch = chunk.pair / t_.headsKv;
        return batch * t_.kvStrideBatch + (chunk.pair - batch * t_.headsKv) * t_.kvStrideHead +
               uint64_t{chunk.row0} * t_.kvStrideRow;
    }

    // acc_ += `rows` rows of an fp32 gradient in the workspace.
    __aicore__ inline void AddRows(const AscendC::GlobalTensor<float>& src, uint32_t rows)
    {
        const uint32_t count = rows * t_.headDimPad;
        AscendC::LocalTensor<float> part = passLoadQue_.template AllocTensor<float>();
        AscendC::DataCopy(part, src, count);
        passLoadQue_.EnQue(part);
        part = passLoadQue_.template DeQue<float>();
        AscendC::Add(acc_, acc_, part, static_cast<int32_t>(count));
        AscendC::PipeBarrier<PIPE_V>();
        passLoadQue_.FreeTensor(part);
    }

    // dst rows <- scale * acc_ in the input dtype, in the output's row pitch.
    __aicore__ inline void StoreRows(const AscendC::GlobalTensor<T>& dst, uint32_t rows, float scale,
                                     uint64_t pitch)
    {
        const uint32_t count = rows * t_.headDimPad;
        AscendC::Muls(acc_, acc_, scale, static_cast<int32_t>(count));
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::LocalTensor<T> cast = passOutQue_.template AllocTensor<T>();
        AscendC::Cast(cast, acc_, AscendC::RoundMode::CAST_RINT, count);
        AscendC::PipeBarrier<PIPE_V>();  // the next chunk rewrites acc_
        passOutQue_.EnQue(cast);
        cast = passOutQue_.template DeQue<T>();
        AscendC::DataCopyPad(dst, cast,
                             AscendC::DataCopyExtParams(static_cast<uint16_t>(rows), t_.headDim * sizeof(T), 0,
                                                        static_cast<uint32_t>((pitch - t_.headDim) * sizeof(T)), 0));
        passOutQue_.FreeTensor(cast);
    }

    __aicore__ inline void PostPass()
    {
        uint64_t cursor, end;
        PassChunk chunk;
        const uint32_t queryPerPair = GradQueryRowsPerPair(t_);
        PassRange(GradQueryRows(t_), aiv_, Aivs(), cursor, end);
        while (NextPassChunk(t_, queryPerPair, cursor, end, chunk)) {
            const uint64_t row = chunk.pair * queryPerPair + chunk.row0;
            AscendC::Duplicate(acc_, 0.0f, static_cast<int32_t>(chunk.rows * t_.headDimPad));
            AscendC::PipeBarrier<PIPE_V>();
            AddRows(buffers_.QueryGrad(row), chunk.rows);
            StoreRows(dq_[QueryOffset(chunk)], chunk.rows, t_.scale, t_.qStrideRow);
        }
        for (uint32_t value = 0; value < 2; ++value) {  // dK (scaled), then dV
            const uint32_t keyPerPair = GradKeyRowsPerPair(t_);
            PassRange(GradKeyRows(t_), aiv_, Aivs(), cursor, end);
            while (NextPassChunk(t_, keyPerPair, cursor, end, chunk)) {
                const uint64_t row = chunk.pair * keyPerPair + chunk.row0;
                AscendC::Duplicate(acc_, 0.0f, static_cast<int32_t>(chunk.rows * t_.headDimPad));
                AscendC::PipeBarrier<PIPE_V>();
                AddRows(value == 0 ? buffers_.KeyGrad(row) : buffers_.ValueGrad(row), chunk.rows);
                StoreRows((value == 0 ? dk_ : dv_)[KeyOffset(chunk)], chunk.rows,
                          value == 0 ? t_.scale : keepScale_, t_.kvStrideRow);
            }
        }
    }

    // grad_sinks[h] = -sum_{b, i} exp(sink_h - lse_{b,h,i}) D_{b,h,i}, for the query heads
    // h of this vector core (h mod the vector cores). The order of the sum is fixed by the
    // problem alone, so the result is bitwise the same for every split over cores: per
    // (batch, head), the rows in passRows chunks into 64 lane sums, reduced; then the
    // batches added in order. Zeros without sinks (the op always has the output).
    __aicore__ inline void SinkGrad()
    {
        for (uint32_t h = aiv_; h < t_.headsQ; h += Aivs()) {
            AscendC::LocalTensor<float> total = rowOutQue_.template AllocTensor<float>();
            AscendC::Duplicate(total, 0.0f, static_cast<int32_t>(kFloatsPerBlock));
            if (hasSinks_) {
                const float sink = sinks_.GetValue(h);
                // Packed sequences: a head's tokens of every sequence, as one run.
                const uint32_t runs = IsPacked(t_) ? 1 : t_.batch;
                const uint32_t perRun = GradQueryRowsPerPair(t_);
                for (uint32_t b = 0; b < runs; ++b) {
                    SumSinkTerms((uint64_t{b} * t_.headsQ + h) * perRun, perRun, sink);
                    AscendC::PipeBarrier<PIPE_V>();
                    AscendC::Add(total, total, rowPartial_, 1);
                }
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Muls(total, total, -1.0f, 1);
            }
            rowOutQue_.EnQue(total);
            total = rowOutQue_.template DeQue<float>();
            AscendC::DataCopyPad(gradSinks_[h], total, AscendC::DataCopyExtParams(1, sizeof(float), 0, 0, 0));
            rowOutQue_.FreeTensor(total);
        }
    }

    // rowPartial_[0] = sum over the `count` rows from flattened row `first` of
    // exp(sink - lse) D.
    __aicore__ inline void SumSinkTerms(uint64_t first, uint32_t count, float sink)
    {
        AscendC::Duplicate(operand_, 0.0f, static_cast<int32_t>(kFloatsPerRepeat));
        for (uint32_t row0 = 0; row0 < count; row0 += t_.passRows) {
            const uint32_t rows = MinU32(t_.passRows, count - row0);
            const AscendC::DataCopyExtParams copy(1, rows * sizeof(float), 0, 0, 0);
            const AscendC::DataCopyPadExtParams<float> noPad(false, 0, 0, 0.0f);
            AscendC::LocalTensor<float> lse = passLoadQue_.template AllocTensor<float>();
            AscendC::DataCopyPad(lse, lse_[first + row0], copy, noPad);
            passLoadQue_.EnQue(lse);
            AscendC::LocalTensor<float> delta = passInQue_.template AllocTensor<float>();
            AscendC::DataCopyPad(delta, buffers_.Delta(first + row0), copy, noPad);
            passInQue_.EnQue(delta);
            lse = passLoadQue_.template DeQue<float>();
            delta = passInQue_.template DeQue<float>();
            const uint32_t lanes = AlignUp(rows, kFloatsPerRepeat);
            AscendC::Duplicate(acc_, 0.0f, static_cast<int32_t>(lanes));  // lanes past `rows` stay 0
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Muls(acc_, lse, -1.0f, static_cast<int32_t>(rows));
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Adds(acc_, acc_, sink, static_cast<int32_t>(rows));
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Exp(acc_, acc_, static_cast<int32_t>(rows));
            AscendC::PipeBarrier<PIPE_V>();
            AscendC::Mul(acc_, acc_, delta, static_cast<int32_t>(rows));
            passLoadQue_.FreeTensor(lse);
            passInQue_.FreeTensor(delta);
            for (uint32_t lane = 0; lane < lanes; lane += kFloatsPerRepeat) {
                AscendC::PipeBarrier<PIPE_V>();
                AscendC::Add(operand_, operand_, acc_[lane], static_cast<int32_t>(kFloatsPerRepeat));
            }
            AscendC::PipeBarrier<PIPE_V>();
        }
        AscendC::WholeReduceSum(rowPartial_, operand_, static_cast<int32_t>(kFloatsPerRepeat), 1, 1, 1,
                                static_cast<int32_t>(kFloatsPerRepeat / kFloatsPerBlock));
    }

    GradTilingData t_;
    DeviceSeqlens seqlens_;  // layout TND only
    AscendC::TPipe* pipe_ = nullptr;
    uint32_t aiv_ = 0;
    uint32_t core_ = 0;
    uint32_t sub_ = 0;
    uint32_t rows_ = 0;  // this vector core's rows of the current step
    uint32_t steps_ = 0;  // steps so far, both passes: the exchange slot is steps_ mod 2
    bool hasGradLse_ = false;
    bool hasSinks_ = false;
    bool windowed_ = false;
    bool alibi_ = false;
    float softcap_ = 0.0f;
    bool dropout_ = false;
    float keepScale_ = 1.0f;  // 1 / (1 - p) with dropout
    GradBuffers<T, S> buffers_;
    ScoreMasking<GradTilingData, CAUSAL, MASK> masking_;
    AlibiBias alibiBias_;
    BandMasking band_;
    PhiloxDropout philox_;
    AscendC::GlobalTensor<T> out_, do_, dq_, dk_, dv_;
    AscendC::GlobalTensor<float> lse_, gradLse_, sinks_, gradSinks_;
    AscendC::TQue<AscendC::TPosition::VECIN, 1> sQue_, dpQue_, lseQue_, deltaQue_, passLoadQue_;
    AscendC::TQue<AscendC::TPosition::VECIN, 2> passInQue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, 1> pQue_, dsQue_, passOutQue_, rowOutQue_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> brcBuf_, passBuf_, rowBuf_, featureBuf_, tanhBuf_, philoxBuf_,
        keepBuf_, scoreBuf_;
    AscendC::LocalTensor<uint8_t> keep_;
    AscendC::LocalTensor<float> broadcast_, acc_, operand_, rowPartial_, feature_, tanh_;
    AscendC::LocalTensor<float> scores_;  // fp16 scores: the block widened to fp32
};

}  // namespace flash_cann

#endif
