// The FlashAttention forward kernel of flash-cann for Ascend 910B / 910_93 (MIX: each AI
// core runs one cube core and two vector cores). The same source compiles with CANN's
// Ascend C toolchain and, for tests, with g++ against the CPU twin (tests/twin).
//
// The tiling key (flash_cann_tiling.h, TilingKey) picks the element type, whether the
// causal and key-padding masks are compiled in, and whether the features of
// VariantTiling are (FEATURES); which features a launch uses, and everything else
// (blocks, strides, the split over cores, double buffering), comes from the planner's
// tiling data.
//
// GM arguments, in the op's input then output order: cu_seqlens_q/k (int32 (batch + 1,),
// layout TND only: the packed sequences' offsets, read on the device, flash_cann_packed.h),
// alibi_slopes (fp32, (heads_q,) or
// (batch, heads_q)), rng_state (int64 (seed, offset)) and sinks (fp32, (heads_q,)) are
// read only when the tiling data says so; null otherwise.
#include "kernel_operator.h"
#include "flash_cann_tiling.h"
#include "flash_attention_cube.h"
#include "flash_attention_vector.h"

namespace {

struct ForwardArgs {  // GM_ADDR is a pointer macro: one declarator per member
    GM_ADDR query;
    GM_ADDR key;
    GM_ADDR value;
    GM_ADDR keyPaddingMask;
    GM_ADDR cuSeqlensQ;
    GM_ADDR cuSeqlensK;
    GM_ADDR alibiSlopes;
    GM_ADDR rngState;
    GM_ADDR sinks;
    GM_ADDR out;
    GM_ADDR softmaxLse;
    GM_ADDR userWorkspace;
};

template <typename T, bool CAUSAL, bool MASK, bool FEATURES>
__aicore__ inline void RunForward(const ForwardArgs& a, const flash_cann::TilingData& tiling)
{
    AscendC::TPipe pipe;
    if ASCEND_IS_AIC {
        flash_cann::FlashAttentionCube<T, CAUSAL, MASK> cube;
        cube.Init(a.query, a.key, a.value, a.cuSeqlensQ, a.cuSeqlensK, a.userWorkspace, tiling, &pipe);
        cube.Process();
    }
    if ASCEND_IS_AIV {
        flash_cann::FlashAttentionVector<T, CAUSAL, MASK, FEATURES> vector;
        vector.Init(a.keyPaddingMask, a.cuSeqlensQ, a.cuSeqlensK, a.alibiSlopes, a.rngState, a.sinks,
                    a.out, a.softmaxLse, a.userWorkspace, tiling, &pipe);
        vector.Process();
    }
}

}  // namespace

extern "C" __global__ __aicore__ void flash_cann_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                           GM_ADDR keyPaddingMask, GM_ADDR cuSeqlensQ,
                                                           GM_ADDR cuSeqlensK, GM_ADDR alibiSlopes,
                                                           GM_ADDR rngState, GM_ADDR sinks, GM_ADDR out,
                                                           GM_ADDR softmaxLse, GM_ADDR workspace,
                                                           GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(flash_cann::TilingData);
    GET_TILING_DATA_WITH_STRUCT(flash_cann::TilingData, tilingData, tiling);
    const ForwardArgs a{query,      key,        value,       keyPaddingMask, cuSeqlensQ,
                        cuSeqlensK, alibiSlopes, rngState,   sinks,          out,
                        softmaxLse, AscendC::GetUserWorkspace(workspace)};
    // Keys: flash_cann::TilingKey(isBf16, causal, hasMask, features) = FDCM,
    // F = 1 + features, D = isBf16.
    if (TILING_KEY_IS(1000)) {
        RunForward<half, false, false, false>(a, tilingData);
    } else if (TILING_KEY_IS(1001)) {
        RunForward<half, false, true, false>(a, tilingData);
    } else if (TILING_KEY_IS(1010)) {
        RunForward<half, true, false, false>(a, tilingData);
    } else if (TILING_KEY_IS(1011)) {
        RunForward<half, true, true, false>(a, tilingData);
    } else if (TILING_KEY_IS(1100)) {
        RunForward<bfloat16_t, false, false, false>(a, tilingData);
    } else if (TILING_KEY_IS(1101)) {
        RunForward<bfloat16_t, false, true, false>(a, tilingData);
    } else if (TILING_KEY_IS(1110)) {
        RunForward<bfloat16_t, true, false, false>(a, tilingData);
    } else if (TILING_KEY_IS(1111)) {
        RunForward<bfloat16_t, true, true, false>(a, tilingData);
    } else if (TILING_KEY_IS(2000)) {
        RunForward<half, false, false, true>(a, tilingData);
    } else if (TILING_KEY_IS(2001)) {
        RunForward<half, false, true, true>(a, tilingData);
    } else if (TILING_KEY_IS(2010)) {
        RunForward<half, true, false, true>(a, tilingData);
    } else if (TILING_KEY_IS(2011)) {
        RunForward<half, true, true, true>(a, tilingData);
    } else if (TILING_KEY_IS(2100)) {
        RunForward<bfloat16_t, false, false, true>(a, tilingData);
    } else if (TILING_KEY_IS(2101)) {
        RunForward<bfloat16_t, false, true, true>(a, tilingData);
    } else if (TILING_KEY_IS(2110)) {
        RunForward<bfloat16_t, true, false, true>(a, tilingData);
    } else if (TILING_KEY_IS(2111)) {
        RunForward<bfloat16_t, true, true, true>(a, tilingData);
    }
}
