#include "balanced_split.h"

#include <algorithm>

namespace flash_cann {

std::vector<uint64_t> SplitPeriodic(const std::vector<double>& prefix, uint64_t segments,
                                    uint32_t cores)
{
    const uint64_t units = prefix.size() - 1;
    const uint64_t totalUnits = segments * units;
    const double segmentWork = prefix[units];
    const double total = segmentWork * static_cast<double>(segments);
    cores = static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(cores, totalUnits)));
    std::vector<uint64_t> starts{0};
    for (uint32_t c = 1; c < cores; ++c) {
        const double target = total * c / cores;
        uint64_t segment = static_cast<uint64_t>(target / segmentWork);
        segment = std::min(segment, segments - 1);
        const double rest = target - static_cast<double>(segment) * segmentWork;
        // The unit boundary whose prefix work is closest to the target.
        uint64_t k = static_cast<uint64_t>(
            std::lower_bound(prefix.begin(), prefix.end(), rest) - prefix.begin());
        k = std::min(k, units);
        if (k > 0 && rest - prefix[k - 1] < prefix[k] - rest) {
            --k;
        }
        const uint64_t unit = segment * units + k;
        if (unit > starts.back() && unit < totalUnits) {
            starts.push_back(unit);  // skip empty ranges: every range gets work
        }
    }
    starts.push_back(totalUnits);
    return starts;
}

void RefineBoundaries(uint64_t* starts, uint32_t ranges, uint64_t step,
                      const std::function<double(uint64_t, uint64_t)>& cost, int passes)
{
    for (int pass = 0; pass < passes; ++pass) {
        bool moved = false;
        for (uint32_t c = 1; c < ranges; ++c) {
            uint64_t& boundary = starts[c];
            const uint64_t lo = starts[c - 1];
            const uint64_t hi = starts[c + 1];
            double best = std::max(cost(lo, boundary), cost(boundary, hi));
            for (int64_t delta : {static_cast<int64_t>(step), -static_cast<int64_t>(step)}) {
                const uint64_t candidate = boundary + delta;
                if (candidate <= lo || candidate >= hi) {
                    continue;
                }
                const double worse = std::max(cost(lo, candidate), cost(candidate, hi));
                if (worse < best) {
                    best = worse;
                    boundary = candidate;
                    moved = true;
                }
            }
        }
        if (!moved) {
            return;
        }
    }
}

}  // namespace flash_cann
