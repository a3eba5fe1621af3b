// The timing mode's state: the cost table, each unit's timeline, the launch's report and
// the traced core's instructions. See twin/timing.h for the model.
#include "twin/timing.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <memory>
#include <mutex>
#include <sstream>

namespace twin {
namespace {

constexpr int kUnits = 3;  // AIC, AIV0, AIV1
constexpr size_t kTraceEvents = 1000000;
const char* const kUnitNames[kUnits] = {"AIC", "AIV0", "AIV1"};
const char* const kPipeNames[kTimedPipes] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "ALL", "FIX"};
const char* const kRouteNames[] = {"gm_to_l1", "gm_to_ub", "ub_to_gm", "l1_to_l0a", "l1_to_l0b",
                                   "l0c_to_gm", "l1_fill"};
const char* const kVecNames[] = {"scalar_arith", "binary", "exp", "ln", "div", "block_reduce",
                                 "whole_reduce", "broadcast", "cast", "duplicate", "compare", "select"};
static_assert(sizeof(kRouteNames) / sizeof(kRouteNames[0]) == static_cast<size_t>(Route::kCount), "routes");
static_assert(sizeof(kVecNames) / sizeof(kVecNames[0]) == static_cast<size_t>(VecClass::kCount), "classes");

// The routes that move GM data: they share the L2 bandwidth.
bool TouchesGm(Route route)
{
    return route == Route::kGmToL1 || route == Route::kGmToUb || route == Route::kUbToGm ||
           route == Route::kL0cToGm;
}

// The figures of TimingCosts by name, in CostNames() order.
std::vector<std::pair<std::string, double*>> Figures(TimingCosts& c)
{
    std::vector<std::pair<std::string, double*>> out = {{"clock_ghz", &c.clockGhz},
                                                        {"dispatch_cycles", &c.dispatchCycles}};
    for (int p = 0; p < kTimedPipes; ++p) {
        if (p != 6) {  // PIPE_ALL issues nothing
            out.emplace_back(std::string("issue_cycles.") + kPipeNames[p], &c.issueCycles[p]);
        }
    }
    for (int r = 0; r < static_cast<int>(Route::kCount); ++r) {
        out.emplace_back(std::string("bytes_per_cycle.") + kRouteNames[r], &c.bytesPerCycle[r]);
        out.emplace_back(std::string("latency_cycles.") + kRouteNames[r], &c.latencyCycles[r]);
    }
    out.emplace_back("cube_fractal_cycles", &c.cubeFractalCycles);
    for (int v = 0; v < static_cast<int>(VecClass::kCount); ++v) {
        out.emplace_back(std::string("vector_cycles_per_repeat.") + kVecNames[v], &c.vectorCycles[v]);
        out.emplace_back(std::string("vector_head_cycles.") + kVecNames[v], &c.vectorHead[v]);
    }
    out.emplace_back("scalar_local_cycles", &c.scalarLocalCycles);
    out.emplace_back("scalar_gm_cycles", &c.scalarGmCycles);
    out.emplace_back("l2_bytes_per_cycle", &c.l2BytesPerCycle);
    out.emplace_back("cross_core_flag_cycles", &c.crossCoreFlagCycles);
    out.emplace_back("sync_all_cycles", &c.syncAllCycles);
    out.emplace_back("launch_cycles", &c.launchCycles);
    return out;
}

struct TraceEvent {
    int unit, pipe;
    double start, cycles;
    Site site;
};

struct UnitResult {
    Stamp end;
    double busy[kTimedPipes] = {};
    uint64_t instructions[kTimedPipes] = {};
    uint64_t stream = 0;
};

// One unit's timeline.
struct UnitTiming {
    TimingLaunch* launch = nullptr;
    uint32_t core = 0;
    int role = 0;
    bool traced = false;
    Stamp cursor;                 // the scalar unit's issue point
    Stamp free[kTimedPipes];      // the pipe can start its next instruction
    Stamp done[kTimedPipes];      // everything issued to the pipe has finished
    Stamp ready[kTimedPipes];     // waits and barriers: the next instruction starts after
    UnitResult result;
};

std::mutex g_settingsMutex;
std::unique_ptr<TimingCosts> g_costs;  // null: timing off
int g_traceCore = -1;
bool g_skipArithmetic = false;
uint32_t g_shareCores = 0;
std::string g_lastTrace, g_lastReport;
thread_local UnitTiming* t_timing = nullptr;
thread_local bool t_computing = true;

Stamp Plus(const Stamp& from, double cycles, int slot)
{
    Stamp s = from;
    s.at += cycles;
    s.path[slot] += cycles;
    return s;
}

// FNV-1a over the instruction stream: what a timing-only launch must reproduce.
void Mix(uint64_t& hash, uint64_t value)
{
    for (int i = 0; i < 8; ++i) {
        hash = (hash ^ ((value >> (8 * i)) & 0xff)) * 1099511628211ull;
    }
}

std::string Number(double v)
{
    std::ostringstream out;
    out << std::setprecision(15) << v;
    return out.str();
}

std::string PipeObject(const double* values)
{
    std::string out = "{";
    for (int p = 0; p < kTimedPipes; ++p) {
        if (p == 6) continue;
        out += std::string(out.size() > 1 ? "," : "") + "\"" + kPipeNames[p] + "\":" + Number(values[p]);
    }
    return out + "}";
}

const char* Basename(const char* file)
{
    const char* slash = std::strrchr(file, '/');
    return slash ? slash + 1 : file;
}

}  // namespace

struct TimingLaunch {
    TimingCosts costs;
    uint32_t blockDim = 1;
    uint32_t shareCores = 1;  // the L2 bandwidth's sharers
    int traceCore = -1;
    bool skipArithmetic = false;
    std::mutex mutex;
    std::vector<UnitResult> units;  // core * 3 + role
    std::vector<TraceEvent> trace;
    bool traceTruncated = false;
};

const Stamp& Later(const Stamp& a, const Stamp& b)
{
    return b.at > a.at ? b : a;
}

std::vector<std::string> CostNames()
{
    TimingCosts scratch;
    std::vector<std::string> names;
    for (const auto& figure : Figures(scratch)) {
        names.push_back(figure.first);
    }
    return names;
}

bool SetTimingCosts(TimingCosts& costs, const double* values, size_t count)
{
    auto figures = Figures(costs);
    if (count != figures.size()) {
        return false;
    }
    for (size_t i = 0; i < count; ++i) {
        *figures[i].second = values[i];
    }
    return true;
}

void SetTiming(const TimingCosts* costs, int traceCore, bool skipArithmetic, uint32_t shareCores)
{
    std::lock_guard<std::mutex> lock(g_settingsMutex);
    g_shareCores = shareCores;
    g_costs = costs ? std::make_unique<TimingCosts>(*costs) : nullptr;
    g_traceCore = traceCore;
    g_skipArithmetic = costs != nullptr && skipArithmetic;
}

bool TimingOn()
{
    std::lock_guard<std::mutex> lock(g_settingsMutex);
    return g_costs != nullptr;
}

bool Computing()
{
    return t_computing;
}

namespace {

// The traced core's instruction, up to kTraceEvents per launch (the trace says if it stopped).
void Record(UnitTiming& u, int pipe, double start, double cycles, const Site& site)
{
    if (!u.traced) {
        return;
    }
    std::lock_guard<std::mutex> lock(u.launch->mutex);
    if (u.launch->trace.size() < kTraceEvents) {
        u.launch->trace.push_back({u.role, pipe, start, cycles, site});
    } else {
        u.launch->traceTruncated = true;
    }
}

}  // namespace

void Issue(int pipe, const Work& work, const Site& site)
{
    UnitTiming* u = t_timing;
    if (u == nullptr) {
        return;
    }
    const TimingCosts& c = u->launch->costs;
    Mix(u->result.stream, static_cast<uint64_t>(pipe) << 56 | uint64_t{work.kind} << 48 |
                              uint64_t{work.what} << 40 | static_cast<uint32_t>(site.line));
    Mix(u->result.stream, work.amount);
    ++u->result.instructions[pipe];
    if (pipe == 0) {  // the scalar unit runs its own instructions in order, at the cursor
        const double cycles = work.kind == Work::kScalarGm ? c.scalarGmCycles : c.scalarLocalCycles;
        const Stamp start = Later(u->cursor, u->ready[0]);
        u->cursor = u->free[0] = u->done[0] = Plus(start, cycles, 0);
        u->result.busy[0] += cycles;
        Record(*u, pipe, start.at, cycles, site);
        return;
    }
    double occupancy = c.issueCycles[pipe], latency = 0;
    switch (work.kind) {
        case Work::kTransfer: {
            double rate = c.bytesPerCycle[work.what];
            if (TouchesGm(static_cast<Route>(work.what))) {
                rate = std::min(rate, c.l2BytesPerCycle / u->launch->shareCores);
            }
            occupancy += rate > 0 ? static_cast<double>(work.amount) / rate : 0;
            latency = c.latencyCycles[work.what];
            break;
        }
        case Work::kCube: occupancy += static_cast<double>(work.amount) * c.cubeFractalCycles; break;
        case Work::kVector:
            if (work.amount > 0) {  // the first repeat's result comes `head` cycles in
                occupancy += static_cast<double>(work.amount) * c.vectorCycles[work.what];
                latency = std::max(0.0, c.vectorHead[work.what] - c.vectorCycles[work.what]);
            }
            break;
        default: break;
    }
    u->cursor = Plus(u->cursor, c.dispatchCycles, 0);
    const Stamp start = Later(Later(u->cursor, u->free[pipe]), u->ready[pipe]);
    u->free[pipe] = Plus(start, occupancy, pipe);
    u->done[pipe] = Later(u->done[pipe], Plus(start, occupancy + latency, pipe));
    u->result.busy[pipe] += occupancy;
    Record(*u, pipe, start.at, occupancy, site);
}

Stamp CompletedAt(int pipe)
{
    UnitTiming* u = t_timing;
    return u == nullptr ? Stamp{} : Later(u->cursor, u->done[pipe]);
}

void WaitPipe(int pipe, const Stamp& stamp)
{
    UnitTiming* u = t_timing;
    if (u == nullptr) {
        return;
    }
    if (pipe == 0) {
        WaitUnit(stamp);
        return;
    }
    u->ready[pipe] = Later(u->ready[pipe], stamp);
}

void WaitUnit(const Stamp& stamp)
{
    if (UnitTiming* u = t_timing) {
        u->cursor = Later(u->cursor, stamp);
    }
}

Stamp AfterFlag(const Stamp& stamp)
{
    UnitTiming* u = t_timing;
    return u == nullptr ? stamp : Plus(stamp, u->launch->costs.crossCoreFlagCycles, kSyncSlot);
}

Stamp AfterSyncAll(const Stamp& stamp)
{
    UnitTiming* u = t_timing;
    return u == nullptr ? stamp : Plus(stamp, u->launch->costs.syncAllCycles, kSyncSlot);
}

TimingLaunch* BeginTimingLaunch(uint32_t blockDim)
{
    std::lock_guard<std::mutex> lock(g_settingsMutex);
    if (g_costs == nullptr) {
        return nullptr;
    }
    auto* launch = new TimingLaunch;
    launch->costs = *g_costs;
    launch->blockDim = std::max<uint32_t>(blockDim, 1);
    launch->shareCores = g_shareCores > 0 ? g_shareCores : launch->blockDim;
    launch->traceCore = g_traceCore;
    launch->skipArithmetic = g_skipArithmetic;
    launch->units.resize(size_t{launch->blockDim} * kUnits);
    return launch;
}

bool SkipsArithmetic(const TimingLaunch* launch)
{
    return launch != nullptr && launch->skipArithmetic;
}

void BeginTimingThread(TimingLaunch* launch, uint32_t core, int role)
{
    t_computing = launch == nullptr || !launch->skipArithmetic;
    if (launch == nullptr) {
        t_timing = nullptr;
        return;
    }
    auto* u = new UnitTiming;
    u->launch = launch;
    u->core = core;
    u->role = role;
    u->traced = launch->traceCore == static_cast<int>(core);
    u->result.stream = 1469598103934665603ull;
    t_timing = u;
}

void EndTimingThread(TimingLaunch* launch)
{
    UnitTiming* u = t_timing;
    t_timing = nullptr;
    t_computing = true;
    if (u == nullptr) {
        return;
    }
    Stamp end = u->cursor;
    for (const Stamp& d : u->done) {
        end = Later(end, d);
    }
    u->result.end = end;
    {
        std::lock_guard<std::mutex> lock(launch->mutex);
        launch->units[size_t{u->core} * kUnits + static_cast<size_t>(u->role)] = u->result;
    }
    delete u;
}

std::string EndTimingLaunch(TimingLaunch* launch)
{
    if (launch == nullptr) {
        return "";
    }
    std::unique_ptr<TimingLaunch> owned(launch);
    const TimingCosts& c = launch->costs;
    size_t last = 0;
    for (size_t i = 0; i < launch->units.size(); ++i) {
        if (launch->units[i].end.at > launch->units[last].end.at) {
            last = i;
        }
    }
    std::ostringstream out;
    out << "{\"clock_ghz\":" << Number(c.clockGhz) << ",\"cores\":" << launch->blockDim
        << ",\"l2_share_cores\":" << launch->shareCores
        << ",\"launch_cycles\":" << Number(c.launchCycles)
        << ",\"makespan_cycles\":" << Number(launch->units[last].end.at)
        << ",\"timing_only\":" << (launch->skipArithmetic ? "true" : "false")
        << ",\"trace_truncated\":" << (launch->traceTruncated ? "true" : "false") << ",\"units\":[";
    for (size_t i = 0; i < launch->units.size(); ++i) {
        const UnitResult& r = launch->units[i];
        double counts[kTimedPipes];
        std::copy(std::begin(r.instructions), std::end(r.instructions), counts);
        out << (i ? "," : "") << "{\"core\":" << i / kUnits << ",\"unit\":\"" << kUnitNames[i % kUnits]
            << "\",\"end_cycles\":" << Number(r.end.at) << ",\"busy_cycles\":" << PipeObject(r.busy)
            << ",\"instructions\":" << PipeObject(counts) << ",\"stream\":\"" << std::hex << r.stream
            << std::dec << "\"}";
    }
    const Stamp& end = launch->units[last].end;
    out << "],\"critical_path\":{\"core\":" << last / kUnits << ",\"unit\":\"" << kUnitNames[last % kUnits]
        << "\",\"cycles\":" << PipeObject(end.path) << ",\"sync_cycles\":" << Number(end.path[kSyncSlot])
        << "}}";
    // The trace: one process per core, one thread per (unit, pipe); times in microseconds.
    std::ostringstream trace;
    const double perMicrosecond = c.clockGhz * 1000.0;
    trace << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
    bool first = true;
    for (int unit = 0; unit < kUnits && launch->traceCore >= 0; ++unit) {
        for (int p = 0; p < kTimedPipes; ++p) {
            if (p == 6) continue;
            trace << (first ? "" : ",") << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":"
                  << launch->traceCore << ",\"tid\":" << unit * kTimedPipes + p
                  << ",\"args\":{\"name\":\"" << kUnitNames[unit] << " " << kPipeNames[p] << "\"}}";
            first = false;
        }
    }
    for (const TraceEvent& e : launch->trace) {
        trace << ",{\"ph\":\"X\",\"name\":\"" << Basename(e.site.file) << ":" << e.site.line
              << "\",\"pid\":" << launch->traceCore << ",\"tid\":" << e.unit * kTimedPipes + e.pipe
              << ",\"ts\":" << Number(e.start / perMicrosecond) << ",\"dur\":"
              << Number(e.cycles / perMicrosecond) << "}";
    }
    trace << "]}";
    std::lock_guard<std::mutex> lock(g_settingsMutex);
    g_lastTrace = trace.str();
    g_lastReport = out.str();
    return g_lastReport;
}

std::string LastTrace()
{
    std::lock_guard<std::mutex> lock(g_settingsMutex);
    return g_lastTrace;
}

std::string LastReport()
{
    std::lock_guard<std::mutex> lock(g_settingsMutex);
    return g_lastReport;
}

}  // namespace twin
