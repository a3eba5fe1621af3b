// JSON rendering of plans and platforms (for the C ABI and the planner's tests).
#ifndef FLASH_CANN_PLANNER_PLAN_JSON_H
#define FLASH_CANN_PLANNER_PLAN_JSON_H

#include <string>

#include "decode_planner.h"
#include "grad_planner.h"
#include "model_fit.h"
#include "planner.h"

namespace flash_cann {

// The plan, its prediction and, for comparison, the prediction for the incumbent's
// design on the same problem.
std::string PlanToJson(const PlanResult& result, const PlanRequest& request,
                       const Platform& platform);
// The backward plan and its schedule-model prediction.
std::string GradPlanToJson(const GradPlanResult& result, const GradPlanRequest& request,
                           const Platform& platform);
std::string PlatformsToJson();
// A decode plan (decode_planner.h) with the model's prediction for `keys` keys per sequence.
std::string DecodePlanToJson(const DecodePlanResult& result, const DecodeRequest& request,
                             const Platform& platform, int64_t keys);
std::string ErrorJson(const std::string& message);
// The schedule model's fit (model_fit.h): figures, points, cost.
std::string FitToJson(const FitResult& fit, const Platform& platform);

}  // namespace flash_cann

#endif
