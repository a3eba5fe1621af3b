// C ABI of the planner, for Python (ctypes): plans are returned as JSON text.
#ifndef FLASH_CANN_PLANNER_C_API_H
#define FLASH_CANN_PLANNER_C_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The features beyond plain attention (flash_cann_variant.h): window bounds (-1 unbounded),
// softcap (0 off), dropout_p (0 off), alibi (0 none, 1 per head, 2 per batch and head),
// sinks (0/1); with layout 2 (TND, packed sequences) tokens_q/tokens_k, the packed
// tensors' first dimension (0 otherwise): batch is then the number of sequences and
// seqlen_q/k are max_seqlen_q/k. fp16_scores (0/1): the backward's fp16-score fast path
// (float16 only; the forward plans as without it; the decode planner refuses it). cube_passes: below.
struct flash_cann_variant {
    int64_t window_left;
    int64_t window_right;
    double softcap;
    double dropout_p;
    int32_t alibi;
    int32_t sinks;
    int64_t tokens_q;
    int64_t tokens_k;
    int32_t fp16_scores;
    int32_t cube_passes;  // forward: 0 the planner chooses, 1 forces the 256-row tile in
                          // row passes (tests), -1 never
};

// Plan a forward call on SoC `soc` (see flash_cann_platforms_json). dtype: 0 float16,
// 1 bfloat16, 2 float32; layout: 0 BNSD, 1 BSND, 2 TND (needs `variant`'s tokens); `variant` may be null (plain attention);
// aic_cores > 0 overrides the SoC's AI core count. Writes JSON ({"error": ...} on refusal) to `out`; returns its length, or
// minus the size needed when `capacity` is too small.
int64_t flash_cann_plan_json(const char* soc, int64_t batch, int64_t heads_q, int64_t heads_kv,
                             int64_t seqlen_q, int64_t seqlen_k, int64_t head_dim,
                             int32_t dtype, int32_t layout, int32_t causal, int32_t has_mask,
                             double scale, const struct flash_cann_variant* variant,
                             int32_t aic_cores, char* out, uint64_t capacity);

// Plan a backward call: the same arguments as flash_cann_plan_json, and `deterministic`
// (1: dQ reduced in a fixed order, 0: fp32 atomic adds). Same return convention.
int64_t flash_cann_grad_plan_json(const char* soc, int64_t batch, int64_t heads_q,
                                  int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k,
                                  int64_t head_dim, int32_t dtype, int32_t layout, int32_t causal,
                                  int32_t has_mask, int32_t deterministic, double scale,
                                  const struct flash_cann_variant* variant,
                                  int32_t aic_cores, char* out, uint64_t capacity);

// A fwd_kvcache call's shapes (the decode kernel: op_kernel/flash_cann_decode_tiling.h).
// seqlen_q: query rows per sequence (TND: max_seqlen_q); tokens_q: TND's total rows;
// cache_batch: cache sequences (paged: blocks); cache_seqlen: keys per cache sequence
// (paged: page_size); max_blocks: block_table's row length (0: contiguous cache);
// splits > 0 forces the split count (tests), 0 lets the planner choose.
struct flash_cann_decode_problem {
    int64_t batch;
    int64_t heads_q;
    int64_t heads_kv;
    int64_t seqlen_q;
    int64_t tokens_q;
    int64_t head_dim;
    int64_t cache_batch;
    int64_t cache_seqlen;
    int64_t max_blocks;
    int32_t dtype;
    int32_t tnd;
    int32_t causal;
    int32_t has_batch_idx;
    int32_t has_leftpad;
    int32_t splits;
    double scale;
};

// Plan a fwd_kvcache call (the decode kernel), with the schedule model's prediction for
// sequences of `keys` keys each (<= 0: the capacity). Same return convention.
int64_t flash_cann_decode_plan_json(const char* soc, const struct flash_cann_decode_problem* problem,
                                    const struct flash_cann_variant* variant, int64_t keys,
                                    int32_t aic_cores, char* out, uint64_t capacity);

// The schedule model's fit to PTO's published tables (op_host/planner/model_fit.h) on
// 910B2: refit != 0 reruns the fit from the sourced figures (a few seconds); otherwise the
// points at `figures` (fixpipe, MTE2 and L2 scales, transfer, issue and launch cycles), or
// at the committed fit when `figures` is null. Same return convention.
int64_t flash_cann_model_fit_json(int32_t refit, const double* figures, char* out,
                                  uint64_t capacity);

// The built-in platform table as JSON; same return convention.
int64_t flash_cann_platforms_json(char* out, uint64_t capacity);

#ifdef __cplusplus
}
#endif

#endif
