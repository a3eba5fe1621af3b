// What the cube (AIC) and vector (AIV) halves of the backward kernel share: the GM
// workspace views (flash_cann_grad_tiling.h, GradWorkspace) and the cross-core flags
// that order the exchange of one step (a query block x key block):
//   AIC -> AIV  kFlagGradScores  S and dP of the step are in the exchange slot
//   AIV -> AIC  kFlagGradProbs   P and dS of the step are in the exchange slot
// and, with fp16 scores, once before the first step:
//   AIV -> AIC  kFlagGradOffsets the query rows' offset panels are in the workspace
#ifndef FLASH_CANN_FLASH_ATTENTION_GRAD_COMMON_H
#define FLASH_CANN_FLASH_ATTENTION_GRAD_COMMON_H

#include "kernel_operator.h"
#include "flash_cann_grad_tiling.h"
#include "flash_cann_packed.h"
#include "flash_attention_scores.h"
#include "flash_attention_seqlens.h"

namespace flash_cann {

constexpr uint16_t kFlagGradScores = 4;
constexpr uint16_t kFlagGradProbs = 5;
// fp16 scores only, once per launch: AIV -> AIC, every row's offset panel is in the
// workspace (the pre-pass wrote them, and every vector core has passed its barrier).
constexpr uint16_t kFlagGradOffsets = 6;

// The GM tensors the vector half reads and writes; gradSoftmaxLse may be null (no
// gradient reaches lse), keyPaddingMask is null without a mask, and the feature inputs
// (alibiSlopes, rngState, sinks) are null when the call does not use them. gradSinks
// (fp32, heads_q) is always written: zeros without sinks.
struct GradTensors {
    GM_ADDR out;
    GM_ADDR gradOut;
    GM_ADDR softmaxLse;
    GM_ADDR gradSoftmaxLse;
    GM_ADDR keyPaddingMask;
    GM_ADDR cuSeqlensQ;
    GM_ADDR cuSeqlensK;
    GM_ADDR alibiSlopes;
    GM_ADDR rngState;
    GM_ADDR sinks;
    GM_ADDR gradQuery;
    GM_ADDR gradKey;
    GM_ADDR gradValue;
    GM_ADDR gradSinks;
};

// Both halves' view of the workspace: the global fp32 accumulators and this AI core's
// exchange slots. S: the element type of the S slots (ScoreType; fp16 S fills half of a
// slot sized for fp32, so the workspace layout is the same for both).
template <typename T, typename S = float>
class GradBuffers {
public:
    __aicore__ inline void Init(GM_ADDR userWorkspace, uint32_t core, const GradTilingData& t)
    {
        const GradWorkspace ws(t, sizeof(T));
        delta_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(userWorkspace + ws.delta));
        dq_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(userWorkspace + ws.dq));
        dk_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(userWorkspace + ws.dk));
        dv_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(userWorkspace + ws.dv));
        GM_ADDR mine = userWorkspace + ws.exchange + core * ws.exchangePerCore;
        const uint64_t scoreBytes = kGradExchangeSlots * ws.scoresSlot;
        const uint64_t probBytes = kGradExchangeSlots * ws.probsSlot;
        scores_.SetGlobalBuffer(reinterpret_cast<__gm__ S*>(mine));
        gradProbs_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(mine + scoreBytes));
        probs_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(mine + 2 * scoreBytes));
        gradScores_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(mine + 2 * scoreBytes + probBytes));
        offsets_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(userWorkspace + ws.offsets));
        scoreSlot_ = ws.scoresSlot / sizeof(S);
        gradProbSlot_ = ws.scoresSlot / sizeof(float);
        probSlot_ = ws.probsSlot / sizeof(T);
        pad_ = t.headDimPad;
    }
    // D of query row `row` of the flattened (batch, head_q, seqlen_q) space.
    __aicore__ inline AscendC::GlobalTensor<float> Delta(uint64_t row) const { return delta_[row]; }
    // fp16 scores: the offset panel's rows (kScoreOffsetColumns elements each), from
    // flattened query row `row`.
    __aicore__ inline AscendC::GlobalTensor<T> Offsets(uint64_t row) const
    {
        return offsets_[row * kScoreOffsetColumns];
    }
    // The fp32 dQ accumulator, from flattened query row `row`.
    __aicore__ inline AscendC::GlobalTensor<float> QueryGrad(uint64_t row) const { return dq_[row * pad_]; }
    __aicore__ inline AscendC::GlobalTensor<float> QueryGradRegion() const { return dq_; }
    // fp32 dK / dV, from flattened key row `row` of the (batch, head_kv, seqlen_k) space.
    __aicore__ inline AscendC::GlobalTensor<float> KeyGrad(uint64_t row) const { return dk_[row * pad_]; }
    __aicore__ inline AscendC::GlobalTensor<float> ValueGrad(uint64_t row) const { return dv_[row * pad_]; }
    // Exchange slot `slot` (0 .. kGradExchangeSlots - 1), from element `offset`.
    __aicore__ inline AscendC::GlobalTensor<S> Scores(uint32_t slot, uint64_t offset) const
    {
        return scores_[slot * scoreSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<float> ProbsGrad(uint32_t slot, uint64_t offset) const
    {
        return gradProbs_[slot * gradProbSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<T> Probs(uint32_t slot, uint64_t offset) const
    {
        return probs_[slot * probSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<T> ScoresGrad(uint32_t slot, uint64_t offset) const
    {
        return gradScores_[slot * probSlot_ + offset];
    }

private:
    AscendC::GlobalTensor<float> delta_, dq_, dk_, dv_, gradProbs_;
    AscendC::GlobalTensor<S> scores_;
    AscendC::GlobalTensor<T> probs_, gradScores_, offsets_;
    uint64_t scoreSlot_ = 0, gradProbSlot_ = 0, probSlot_ = 0;
    uint32_t pad_ = 0;
};

// The steps of one AI core in one pass, in order: the key pass (key-block units) or the
// deterministic dQ's query pass (query units); the planner's split (dense layouts) or
// the device-side walk over cu_seqlens (TND, flash_cann_packed.h). Both halves start it
// with the same arguments, so they walk the same steps.
template <bool CAUSAL, bool QUERY_PASS>
class GradCoreSteps {
public:
    __aicore__ inline GradCoreSteps(const GradTilingData& t, const DeviceSeqlens& cu, uint32_t core)
        : packed_(IsPacked(t))
    {
        if (packed_) {
            packedWalk_ = Packed(t, PackedOwnedItems<CAUSAL, QUERY_PASS, DeviceSeqlens>(t, cu, core, t.usedCores));
        } else {
            denseWalk_ = Dense(t, DenseItems<CAUSAL, QUERY_PASS>(t, core));
        }
    }
    __aicore__ inline bool Next()
    {
        if (packed_) {
            return Take(packedWalk_);
        }
        return Take(denseWalk_);
    }

    GradUnit unit{};
    GradStep step{};

private:
    using Dense = DenseStepWalk<CAUSAL, QUERY_PASS>;
    using Packed = PackedStepWalk<CAUSAL, QUERY_PASS, DeviceSeqlens>;

    template <typename Walk>
    __aicore__ inline bool Take(Walk& walk)
    {
        if (!walk.Next()) {
            return false;
        }
        unit = walk.unit;
        step = walk.step;
        return true;
    }

    bool packed_;
    Dense denseWalk_{};
    Packed packedWalk_{};
};

}  // namespace flash_cann

#endif
