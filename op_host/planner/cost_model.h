// The cost model of flash-cann's forward kernel and of the incumbent's: each design
// described as data (KernelDesign) and run through the schedule model
// (schedule_model.h). PREDICTIONS, used to report expected time and cube utilisation
// (`flash-cann plan`, benchmarks/npu_model.py), never to decide correctness.
//
//   DesignFromTiling   our kernel as the plan's TilingData configures it (op_kernel/
//                      flash_attention_{cube,vector}.h, docs/kernel.md): rounds of
//                      blockK x keyStack keys, S two rounds ahead of P.V, the O update one
//                      round behind the softmax, V and the next K loaded before the wait
//                      for P, Q resident in L0A, O accumulated in its own L0C buffer over
//                      the stack, vecRows-row double-buffered UB slices, tiles drained
//                      one by one
//   IncumbentDesign    FlashAttentionScore's forward on 910B (hicann/ops-transformer
//                      attention/flash_attention_score/op_kernel/
//                      flash_attention_score_s1s2_bn2gs1.h, tiling
//                      FlashAttentionScoreTilingS1s2Bn2gs1): per vector core 128 query
//                      rows x 1024 keys (S2 128 x nRatio 8) per round, the cube serving
//                      both vector cores (256 rows, K/V shared in L1), ring
//                      bmm1(i) vec1(i-1) bmm2(i-1) vec2(i-2) running across S1 blocks
//   PtoDesign          the PTO hand kernel (hw-native-sys/pto-isa kernels/manual/common/
//                      flash_atten/fa_performance_kernel.cpp, main.cpp, run.sh,
//                      scripts/generate_cases.py): one kernel block per CUBE_S0 query rows
//                      (blocks handed to the AI cores in turn, each run start to finish);
//                      Q loaded into L1 once per block and moved to L0A for every product;
//                      per CUBE_S1 keys one S product, Fixpiped as fp32 into a GM fifo;
//                      the vector cores read a logical tile of TILE_S1 keys in row slices
//                      of CUBE_S0 / 2 / (TILE_S1 / CUBE_S1) rows, write P as fp16 to a GM
//                      fifo; the cube accumulates P.V of the TILE_S1 keys in L0C and
//                      Fixpipes it (fp32) once per logical tile; the vector rescales its
//                      running O (UB) with it; S of qkPreload tiles ahead of P.V, the O
//                      update qkPreload tiles behind the softmax, fifos of 8 slots; fp32 O
#ifndef FLASH_CANN_PLANNER_COST_MODEL_H
#define FLASH_CANN_PLANNER_COST_MODEL_H

#include <vector>

#include "planner.h"
#include "schedule_model.h"

namespace flash_cann {

KernelDesign DesignFromTiling(const TilingData& t, uint32_t elemBytes);
KernelDesign IncumbentDesign(uint32_t headDimPad, uint32_t elemBytes);

// PTO's compile-time tiling. The defaults are run.sh's and generate_cases.py's (CUBE_S1
// fixed at 128, TILE_S1 256, qkPreload 4, fifo depth kFaCvFifoSize 8); the README's
// 1/2/4/8-core tables use CUBE_S0 128 (S0 = 128 x cores, one block per core). The
// tiling of its 24-core 910B2 table is not published: the same defaults are assumed.
struct PtoTiling {
    uint32_t cubeS0 = 128;
    uint32_t cubeS1 = 128;
    uint32_t tileS1 = 256;
    uint32_t qkPreload = 4;
    uint32_t fifoSlots = 8;
};
KernelDesign PtoDesign(uint32_t headDimPad, const PtoTiling& tiling);

// The prediction for a plan of our kernel.
Prediction Predict(const Plan& plan, const PlanRequest& request, const Platform& platform);
// The prediction for a packed (TND) plan, given the sequences' offsets: the plan does not
// depend on them (the kernel reads them on the device), but its time does; the model walks
// the tiles and the split the kernel computes from them (flash_cann_packed.h).
Prediction PredictPacked(const Plan& plan, const PlanRequest& request, const Platform& platform,
                         const std::vector<int32_t>& cuSeqlensQ,
                         const std::vector<int32_t>& cuSeqlensK);
// The incumbent's design on the same problem, with its own work split.
Prediction PredictIncumbent(const PlanRequest& request, const Platform& platform);
// PTO's design on the same problem (fp16; seqlen_q a multiple of CUBE_S0, seqlen_k of
// TILE_S1), its blocks handed to the AI cores in turn.
Prediction PredictPto(const PlanRequest& request, const Platform& platform,
                      const PtoTiling& tiling = PtoTiling());

// Any design on the work split of `split` (its blockQ, rowStart, usedCores).
Prediction PredictDesign(const KernelDesign& design, const TilingData& split,
                         const PlanRequest& request, const Platform& platform);

// Query-key pairs that are visible (not masked by causality or the sliding window), for
// one (batch, head).
double VisiblePairs(int64_t seqlenQ, int64_t seqlenK, bool causal, int64_t windowLeft = -1,
                    int64_t windowRight = -1);

}  // namespace flash_cann

#endif
