// Every member of every backward instantiation compiles: explicit instantiation compiles
// each non-template member, including those a tiling key's path never calls (a member
// reachable only for half, with a bf16 body that does not type-check, fails here).
#include "kernel_operator.h"
#include "flash_attention_grad_cube.h"
#include "flash_attention_grad_vector.h"

#define FLASH_CANN_GRAD_CLASSES(T, S)                                                        \
    template class flash_cann::FlashAttentionGradCube<T, false, false, false, S>;            \
    template class flash_cann::FlashAttentionGradCube<T, false, true, false, S>;             \
    template class flash_cann::FlashAttentionGradCube<T, true, false, false, S>;             \
    template class flash_cann::FlashAttentionGradCube<T, true, true, false, S>;              \
    template class flash_cann::FlashAttentionGradCube<T, false, false, true, S>;             \
    template class flash_cann::FlashAttentionGradCube<T, false, true, true, S>;              \
    template class flash_cann::FlashAttentionGradCube<T, true, false, true, S>;              \
    template class flash_cann::FlashAttentionGradCube<T, true, true, true, S>;               \
    template class flash_cann::FlashAttentionGradVector<T, false, false, false, S>;          \
    template class flash_cann::FlashAttentionGradVector<T, false, true, false, S>;           \
    template class flash_cann::FlashAttentionGradVector<T, true, false, false, S>;           \
    template class flash_cann::FlashAttentionGradVector<T, true, true, false, S>;            \
    template class flash_cann::FlashAttentionGradVector<T, false, false, true, S>;           \
    template class flash_cann::FlashAttentionGradVector<T, false, true, true, S>;            \
    template class flash_cann::FlashAttentionGradVector<T, true, false, true, S>;            \
    template class flash_cann::FlashAttentionGradVector<T, true, true, true, S>;

// The kernel's tiling keys: half and bf16 with fp32 S, half with fp16 S (fp16_scores).
FLASH_CANN_GRAD_CLASSES(half, float)
FLASH_CANN_GRAD_CLASSES(bfloat16_t, float)
FLASH_CANN_GRAD_CLASSES(half, half)
