// The timing mode's C ABI (the Python launcher): the cost table's figure names, switching
// timing on for the following launches, and the last timed launch's report and trace.
#include <cstring>
#include <string>

#include "twin/timing.h"

namespace {

// Copies `text` (NUL-terminated) into the caller's buffer; returns its length, or minus
// the capacity it needs.
int64_t CopyOut(const std::string& text, char* buffer, uint64_t capacity)
{
    if (text.size() + 1 > capacity) {
        return -static_cast<int64_t>(text.size() + 1);
    }
    std::memcpy(buffer, text.c_str(), text.size() + 1);
    return static_cast<int64_t>(text.size());
}

}  // namespace

// The figures flash_cann_twin_timing takes, one name a line, in its order.
extern "C" int64_t flash_cann_twin_timing_figures(char* buffer, uint64_t capacity)
{
    std::string text;
    for (const std::string& name : twin::CostNames()) {
        text += name + "\n";
    }
    return CopyOut(text, buffer, capacity);
}

// Timing on for the following launches with `values` (the figures' values; null: off);
// `traceCore`: the AI core to trace (-1: none); `skipArithmetic`: a timing-only launch;
// `shareCores`: the cores sharing the L2 bandwidth (0: the launch's). Returns 1 if `count`
// is not the number of figures.
extern "C" int flash_cann_twin_timing(const double* values, uint64_t count, int32_t traceCore,
                                      int32_t skipArithmetic, int32_t shareCores)
{
    if (values == nullptr) {
        twin::SetTiming(nullptr, -1, false);
        return 0;
    }
    twin::TimingCosts costs;
    if (!twin::SetTimingCosts(costs, values, count)) {
        return 1;
    }
    twin::SetTiming(&costs, traceCore, skipArithmetic != 0,
                    shareCores > 0 ? static_cast<uint32_t>(shareCores) : 0);
    return 0;
}

extern "C" int64_t flash_cann_twin_timing_report(char* buffer, uint64_t capacity)
{
    return CopyOut(twin::LastReport(), buffer, capacity);
}

extern "C" int64_t flash_cann_twin_timing_trace(char* buffer, uint64_t capacity)
{
    return CopyOut(twin::LastTrace(), buffer, capacity);
}
