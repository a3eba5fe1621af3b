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

namespace {

// Cumulative work of the first `units` units of a periodic profile.
class PeriodicWork {
public:
    PeriodicWork(const std::vector<double>& prefix, uint64_t segments)
        : prefix_(prefix), units_(prefix.size() - 1), total_(segments * units_) {}

    uint64_t total() const { return total_; }

    double operator()(uint64_t units) const
    {
        return static_cast<double>(units / units_) * prefix_[units_] + prefix_[units % units_];
    }

    // The last boundary e in (begin, total] with work(begin, e) <= bound (at least begin + 1).
    uint64_t Reach(uint64_t begin, double bound) const
    {
        const double base = (*this)(begin);
        uint64_t lo = begin + 1;
        uint64_t hi = total_;
        while (lo < hi) {
            const uint64_t mid = lo + (hi - lo + 1) / 2;
            if ((*this)(mid) - base <= bound) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        return lo;
    }

private:
    const std::vector<double>& prefix_;
    uint64_t units_;
    uint64_t total_;
};

// Greedy cut under `bound`: the starts, stopping once more than `cores` ranges are needed.
std::vector<uint64_t> CutUnder(const PeriodicWork& work, double bound, uint32_t cores)
{
    std::vector<uint64_t> starts{0};
    while (starts.back() < work.total() && starts.size() <= cores) {
        starts.push_back(work.Reach(starts.back(), bound));
    }
    return starts;
}

}  // namespace

std::vector<uint64_t> SplitPeriodicMinMax(const std::vector<double>& prefix, uint64_t segments,
                                          uint32_t cores)
{
    const PeriodicWork work(prefix, segments);
    cores = static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(cores, work.total())));
    double lo = 0;  // infeasible below: some unit alone exceeds it, or too many ranges
    for (uint64_t k = 0; k + 1 < prefix.size(); ++k) {
        lo = std::max(lo, prefix[k + 1] - prefix[k]);
    }
    double hi = work(work.total());  // one range holds everything
    if (cores == 1 || lo >= hi) {
        return {0, work.total()};
    }
    lo *= 1 - 1e-12;
    constexpr int kProbes = 64;
    for (int probe = 0; probe < kProbes && hi - lo > 1e-12 * hi; ++probe) {
        const double mid = (lo + hi) / 2;
        const std::vector<uint64_t> starts = CutUnder(work, mid, cores);
        (starts.back() == work.total() && starts.size() - 1 <= cores ? hi : lo) = mid;
    }
    return CutUnder(work, hi, cores);
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
