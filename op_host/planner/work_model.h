// The planner's model of the forward kernel's work, and the work split built on it.
//
// Unit of work: cube multiply-accumulates over what the kernel really computes -- tile
// rows padded to 16, the whole key sub-blocks a tile visits (the last one zero-padded), head_dim
// padded to 16, for Q.K^T and P.V. Causal tiles visit only the key blocks left of their
// last row's diagonal, so their work grows along the sequence: the split balances it.
#ifndef FLASH_CANN_PLANNER_WORK_MODEL_H
#define FLASH_CANN_PLANNER_WORK_MODEL_H

#include <vector>

#include "planner.h"

namespace flash_cann {

// Key columns the cube processes for `tile`.
uint64_t VisitedColumns(const TilingData& t, const QueryTile& tile, bool causal);

// Split the flattened (batch, head_q, row) space into at most `cores` contiguous row
// ranges of balanced work: fills t.rowStart and t.usedCores (every used core gets rows).
void SplitRows(TilingData& t, bool causal, uint32_t cores);

// The modelled work of every used core, walking its tiles with the kernel's NextTile.
std::vector<CoreWork> MeasureCores(const TilingData& t, bool causal);

}  // namespace flash_cann

#endif
