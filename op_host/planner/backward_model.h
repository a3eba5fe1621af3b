// The schedule model of the FlashAttention backward kernel (op_kernel/
// flash_cann_attention_grad.cpp, FA2 style): a PREDICTION, never a measurement. Same
// engines, figures and timeline as the forward's model (schedule_model.h).
//
// Key pass, per step (one query block x one key block; K and V resident in L1 for a unit =
// one key block of one kv head):
//   cube    S = Q K^T and dP = dO V^T (Fixpipe both to the fp32 workspace, in pieces of
//           productRows rows through the L0C scratch copies)
//   vector  P = exp(S scale - lse), dS = P (dP - D); P and dS to the workspace
//   cube    dV += P^T dO, dK += dS^T Q (accumulated in L0C over the unit),
//           fast dQ: dQ += dS K (Fixpipe atomic add, in productRows x dqColumns pieces)
// per unit: dK and dV leave L0C once (fp32). The deterministic dQ adds a query pass, per
// step (query block x key block; Q and dO resident for a query unit): S and dP again, dS
// again (the vector stores dS only), dQ += dS K accumulated in L0C; per query unit dQ
// leaves L0C once. Before: the pre-pass (D = rowsum(dO O) - dLSE, zero dQ); after: the
// post-pass (scale, cast, write dQ, dK, dV).
#ifndef FLASH_CANN_PLANNER_BACKWARD_MODEL_H
#define FLASH_CANN_PLANNER_BACKWARD_MODEL_H

#include <cstdint>
#include <string>
#include <vector>

#include "../../op_kernel/flash_cann_variant.h"
#include "platform.h"
#include "schedule_model.h"
#include "timeline.h"

namespace flash_cann {

// The design knobs of the backward kernel. From a grad plan: blockQ, blockK, headDimPad,
// productRows, dqColumns and l0cScratchBuffers from GradTilingData, deterministic from its
// tiling key;
// the kernel keeps kGradStepsInFlight steps in flight (stepsAhead), kGradExchangeSlots
// workspace slots, two K/V L1 buffers.
struct BackwardDesign {
    uint32_t blockQ = 128;
    uint32_t blockK = 128;
    uint32_t headDimPad = 128;
    uint32_t elemBytes = 2;
    uint32_t stepsAhead = 1;       // S/dP of step i + stepsAhead - 1 issue before the
                                   // gradient matmuls of step i (1: a serial chain)
    uint32_t exchangeSlots = 2;    // workspace slots of S, dP, P, dS per AI core
    uint32_t kvL1Buffers = 2;      // K/V copies in L1: a unit's load waits for the unit
                                   // this many before it to finish its products
    uint32_t l0cScratchBuffers = 1;  // L0C copies for S, dP, dQ (dK, dV have their own)
    uint32_t productRows = 0;      // rows per Mmad/Fixpipe piece of S, dP, dQ (0: blockQ)
    uint32_t dqColumns = 0;        // columns per piece of the fast dQ (0: headDimPad)
    bool deterministic = false;    // dQ by a query pass, accumulated in L0C, no atomics
    double scoreBytes = 4;         // S through Fixpipe and the workspace (2: fp16 scores,
                                   // widened to fp32 on the vector; dP stays fp32)
    uint32_t scoreOffsetColumns = 0;  // fp16 scores: the S product's extra depth (Q's score
                                      // offset panel, loaded with Q; K's ones panel, filled
                                      // in L1 with K); the pre-pass writes the panels from
                                      // lse and the vector adds the offset back into lse
    // Dropout: > 0, every step draws the tile's keep mask (DropoutMaskProgram, passes of
    // this many elements), selects P (for dV) and dP with it and scales dP by 1 / (1 - p)
    // (dV's 1 / (1 - p) folds into the post-pass).
    uint32_t dropoutPassElements = 0;
    DropoutDraw dropoutDraw;
};

// The problem: sizes and the features (flash_cann_variant.h). The window shrinks the
// visible pairs and the steps; softcap, ALiBi and the window's edge rows add vector work
// per step; sinks add a pass over lse and D after the main loop.
struct BackwardProblem {
    int64_t batch = 0, headsQ = 0, headsKv = 0, seqlenQ = 0, seqlenK = 0, headDim = 0;
    bool causal = false;
    VariantTiling variant = kPlainVariant;
};

// One AI core's main-loop work: `units` key blocks, `steps` (query block, key block)
// products in total (the grad plan's per-core units and UnitCost steps); with the
// deterministic dQ also its query pass's query units and their (query block, key block)
// steps (QueryUnitCost).
struct BackwardCoreWork {
    uint64_t units = 0;
    uint64_t steps = 0;
    uint64_t queryUnits = 0;
    uint64_t querySteps = 0;
};

struct BackwardPrediction {
    double seconds = 0;          // launch + pre-pass + slowest core's main loop + post-pass
    double preSeconds = 0;
    double mainSeconds = 0;
    double postSeconds = 0;      // includes the sink gradient's pass
    double queryPassSeconds = 0; // the slowest core's deterministic query pass (in mainSeconds)
    double vectorStepSeconds = 0;  // one vector core's compute per step (features included)
    double usefulFlops = 0;      // 2.5 x the forward's 4 * D * visible pairs
    double cubeUtilization = 0;  // usefulFlops / (seconds * cube peak)
    std::string bound;           // what limits the main loop
    std::vector<std::pair<std::string, double>> engineBusySeconds;  // slowest core
};

BackwardPrediction PredictBackward(const BackwardDesign& design, const BackwardProblem& problem,
                                   const std::vector<BackwardCoreWork>& cores,
                                   const Platform& platform);

// The main loop's steady-state seconds per (query row x key) element of a step's tile on
// one AI core of `cores` sharing the L2, both passes with the deterministic dQ, for units
// as long as the problem's middle key block's: how the grad planner ranks block shapes.
double BackwardSecondsPerScore(const BackwardDesign& design, const BackwardProblem& problem, uint32_t cores,
                               const Platform& platform);
// Its shared-L2 part alone (no simulation, a lower bound of it).
double BackwardL2SecondsPerScore(const BackwardDesign& design, const BackwardProblem& problem, uint32_t cores,
                                 const Platform& platform);

// The main-loop work of every core when the (batch, head_kv, key block) units are split
// into `cores` contiguous equal-count ranges (for planning off the kernel's tiling).
std::vector<BackwardCoreWork> EvenBackwardSplit(const BackwardDesign& design,
                                                const BackwardProblem& problem, uint32_t cores);

}  // namespace flash_cann

#endif
