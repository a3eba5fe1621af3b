// The FlashAttention forward kernel of flash-cann for Ascend 910B / 910_93 (MIX: each AI
// core runs one cube core and two vector cores). The same source compiles with CANN's
// Ascend C toolchain and, for tests, with g++ against the CPU twin (tests/twin).
//
// The tiling key (flash_cann_tiling.h, TilingKey) picks the element type and whether the
// causal and key-padding masks are compiled in; everything else (blocks, strides, the
// split over cores, double buffering) comes from the planner's tiling data.
#include "kernel_operator.h"
#include "flash_cann_tiling.h"
#include "flash_attention_cube.h"
#include "flash_attention_vector.h"

namespace {

template <typename T, bool CAUSAL, bool MASK>
__aicore__ inline void RunForward(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR keyPaddingMask,
                                  GM_ADDR out, GM_ADDR softmaxLse, GM_ADDR userWorkspace,
                                  const flash_cann::TilingData& tiling)
{
    AscendC::TPipe pipe;
    if ASCEND_IS_AIC {
        flash_cann::FlashAttentionCube<T, CAUSAL, MASK> cube;
        cube.Init(query, key, value, userWorkspace, tiling, &pipe);
        cube.Process();
    }
    if ASCEND_IS_AIV {
        flash_cann::FlashAttentionVector<T, CAUSAL, MASK> vector;
        vector.Init(keyPaddingMask, out, softmaxLse, userWorkspace, tiling, &pipe);
        vector.Process();
    }
}

}  // namespace

extern "C" __global__ __aicore__ void flash_cann_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                           GM_ADDR keyPaddingMask, GM_ADDR out,
                                                           GM_ADDR softmaxLse, GM_ADDR workspace,
                                                           GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(flash_cann::TilingData);
    GET_TILING_DATA_WITH_STRUCT(flash_cann::TilingData, tilingData, tiling);
    GM_ADDR user = AscendC::GetUserWorkspace(workspace);
    // Keys: flash_cann::TilingKey(isBf16, causal, hasMask) = 1000 + 100 b + 10 c + m.
    if (TILING_KEY_IS(1000)) {
        RunForward<half, false, false>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    } else if (TILING_KEY_IS(1001)) {
        RunForward<half, false, true>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    } else if (TILING_KEY_IS(1010)) {
        RunForward<half, true, false>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    } else if (TILING_KEY_IS(1011)) {
        RunForward<half, true, true>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    } else if (TILING_KEY_IS(1100)) {
        RunForward<bfloat16_t, false, false>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    } else if (TILING_KEY_IS(1101)) {
        RunForward<bfloat16_t, false, true>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    } else if (TILING_KEY_IS(1110)) {
        RunForward<bfloat16_t, true, false>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    } else if (TILING_KEY_IS(1111)) {
        RunForward<bfloat16_t, true, true>(query, key, value, keyPaddingMask, out, softmaxLse, user, tilingData);
    }
}
