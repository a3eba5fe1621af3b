// A roofline model of the forward kernel on an Ascend platform: a PREDICTION, used to
// report expected time and cube utilisation (`flash-cann plan`), never to decide
// correctness. Assumes perfect overlap of the four engines, so it is optimistic.
//
//   cube    busiest core's MACs / (16*16*16 MACs/cycle x cube clock)
//   vector  busiest core's vector element-passes, split over its 2 vector cores, at
//           64 fp32 elements per cycle: kScorePasses per score element (scale, bias,
//           row max, subtract, exp, row sum, cast to P, copy) and kOutputPasses per output
//           element per key block (rescale, accumulate)
//   HBM     Q, K, V, out, lse, mask read/written once, over the platform's HBM bandwidth
//   L2      per key block: S (fp32) and P written and read back through the GM
//           workspace, O partials (fp32) likewise, K and V re-read; over L2 bandwidth
//   time = max of the four; utilisation = useful FLOPs (4 D x visible query-key pairs)
//          / (time x cube peak)
#ifndef FLASH_CANN_PLANNER_COST_MODEL_H
#define FLASH_CANN_PLANNER_COST_MODEL_H

#include "planner.h"

namespace flash_cann {

constexpr double kScorePasses = 8;
constexpr double kOutputPasses = 2;
constexpr double kVectorElementsPerCycle = 64;

Prediction Predict(const Plan& plan, const PlanRequest& request, const Platform& platform);

// Query-key pairs that are visible (not masked by causality), for one (batch, head).
double VisiblePairs(int64_t seqlenQ, int64_t seqlenK, bool causal);

}  // namespace flash_cann

#endif
