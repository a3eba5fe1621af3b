// What a call computes beyond plain attention -- sliding window, softcap, ALiBi, dropout,
// attention sinks -- as both kernels receive it in their tiling data. The semantics are
// python/flash_cann/contract/variant.py's (the one statement every backend follows); this
// is their encoding for the Ascend kernels. The host (op_host, through the planner) fills
// it from the op's attributes and optional inputs; the forward's TilingData and the
// backward's GradTilingData carry it unchanged.
//
// Tensors stay in GM and are read by the kernel, never by the host (so a call can be
// captured into a graph): ALiBi slopes (fp32), the dropout rng_state (int64 seed, offset)
// and the sink logits (fp32, one per query head).
#ifndef FLASH_CANN_VARIANT_H
#define FLASH_CANN_VARIANT_H

#include <cstdint>

#ifndef __aicore__
#define __aicore__
#endif

namespace flash_cann {

// How the ALiBi slopes tensor is indexed.
enum class Alibi : uint32_t {
    kNone = 0,
    kPerHead = 1,          // (heads_q,)
    kPerBatchHead = 2,     // (batch, heads_q)
};

struct VariantTiling {
    // Bottom-right aligned band, as variant.window_bounds normalised it: query i sees key
    // j only if i + causalOffset - windowLeft <= j <= i + causalOffset + windowRight.
    // -1 = unbounded on that side; causal keeps windowRight = -1 (the causal flag is the
    // right bound 0).
    int64_t windowLeft;
    int64_t windowRight;
    float softcap;             // 0: off; else s = softcap * tanh(s / softcap)
    float dropoutP;            // 0: off
    uint32_t dropoutThreshold; // keep iff the Philox draw >= this (variant.dropout_threshold)
    uint32_t alibi;            // Alibi
    uint32_t sinks;            // 1: one fp32 sink logit per query head joins each row's softmax
    uint32_t reserved;
};

// Plain attention: no feature.
constexpr VariantTiling kPlainVariant{-1, -1, 0.0f, 0.0f, 0u, 0u, 0u, 0u};

__aicore__ inline bool IsWindowed(const VariantTiling& v)
{
    return v.windowLeft >= 0 || v.windowRight >= 0;
}

__aicore__ inline bool IsPlain(const VariantTiling& v)
{
    return !IsWindowed(v) && v.softcap == 0.0f && v.dropoutP == 0.0f && v.alibi == 0u &&
           v.sinks == 0u;
}

}  // namespace flash_cann

#endif  // FLASH_CANN_VARIANT_H
