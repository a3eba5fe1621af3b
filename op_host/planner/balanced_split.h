// Splitting a work profile into contiguous per-core ranges of balanced work, shared by
// the forward's row split (work_model.cpp) and the backward's key-block split
// (grad_planner.cpp).
//
// The profile is periodic: `segments` identical segments (a (batch, head) pair), each cut
// into `units` units whose cumulative work is `prefix` (prefix[0] = 0, prefix[units] =
// the segment's work). Units are numbered across segments: unit u is unit u % units of
// segment u / units.
#ifndef FLASH_CANN_PLANNER_BALANCED_SPLIT_H
#define FLASH_CANN_PLANNER_BALANCED_SPLIT_H

#include <cstdint>
#include <functional>
#include <vector>

namespace flash_cann {

// Range starts, in units, for at most `cores` ranges: starts[0] = 0, starts.back() =
// segments * units, strictly increasing (empty ranges are dropped, so every range has
// work). Boundary c sits at the unit boundary whose cumulative work is nearest to c/N of
// the total: O(N log units).
std::vector<uint64_t> SplitPeriodic(const std::vector<double>& prefix, uint64_t segments,
                                    uint32_t cores);

// Range starts (as SplitPeriodic) that minimise the largest range's work exactly, for a
// profile whose prefix is the exact work of every range: a binary search over that
// bound, each probe cutting the ranges greedily (O(N log units) per probe).
std::vector<uint64_t> SplitPeriodicMinMax(const std::vector<double>& prefix, uint64_t segments,
                                          uint32_t cores);

// Moves each interior boundary of starts[0..ranges] by `step` while that lowers the larger
// of the work of its two neighbouring ranges, `cost(begin, end)`; at most `passes` passes.
void RefineBoundaries(uint64_t* starts, uint32_t ranges, uint64_t step,
                      const std::function<double(uint64_t, uint64_t)>& cost, int passes);

}  // namespace flash_cann

#endif
