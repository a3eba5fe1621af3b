// The decode kernel of flash-cann (torch.ops.flash_cann.fwd_kvcache, flash-attn's
// flash_attn_with_kvcache and vLLM's paged varlen call) for Ascend 910B / 910_93: MIX,
// each AI core one cube core and two vector cores; the same source compiles with CANN's
// Ascend C toolchain and, for tests, with g++ against the CPU twin (twin/).
//
// What a launch computes is decided by the decode planner's tiling data
// (flash_cann_decode_tiling.h): the work units (sequence, kv head, row tile, key split)
// of each core, blocks, the split count. The per-sequence values -- seqlens_k (the
// keys after the append), cache_batch_idx, block_table, cache_leftpad, cu_seqlens_q --
// are read in GM by the kernel. The new keys and values are appended to the caches
// before the launch (contract/kvcache.append, one device op per cache; docs/kernel-decode.md,
// "The decode kernel", says why).
//
// GM arguments, the op's inputs then outputs in spec order: query, k_cache, v_cache, key,
// value (unused), cache_seqlens (int32 (batch,): the keys of each sequence, after the
// append), cache_batch_idx, block_table, cache_leftpad, cu_seqlens_q (int32, null when
// absent), alibi_slopes (fp32 (heads_q,) or (batch, heads_q)), sinks (fp32 (heads_q,)),
// out, softmax_lse, workspace, tiling.
#include "kernel_operator.h"
#include "flash_cann_decode_tiling.h"
#include "flash_attention_decode_cube.h"
#include "flash_attention_decode_vector.h"

namespace {

template <typename T>
__aicore__ inline void RunDecode(const flash_cann::DecodeArgs& a, const flash_cann::DecodeTiling& tiling)
{
    AscendC::TPipe pipe;
    if ASCEND_IS_AIC {
        flash_cann::FlashAttentionDecodeCube<T> cube;
        cube.Init(a, tiling, &pipe);
        cube.Process();
    }
    if ASCEND_IS_AIV {
        flash_cann::FlashAttentionDecodeVector<T> vector;
        vector.Init(a, tiling, &pipe);
        vector.Process();
    }
}

}  // namespace

// key and value are the op's (spec order) but never read: the TilingFunc refuses them (the
// append happens before the launch); cache_seqlens holds the keys of each sequence.
extern "C" __global__ __aicore__ void flash_cann_attention_kvcache(
    GM_ADDR query, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR key, GM_ADDR value, GM_ADDR cacheSeqlens,
    GM_ADDR cacheBatchIdx, GM_ADDR blockTable, GM_ADDR cacheLeftpad, GM_ADDR cuSeqlensQ, GM_ADDR alibiSlopes,
    GM_ADDR sinks, GM_ADDR out, GM_ADDR softmaxLse, GM_ADDR workspace, GM_ADDR tiling)
{
    (void)key;
    (void)value;
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    REGISTER_TILING_DEFAULT(flash_cann::DecodeTiling);
    GET_TILING_DATA_WITH_STRUCT(flash_cann::DecodeTiling, tilingData, tiling);
    const flash_cann::DecodeArgs a{query, kCache, vCache, cacheSeqlens, cacheBatchIdx, blockTable, cacheLeftpad,
                                   cuSeqlensQ, alibiSlopes, sinks, out, softmaxLse,
                                   AscendC::GetUserWorkspace(workspace)};
    // Keys: flash_cann::DecodeTilingKey(isBf16) = 3000 + 100 bf16.
    if (TILING_KEY_IS(3000)) {
        RunDecode<half>(a, tilingData);
    } else if (TILING_KEY_IS(3100)) {
        RunDecode<bfloat16_t>(a, tilingData);
    }
}
