/* TEST-ONLY fake of the flash-cann op package's libcust_opapi.so, plus the CANN functions
 * the extension resolves through it (aclCreateTensor, aclDestroyTensor,
 * aclGetRecentErrMsg, aclrtUseStreamResInCurrentThread). Computes nothing: records each call as one JSON line in
 * $FAKE_ACLNN_LOG, and returns the status given by $FAKE_ACLNN_FAIL="<symbol>=<status>".
 *
 * The aclnn prototypes below are written by hand from CANN's generation rules (inputs,
 * attributes, outputs; double / bool / char * attributes; Optional and Out names), not
 * generated: if the extension passed its arguments in another order or type, the
 * recorded values would not be the ones the test sent.
 *
 * Under a graph capture of the fake NPU (fake_npu_capture.h) stage 2 is recorded instead
 * of run: its log line says "captured", and each replay logs the launch again ("replay")
 * with the values its small integer inputs (cu_seqlens, cache_seqlens, block_table,
 * rng_state, ...) hold at that moment, as the kernel would read them from GM. With
 * $FAKE_ACLNN_INT_VALUES set, eager stage-2 lines carry those values too. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct aclTensor {
  int64_t dims[8], strides[8], storage[8];
  uint64_t ndim, nstorage;
  int64_t offset;
  int dtype, format;
  void *data;
} aclTensor;
enum { kMaxTensors = 32, kMaxValues = 64, kAclInt32 = 3, kAclInt64 = 9 };
typedef struct NamedTensor {
  char name[40];
  aclTensor tensor; /* a copy: the extension destroys its aclTensors after stage 2 */
} NamedTensor;
typedef struct aclOpExecutor {
  int stage1_done;
  int ntensors;
  NamedTensor tensors[kMaxTensors];
} aclOpExecutor;
typedef void *aclrtStream;

/* The fake NPU's capture hooks (fake_torch_npu.cpp), found in the process if loaded. */
extern int fake_npu_capture_status(void) __attribute__((weak));
extern void fake_npu_record_task(void (*run)(void *), void (*release)(void *), void *argument)
    __attribute__((weak));

static FILE *Log(void) {
  static FILE *log = NULL;
  if (log == NULL) {
    log = fopen(getenv("FAKE_ACLNN_LOG"), "a");
    setvbuf(log, NULL, _IOLBF, 0);
  }
  return log;
}

static int Status(const char *symbol) {
  const char *fail = getenv("FAKE_ACLNN_FAIL");
  size_t n = strlen(symbol);
  if (fail != NULL && strncmp(fail, symbol, n) == 0 && fail[n] == '=') {
    return atoi(fail + n + 1);
  }
  return 0;
}

int aclrtUseStreamResInCurrentThread(aclrtStream stream) {
  fprintf(Log(), "{\"call\": \"aclrtUseStreamResInCurrentThread\", \"stream\": %llu}\n",
          (unsigned long long)(uintptr_t)stream);
  return Status("aclrtUseStreamResInCurrentThread");
}

static int last_status = 0;

const char *aclGetRecentErrMsg(void) {
  if (last_status == 0) return NULL;
  last_status = 0; /* read-and-clear, like CANN */
  return "fake CANN: the op rejected its arguments";
}


static void Ints(FILE *f, const int64_t *v, uint64_t n) {
  fputc('[', f);
  for (uint64_t i = 0; i < n; ++i) fprintf(f, "%s%lld", i ? ", " : "", (long long)v[i]);
  fputc(']', f);
}

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, int dataType,
                           const int64_t *stride, int64_t offset, int format,
                           const int64_t *storageDims, uint64_t storageDimsNum,
                           void *tensorData) {
  aclTensor *t = calloc(1, sizeof(aclTensor));
  t->ndim = viewDimsNum;
  t->nstorage = storageDimsNum;
  memcpy(t->dims, viewDims, viewDimsNum * sizeof(int64_t));
  memcpy(t->strides, stride, viewDimsNum * sizeof(int64_t));
  memcpy(t->storage, storageDims, storageDimsNum * sizeof(int64_t));
  t->offset = offset;
  t->dtype = dataType;
  t->format = format;
  t->data = tensorData;
  fprintf(Log(), "{\"call\": \"aclCreateTensor\"}\n");
  return t;
}

int aclDestroyTensor(const aclTensor *t) {
  fprintf(Log(), "{\"call\": \"aclDestroyTensor\"}\n");
  free((void *)t);
  return 0;
}

/* The tensors of the first stage being logged, for its executor. */
static NamedTensor pending[kMaxTensors];
static int npending = 0;

static void Tensor(FILE *f, const char *name, const aclTensor *t) {
  if (t != NULL && npending < kMaxTensors) {
    snprintf(pending[npending].name, sizeof pending[npending].name, "%s", name);
    pending[npending++].tensor = *t;
  }
  fprintf(f, ", \"%s\": ", name);
  if (t == NULL) {
    fputs("null", f);
    return;
  }
  fputs("{\"dims\": ", f);
  Ints(f, t->dims, t->ndim);
  fputs(", \"strides\": ", f);
  Ints(f, t->strides, t->ndim);
  fputs(", \"storage\": ", f);
  Ints(f, t->storage, t->nstorage);
  fprintf(f, ", \"offset\": %lld, \"dtype\": %d, \"format\": %d, \"data\": %llu}",
          (long long)t->offset, t->dtype, t->format, (unsigned long long)(uintptr_t)t->data);
}

static int Stage1(const char *symbol, uint64_t *workspaceSize, aclOpExecutor **executor) {
  int status = Status(symbol);
  int ntensors = npending;
  npending = 0;
  fprintf(Log(), ", \"status\": %d}\n", status);
  last_status = status;
  if (status != 0) return status;
  *workspaceSize = 4096;
  *executor = calloc(1, sizeof(aclOpExecutor));
  (*executor)->stage1_done = 1;
  (*executor)->ntensors = ntensors;
  memcpy((*executor)->tensors, pending, (size_t)ntensors * sizeof(NamedTensor));
  return 0;
}

/* ", \"int_values\": {name: [...]}": what the launch's small int32 / int64 inputs hold
 * now (host memory on the fake NPU), element by element through their strides. */
static void IntValues(FILE *f, const aclOpExecutor *executor) {
  fputs(", \"int_values\": {", f);
  int shown = 0;
  for (int i = 0; executor != NULL && i < executor->ntensors; ++i) {
    const aclTensor *t = &executor->tensors[i].tensor;
    int64_t count = 1;
    for (uint64_t d = 0; d < t->ndim; ++d) count *= t->dims[d];
    if ((t->dtype != kAclInt32 && t->dtype != kAclInt64) || count > kMaxValues) continue;
    fprintf(f, "%s\"%s\": [", shown++ ? ", " : "", executor->tensors[i].name);
    for (int64_t n = 0; n < count; ++n) {
      int64_t offset = t->offset, rest = n;
      for (int64_t d = (int64_t)t->ndim - 1; d >= 0; --d) {
        offset += (rest % t->dims[d]) * t->strides[d];
        rest /= t->dims[d];
      }
      long long value = t->dtype == kAclInt32 ? (long long)((const int32_t *)t->data)[offset]
                                              : (long long)((const int64_t *)t->data)[offset];
      fprintf(f, "%s%lld", n ? ", " : "", value);
    }
    fputc(']', f);
  }
  fputc('}', f);
}

/* A stage-2 launch recorded by a capture, run again by each replay. */
typedef struct Launch {
  const char *symbol;
  void *workspace;
  uint64_t workspaceSize;
  aclrtStream stream;
  aclOpExecutor executor;
} Launch;

static void Replay(void *argument) {
  const Launch *launch = argument;
  FILE *f = Log();
  fprintf(f, "{\"call\": \"%s\", \"replay\": true, \"workspace\": %s, "
          "\"workspace_size\": %llu, \"stream\": %llu", launch->symbol,
          launch->workspace != NULL ? "true" : "false",
          (unsigned long long)launch->workspaceSize,
          (unsigned long long)(uintptr_t)launch->stream);
  IntValues(f, &launch->executor);
  fputs("}\n", f);
}

static int Capturing(void) {
  return fake_npu_capture_status != NULL && fake_npu_record_task != NULL &&
         fake_npu_capture_status() != 0;
}

static int Stage2(const char *symbol, void *workspace, uint64_t workspaceSize,
                  aclOpExecutor *executor, aclrtStream stream) {
  int status = Status(symbol);
  int captured = status == 0 && executor != NULL && Capturing();
  FILE *f = Log();
  fprintf(f,
          "{\"call\": \"%s\", \"workspace\": %s, \"workspace_size\": %llu, "
          "\"executor_ok\": %s, \"stream\": %llu, \"status\": %d",
          symbol, workspace != NULL ? "true" : "false", (unsigned long long)workspaceSize,
          executor != NULL && executor->stage1_done ? "true" : "false",
          (unsigned long long)(uintptr_t)stream, status);
  if (captured) {
    fputs(", \"captured\": true", f);
  } else if (getenv("FAKE_ACLNN_INT_VALUES") != NULL) {
    IntValues(f, executor);
  }
  fputs("}\n", f);
  if (captured) {
    Launch *launch = calloc(1, sizeof(Launch));
    launch->symbol = symbol; /* a string literal of this library */
    launch->workspace = workspace;
    launch->workspaceSize = workspaceSize;
    launch->stream = stream;
    launch->executor = *executor;
    fake_npu_record_task(Replay, free, launch);
  }
  free(executor); /* the executor is released after stage 2, as in CANN */
  last_status = status;
  return status;
}

static void Attrs(FILE *f, double scale, bool causal, const char *layout) {
  fprintf(f, ", \"scale\": %.17g, \"causal\": %s, \"layout\": \"%s\"", scale,
          causal ? "true" : "false", layout);
}

/* The features' attributes: Int -> int64_t, Float -> double. */
static void FeatureAttrs(FILE *f, int64_t maxSeqlenQ, int64_t maxSeqlenK, int64_t windowLeft,
                         int64_t windowRight, double softcap, double dropoutP) {
  fprintf(f, ", \"max_seqlen_q\": %lld, \"max_seqlen_k\": %lld, \"window_left\": %lld, "
          "\"window_right\": %lld, \"softcap\": %.17g, \"dropout_p\": %.17g",
          (long long)maxSeqlenQ, (long long)maxSeqlenK, (long long)windowLeft,
          (long long)windowRight, softcap, dropoutP);
}

/* fp16_scores: both ops' last attribute (Bool -> bool). */
static void ScoresAttr(FILE *f, bool fp16Scores) {
  fprintf(f, ", \"fp16_scores\": %s", fp16Scores ? "true" : "false");
}

int aclnnFlashCannAttentionGetWorkspaceSize(
    const aclTensor *query, const aclTensor *key, const aclTensor *value,
    const aclTensor *keyPaddingMaskOptional, const aclTensor *cuSeqlensQOptional,
    const aclTensor *cuSeqlensKOptional, const aclTensor *alibiSlopesOptional,
    const aclTensor *rngStateOptional, const aclTensor *sinksOptional, double scale,
    bool causal, char *layoutOptional, int64_t maxSeqlenQ, int64_t maxSeqlenK,
    int64_t windowLeft, int64_t windowRight, double softcap, double dropoutP, bool fp16Scores,
    const aclTensor *outOut, const aclTensor *softmaxLseOut, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
  FILE *f = Log();
  fputs("{\"call\": \"aclnnFlashCannAttentionGetWorkspaceSize\"", f);
  Tensor(f, "query", query);
  Tensor(f, "key", key);
  Tensor(f, "value", value);
  Tensor(f, "key_padding_mask", keyPaddingMaskOptional);
  Tensor(f, "cu_seqlens_q", cuSeqlensQOptional);
  Tensor(f, "cu_seqlens_k", cuSeqlensKOptional);
  Tensor(f, "alibi_slopes", alibiSlopesOptional);
  Tensor(f, "rng_state", rngStateOptional);
  Tensor(f, "sinks", sinksOptional);
  Attrs(f, scale, causal, layoutOptional);
  FeatureAttrs(f, maxSeqlenQ, maxSeqlenK, windowLeft, windowRight, softcap, dropoutP);
  ScoresAttr(f, fp16Scores);
  Tensor(f, "out", outOut);
  Tensor(f, "softmax_lse", softmaxLseOut);
  return Stage1("aclnnFlashCannAttentionGetWorkspaceSize", workspaceSize, executor);
}

int aclnnFlashCannAttention(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                            aclrtStream stream) {
  return Stage2("aclnnFlashCannAttention", workspace, workspaceSize, executor, stream);
}

int aclnnFlashCannAttentionGradGetWorkspaceSize(
    const aclTensor *gradOut, const aclTensor *query, const aclTensor *key,
    const aclTensor *value, const aclTensor *out, const aclTensor *softmaxLse,
    const aclTensor *keyPaddingMaskOptional, const aclTensor *gradSoftmaxLseOptional,
    const aclTensor *cuSeqlensQOptional, const aclTensor *cuSeqlensKOptional,
    const aclTensor *alibiSlopesOptional, const aclTensor *rngStateOptional,
    const aclTensor *sinksOptional, double scale, bool causal, char *layoutOptional,
    bool deterministic, int64_t maxSeqlenQ, int64_t maxSeqlenK, int64_t windowLeft,
    int64_t windowRight, double softcap, double dropoutP, bool fp16Scores,
    const aclTensor *gradQueryOut, const aclTensor *gradKeyOut,
    const aclTensor *gradValueOut, const aclTensor *gradSinksOut, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
  FILE *f = Log();
  fputs("{\"call\": \"aclnnFlashCannAttentionGradGetWorkspaceSize\"", f);
  Tensor(f, "grad_out", gradOut);
  Tensor(f, "query", query);
  Tensor(f, "key", key);
  Tensor(f, "value", value);
  Tensor(f, "out", out);
  Tensor(f, "softmax_lse", softmaxLse);
  Tensor(f, "key_padding_mask", keyPaddingMaskOptional);
  Tensor(f, "grad_softmax_lse", gradSoftmaxLseOptional);
  Tensor(f, "cu_seqlens_q", cuSeqlensQOptional);
  Tensor(f, "cu_seqlens_k", cuSeqlensKOptional);
  Tensor(f, "alibi_slopes", alibiSlopesOptional);
  Tensor(f, "rng_state", rngStateOptional);
  Tensor(f, "sinks", sinksOptional);
  Attrs(f, scale, causal, layoutOptional);
  fprintf(f, ", \"deterministic\": %s", deterministic ? "true" : "false");
  FeatureAttrs(f, maxSeqlenQ, maxSeqlenK, windowLeft, windowRight, softcap, dropoutP);
  ScoresAttr(f, fp16Scores);
  Tensor(f, "grad_query", gradQueryOut);
  Tensor(f, "grad_key", gradKeyOut);
  Tensor(f, "grad_value", gradValueOut);
  Tensor(f, "grad_sinks", gradSinksOut);
  return Stage1("aclnnFlashCannAttentionGradGetWorkspaceSize", workspaceSize, executor);
}

int aclnnFlashCannAttentionGrad(void *workspace, uint64_t workspaceSize,
                                aclOpExecutor *executor, aclrtStream stream) {
  return Stage2("aclnnFlashCannAttentionGrad", workspace, workspaceSize, executor, stream);
}

int aclnnFlashCannAttentionKVCacheGetWorkspaceSize(
    const aclTensor *query, const aclTensor *kCache, const aclTensor *vCache,
    const aclTensor *keyOptional, const aclTensor *valueOptional,
    const aclTensor *cacheSeqlensOptional, const aclTensor *cacheBatchIdxOptional,
    const aclTensor *blockTableOptional, const aclTensor *cacheLeftpadOptional,
    const aclTensor *cuSeqlensQOptional, const aclTensor *alibiSlopesOptional,
    const aclTensor *sinksOptional, double scale, bool causal, char *layoutOptional,
    int64_t maxSeqlenQ, int64_t windowLeft, int64_t windowRight, double softcap,
    int64_t numSplits, const aclTensor *outOut, const aclTensor *softmaxLseOut,
    uint64_t *workspaceSize, aclOpExecutor **executor) {
  FILE *f = Log();
  fputs("{\"call\": \"aclnnFlashCannAttentionKVCacheGetWorkspaceSize\"", f);
  Tensor(f, "query", query);
  Tensor(f, "k_cache", kCache);
  Tensor(f, "v_cache", vCache);
  Tensor(f, "key", keyOptional);
  Tensor(f, "value", valueOptional);
  Tensor(f, "cache_seqlens", cacheSeqlensOptional);
  Tensor(f, "cache_batch_idx", cacheBatchIdxOptional);
  Tensor(f, "block_table", blockTableOptional);
  Tensor(f, "cache_leftpad", cacheLeftpadOptional);
  Tensor(f, "cu_seqlens_q", cuSeqlensQOptional);
  Tensor(f, "alibi_slopes", alibiSlopesOptional);
  Tensor(f, "sinks", sinksOptional);
  Attrs(f, scale, causal, layoutOptional);
  fprintf(f, ", \"max_seqlen_q\": %lld, \"window_left\": %lld, \"window_right\": %lld, "
          "\"softcap\": %.17g, \"num_splits\": %lld", (long long)maxSeqlenQ,
          (long long)windowLeft, (long long)windowRight, softcap, (long long)numSplits);
  Tensor(f, "out", outOut);
  Tensor(f, "softmax_lse", softmaxLseOut);
  return Stage1("aclnnFlashCannAttentionKVCacheGetWorkspaceSize", workspaceSize, executor);
}

int aclnnFlashCannAttentionKVCache(void *workspace, uint64_t workspaceSize,
                                   aclOpExecutor *executor, aclrtStream stream) {
  return Stage2("aclnnFlashCannAttentionKVCache", workspace, workspaceSize, executor, stream);
}
