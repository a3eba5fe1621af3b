// The race detector's state: vector clocks per pipe of each unit, shadow memory for the
// local memories (per unit, 32-byte granules) and for the checked GM regions (shared,
// byte-exact intervals), and the sync call sites. See twin/race.h for the model.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "kernel_operator.h"
#include "twin/launch.h"
#include "twin/race.h"

namespace twin {
namespace {

constexpr uint32_t kGranule = 32;
constexpr int kUnitsPerCore = 3;  // AIC, AIV0, AIV1

// --- call sites, interned so shadow cells stay small ---
std::mutex g_siteMutex;
std::vector<Site> g_sites{{"?", 0}};
std::map<std::pair<const char*, int>, uint32_t> g_siteIds;
thread_local std::unordered_map<const char*, std::unordered_map<int, uint32_t>> t_siteCache;

uint32_t Intern(const Site& site)
{
    auto& byLine = t_siteCache[site.file];
    const auto cached = byLine.find(site.line);
    if (cached != byLine.end()) {
        return cached->second;
    }
    std::lock_guard<std::mutex> lock(g_siteMutex);
    auto [it, inserted] = g_siteIds.emplace(std::make_pair(site.file, site.line),
                                            static_cast<uint32_t>(g_sites.size()));
    if (inserted) {
        g_sites.push_back(site);
    }
    byLine[site.line] = it->second;
    return it->second;
}

Site SiteOf(uint32_t id)
{
    std::lock_guard<std::mutex> lock(g_siteMutex);
    return g_sites.at(id);
}

std::string Basename(const char* file)
{
    const char* slash = std::strrchr(file, '/');
    return slash ? slash + 1 : file;
}

// --- shadow state ---
// A local-memory granule: the last write and, per pipe of the unit, the last read since.
struct Cell {
    uint32_t wClock, wSite;
    uint8_t wPipe, readMask;
    uint32_t rClock[kPipes], rSite[kPipes];
};

struct LocalShadow {
    Cell* cells = nullptr;
    ~LocalShadow() { std::free(cells); }
};

struct Epoch {
    uint32_t agent, clock, site;
    bool atomic;
};

struct GmCell {  // covers [its key, the next key)
    std::vector<Epoch> writes, reads;
};

struct GmShadow {
    const uint8_t* begin;
    uint64_t bytes;
    std::string name;
    std::mutex mutex;
    std::map<uint64_t, GmCell> cells;
    bool unorderedAtomicAdds = false;  // see race.h
};

}  // namespace

struct RaceLaunch {
    uint32_t agents = 0;
    std::vector<std::unique_ptr<GmShadow>> gm;
    std::mutex mutex;
    std::set<std::tuple<std::string, uint32_t, uint32_t>> executed;  // (kind, site, queue site)
};

namespace {

struct Unit {
    RaceLaunch* launch;
    uint32_t base;  // agent id of this unit's pipe 0
    uint32_t issued[kPipes] = {};
    Clock vc[kPipes];
    LocalShadow shadow[6];
    std::set<std::tuple<std::string, uint32_t, uint32_t>> executed;
};

thread_local Unit* t_unit = nullptr;
std::mutex g_dropMutex;
std::set<std::pair<std::string, int>> g_dropped;  // sync sites switched off: basename, line
bool g_envRead = false;

const char* kUnitNames[] = {"AIC", "AIV0", "AIV1"};

std::string AgentName(uint32_t agent)
{
    const uint32_t unit = agent / kPipes;
    return "core " + std::to_string(unit / kUnitsPerCore) + " " + kUnitNames[unit % kUnitsPerCore] +
           " " + PipeName(static_cast<int>(agent % kPipes));
}

std::string SiteText(uint32_t id)
{
    const Site s = SiteOf(id);
    return std::string(s.file) + ":" + std::to_string(s.line);
}

[[noreturn]] void Race(const Site& here, int pipe, bool write, const std::string& where,
                       uint32_t otherAgent, bool otherWrite, uint32_t otherSite)
{
    Fail(here, "[R39] ", "race: ", PipeName(pipe), write ? " write" : " read", " of ", where, " (",
         AgentName(t_unit->base + static_cast<uint32_t>(pipe)), ") conflicts with the ",
         PipeName(static_cast<int>(otherAgent % kPipes)), otherWrite ? " write" : " read", " at ",
         SiteText(otherSite), " (", AgentName(otherAgent),
         "): no happens-before edge orders them (a missing PipeBarrier, SetFlag/WaitFlag, queue "
         "hand-off, cross-core flag or SyncAll)");
}

std::string LocalWhere(Memory memory, uint64_t first, uint64_t last)
{
    std::ostringstream out;
    out << MemoryName(memory) << " bytes [" << first << ", " << last << ")";
    if (const Pipe* pipe = Core().pipe) {
        out << pipe->Owner(memory, static_cast<uint32_t>(first));
    }
    return out.str();
}

}  // namespace

const char* PipeName(int pipe)
{
    static const char* kNames[] = {"PIPE_S", "PIPE_V", "PIPE_M", "PIPE_MTE1", "PIPE_MTE2",
                                   "PIPE_MTE3", "PIPE_ALL", "PIPE_FIX"};
    return pipe >= 0 && pipe < kPipes ? kNames[pipe] : "?";
}

bool RaceDetectorOn()
{
    static const bool on = [] {
        const char* value = std::getenv("FLASH_CANN_TWIN_RACE_CHECK");
        return value == nullptr || std::string(value) != "0";
    }();
    return on;
}

void Join(Clock& into, const Clock& from)
{
    into.stamp = Later(into.stamp, from.stamp);
    if (into.size() < from.size()) {
        into.resize(from.size(), 0);
    }
    for (size_t i = 0; i < from.size(); ++i) {
        into[i] = std::max(into[i], from[i]);
    }
}

Instruction::Instruction(int pipe, const Site& site, const Work& work)
    : pipe_(pipe), clock_(0), siteId_(0), site_(site)
{
    Issue(pipe, work, site);
    Unit* unit = t_unit;
    if (unit == nullptr) {
        return;
    }
    if (pipe == kPipeS) {  // the hardware orders the scalar pipe (PipeBarrier docs)
        unit->vc[kPipeS][unit->base + kPipeS] = unit->issued[kPipeS];
    }
    clock_ = ++unit->issued[pipe];
    siteId_ = Intern(site);
}

void Instruction::Rows(Memory memory, const void* begin, uint64_t rows, uint64_t rowBytes,
                       uint64_t pitch, bool write) const
{
    if (rows == 0 || rowBytes == 0) {
        return;
    }
    if (pitch == rowBytes) {
        Touch(memory, begin, rows * rowBytes, write);
        return;
    }
    for (uint64_t r = 0; r < rows; ++r) {
        Touch(memory, static_cast<const uint8_t*>(begin) + r * pitch, rowBytes, write);
    }
}

void Instruction::Touch(Memory memory, const void* begin, uint64_t bytes, bool write) const
{
    Unit* unit = t_unit;
    if (unit == nullptr || clock_ == 0 || bytes == 0) {
        return;
    }
    const Clock& vc = unit->vc[pipe_];
    const uint32_t me = unit->base + static_cast<uint32_t>(pipe_);
    const Site& here = site_;
    auto ordered = [&](uint32_t agent, uint32_t clock) {
        return clock <= vc[agent] || (agent == me && clock == clock_);
    };
    if (memory != Memory::GM) {
        const uint64_t offset = static_cast<const uint8_t*>(begin) - Core().memories->Base(memory);
        LocalShadow& shadow = unit->shadow[static_cast<int>(memory)];
        if (shadow.cells == nullptr) {
            shadow.cells = static_cast<Cell*>(std::calloc(MemoryBytes(memory) / kGranule, sizeof(Cell)));
        }
        const uint64_t g0 = offset / kGranule, g1 = (offset + bytes + kGranule - 1) / kGranule;
        for (uint64_t g = g0; g < g1; ++g) {
            Cell& c = shadow.cells[g];
            if (c.wClock != 0 && !ordered(unit->base + c.wPipe, c.wClock)) {
                Race(here, pipe_, write, LocalWhere(memory, g * kGranule, (g + 1) * kGranule),
                     unit->base + c.wPipe, true, c.wSite);
            }
            if (write) {
                for (int q = 0; c.readMask != 0 && q < kPipes; ++q) {
                    if ((c.readMask >> q & 1) && !ordered(unit->base + q, c.rClock[q])) {
                        Race(here, pipe_, true, LocalWhere(memory, g * kGranule, (g + 1) * kGranule),
                             unit->base + q, false, c.rSite[q]);
                    }
                }
                c.wClock = clock_;
                c.wSite = siteId_;
                c.wPipe = static_cast<uint8_t>(pipe_);
                c.readMask = 0;
            } else {
                c.rClock[pipe_] = clock_;
                c.rSite[pipe_] = siteId_;
                c.readMask |= static_cast<uint8_t>(1u << pipe_);
            }
        }
        return;
    }
    const auto* b = static_cast<const uint8_t*>(begin);
    GmShadow* shadow = nullptr;
    for (const auto& region : unit->launch->gm) {
        if (b >= region->begin && b + bytes <= region->begin + region->bytes) {
            shadow = region.get();
        }
    }
    if (shadow == nullptr) {
        return;  // GM the launch does not check (read-only inputs)
    }
    const bool atomic = write && Core().atomicAddFloat;
    const uint64_t first = static_cast<uint64_t>(b - shadow->begin), last = first + bytes;
    std::lock_guard<std::mutex> lock(shadow->mutex);
    auto& cells = shadow->cells;
    auto split = [&cells](uint64_t at) {
        auto it = cells.lower_bound(at);
        if (it != cells.end() && it->first == at) {
            return it;
        }
        return cells.emplace_hint(it, at, std::prev(it)->second);
    };
    const auto from = split(first);
    const auto to = split(last);
    auto where = [&](const std::map<uint64_t, GmCell>::iterator& it) {
        std::ostringstream out;
        out << "GM '" << shadow->name << "' bytes [" << it->first << ", "
            << std::next(it)->first << ")";
        return out.str();
    };
    for (auto it = from; it != to; ++it) {
        for (const Epoch& w : it->second.writes) {
            if (ordered(w.agent, w.clock)) {
                continue;
            }
            if (!(atomic && w.atomic)) {
                Race(here, pipe_, write, where(it), w.agent, true, w.site);
            }
            // One agent's adds land in issue order; two agents' in whatever order they
            // arrive.
            shadow->unorderedAtomicAdds |= w.agent != me;
        }
        for (size_t i = 0; write && i < it->second.reads.size(); ++i) {
            const Epoch& r = it->second.reads[i];
            if (!ordered(r.agent, r.clock)) {
                Race(here, pipe_, true, where(it), r.agent, false, r.site);
            }
        }
    }
    const Epoch mine{me, clock_, siteId_, atomic};
    if (write && !atomic) {
        cells.erase(std::next(from), to);
        from->second = GmCell{{mine}, {}};
        return;
    }
    for (auto it = from; it != to; ++it) {
        std::vector<Epoch>& list = write ? it->second.writes : it->second.reads;
        // Drop what this access subsumes: the same agent's earlier entries and reads
        // ordered before it (a later access ordered after this one is ordered after
        // them). A plain write stays until the next plain write: a concurrent atomic
        // add must still be ordered after it.
        list.erase(std::remove_if(list.begin(), list.end(),
                                  [&](const Epoch& e) {
                                      return e.agent == me ||
                                             ((!write || e.atomic) && ordered(e.agent, e.clock));
                                  }),
                   list.end());
        list.push_back(mine);
    }
}

Clock Completed(int pipe)
{
    Clock clock;
    if (Unit* unit = t_unit) {
        clock.assign(unit->vc[pipe].begin(), unit->vc[pipe].end());
        clock[unit->base + pipe] = unit->issued[pipe];
    }
    clock.stamp = CompletedAt(pipe);
    return clock;
}

Clock CompletedAll()
{
    Clock all;
    for (int p = 0; p < kPipes; ++p) {
        Join(all, Completed(p));
    }
    return all;
}

void Acquire(int pipe, const Clock& clock)
{
    if (t_unit != nullptr) {
        Join(t_unit->vc[pipe], clock);
    }
    WaitPipe(pipe, clock.stamp);
}

void AcquireAll(const Clock& clock)
{
    for (int p = 0; p < kPipes && t_unit != nullptr; ++p) {
        Join(t_unit->vc[p], clock);
    }
    WaitUnit(clock.stamp);
}

void Barrier(int pipe)
{
    if (pipe == kPipeAll) {
        AcquireAll(CompletedAll());
        return;
    }
    if (Unit* unit = t_unit) {
        unit->vc[pipe][unit->base + pipe] = unit->issued[pipe];
    }
    WaitPipe(pipe, CompletedAt(pipe));
}

void InterlockM()
{
    Barrier(kPipeM);
}

bool SyncEdge(const char* kind, const Site& site, const Site* queue)
{
    Unit* unit = t_unit;
    if (unit == nullptr) {
        return true;
    }
    unit->executed.emplace(kind, Intern(site), queue != nullptr ? Intern(*queue) : 0);
    std::lock_guard<std::mutex> lock(g_dropMutex);
    return g_dropped.empty() || g_dropped.count({Basename(site.file), site.line}) == 0;
}

void DropSyncSite(const std::string& sites)
{
    std::lock_guard<std::mutex> lock(g_dropMutex);
    g_envRead = true;  // an explicit choice overrides the environment
    g_dropped.clear();
    size_t start = 0;
    while (start < sites.size()) {
        size_t end = sites.find(',', start);
        end = end == std::string::npos ? sites.size() : end;
        const std::string one = sites.substr(start, end - start);
        const size_t colon = one.rfind(':');
        if (colon != std::string::npos) {
            g_dropped.emplace(Basename(one.substr(0, colon).c_str()), std::atoi(one.c_str() + colon + 1));
        }
        start = end + 1;
    }
}

namespace {
std::vector<std::string> g_lastExecuted;
}

std::vector<std::string> ExecutedSyncSites()
{
    return g_lastExecuted;
}

RaceLaunch* BeginRaceLaunch(const LaunchConfig& config)
{
    {
        std::unique_lock<std::mutex> lock(g_dropMutex);
        if (!g_envRead) {
            g_envRead = true;
            lock.unlock();
            if (const char* drop = std::getenv("FLASH_CANN_TWIN_DROP_SYNC")) {
                DropSyncSite(drop);
            }
        }
    }
    if (!RaceDetectorOn()) {
        return nullptr;
    }
    auto* launch = new RaceLaunch;
    launch->agents = config.blockDim * kUnitsPerCore * kPipes;
    for (const GmRegion& region : config.gm) {
        if (!region.checkRaces) {
            continue;
        }
        auto shadow = std::make_unique<GmShadow>();
        shadow->begin = static_cast<const uint8_t*>(region.begin);
        shadow->bytes = region.bytes;
        shadow->name = region.name;
        shadow->cells[0] = GmCell{};
        shadow->cells[region.bytes] = GmCell{};  // the end sentinel
        launch->gm.push_back(std::move(shadow));
    }
    return launch;
}

std::vector<std::string> EndRaceLaunch(RaceLaunch* launch)
{
    if (launch == nullptr) {
        return {};
    }
    std::vector<std::string> unordered;
    for (const auto& shadow : launch->gm) {
        if (shadow->unorderedAtomicAdds) {
            unordered.push_back(shadow->name);
        }
    }
    g_lastExecuted.clear();
    auto text = [](uint32_t id) {
        const Site s = SiteOf(id);
        return Basename(s.file) + ":" + std::to_string(s.line);
    };
    for (const auto& [kind, id, queue] : launch->executed) {
        g_lastExecuted.push_back(kind + " " + text(id) + (queue != 0 ? " queue " + text(queue) : ""));
    }
    std::sort(g_lastExecuted.begin(), g_lastExecuted.end());
    g_lastExecuted.erase(std::unique(g_lastExecuted.begin(), g_lastExecuted.end()),
                         g_lastExecuted.end());
    delete launch;
    return unordered;
}

void BeginRaceThread(RaceLaunch* launch, uint32_t core, int role)
{
    if (launch == nullptr) {
        t_unit = nullptr;
        return;
    }
    auto* unit = new Unit;
    unit->launch = launch;
    unit->base = (core * kUnitsPerCore + static_cast<uint32_t>(role)) * kPipes;
    for (Clock& clock : unit->vc) {
        clock.assign(launch->agents, 0);
    }
    t_unit = unit;
}

void EndRaceThread(RaceLaunch* launch)
{
    Unit* unit = t_unit;
    t_unit = nullptr;
    if (unit == nullptr) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(launch->mutex);
        launch->executed.insert(unit->executed.begin(), unit->executed.end());
    }
    delete unit;
}

}  // namespace twin
