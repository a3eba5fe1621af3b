// The FlashAttention backward kernel of flash-cann for Ascend 910B / 910_93 (MIX: each AI
// core runs one cube core and two vector cores). The same source compiles with CANN's
// Ascend C toolchain and, for tests, with g++ against the CPU twin (twin/).
//
// The grad tiling key (flash_cann_grad_tiling.h, GradTilingKey) picks the element type,
// whether the causal and key-padding masks are compiled in, the dQ variant (fast
// atomic accumulation or deterministic per-chunk slots) and the S element type (fp16 on
// the fp16_scores path, flash_attention_scores.h); everything else comes from the
// planner's GradTilingData, the features too (GradTilingData::variant: window, softcap,
// ALiBi, dropout, sinks are run-time flags, docs/kernel.md says why).
#include "kernel_operator.h"
#include "flash_cann_grad_tiling.h"
#include "flash_attention_grad_cube.h"
#include "flash_attention_grad_vector.h"

namespace {

template <typename T, bool CAUSAL, bool MASK, bool DETERMINISTIC, typename S = float>
__aicore__ inline void RunBackward(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR gradOut,
                                   const flash_cann::GradTensors& gm,
                                   GM_ADDR userWorkspace, const flash_cann::GradTilingData& tiling)
{
    AscendC::TPipe pipe;
    if ASCEND_IS_AIC {
        flash_cann::FlashAttentionGradCube<T, CAUSAL, MASK, DETERMINISTIC, S> cube;
        cube.Init(query, key, value, gradOut, gm.cuSeqlensQ, gm.cuSeqlensK, userWorkspace, tiling, &pipe);
        cube.Process();
    }
    if ASCEND_IS_AIV {
        flash_cann::FlashAttentionGradVector<T, CAUSAL, MASK, DETERMINISTIC, S> vector;
        vector.Init(gm, userWorkspace, tiling, &pipe);
        vector.Process();
    }
}

}  // namespace

extern "C" __global__ __aicore__ void flash_cann_attention_grad(
    GM_ADDR gradOut, GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR out, GM_ADDR softmaxLse,
    GM_ADDR keyPaddingMask, GM_ADDR gradSoftmaxLse, GM_ADDR cuSeqlensQ, GM_ADDR cuSeqlensK,
    GM_ADDR alibiSlopes, GM_ADDR rngState,
    GM_ADDR sinks, GM_ADDR gradQuery, GM_ADDR gradKey, GM_ADDR gradValue, GM_ADDR gradSinks,
    GM_ADDR workspace, GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(flash_cann::GradTilingData);
    GET_TILING_DATA_WITH_STRUCT(flash_cann::GradTilingData, tilingData, tiling);
    GM_ADDR user = AscendC::GetUserWorkspace(workspace);
    const flash_cann::GradTensors gm{out,       gradOut,     softmaxLse, gradSoftmaxLse, keyPaddingMask,
                                     cuSeqlensQ, cuSeqlensK, alibiSlopes, rngState,       sinks,
                                     gradQuery, gradKey,     gradValue,  gradSinks};
    // Keys: flash_cann::GradTilingKey(isBf16, causal, hasMask, deterministic, fp16Scores)
    //     = 20000 + 1000 x + 100 (b + 2 s) + 10 c + m.
    if (TILING_KEY_IS(20000)) {
        RunBackward<half, false, false, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20001)) {
        RunBackward<half, false, true, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20010)) {
        RunBackward<half, true, false, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20011)) {
        RunBackward<half, true, true, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20100)) {
        RunBackward<bfloat16_t, false, false, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20101)) {
        RunBackward<bfloat16_t, false, true, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20110)) {
        RunBackward<bfloat16_t, true, false, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20111)) {
        RunBackward<bfloat16_t, true, true, false>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21000)) {
        RunBackward<half, false, false, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21001)) {
        RunBackward<half, false, true, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21010)) {
        RunBackward<half, true, false, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21011)) {
        RunBackward<half, true, true, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21100)) {
        RunBackward<bfloat16_t, false, false, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21101)) {
        RunBackward<bfloat16_t, false, true, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21110)) {
        RunBackward<bfloat16_t, true, false, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21111)) {
        RunBackward<bfloat16_t, true, true, true>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20200)) {
        RunBackward<half, false, false, false, half>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20201)) {
        RunBackward<half, false, true, false, half>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20210)) {
        RunBackward<half, true, false, false, half>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(20211)) {
        RunBackward<half, true, true, false, half>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21200)) {
        RunBackward<half, false, false, true, half>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21201)) {
        RunBackward<half, false, true, true, half>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21210)) {
        RunBackward<half, true, false, true, half>(query, key, value, gradOut, gm, user, tilingData);
    } else if (TILING_KEY_IS(21211)) {
        RunBackward<half, true, true, true, half>(query, key, value, gradOut, gm, user, tilingData);
    }
}
