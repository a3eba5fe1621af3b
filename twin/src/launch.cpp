// Launching a kernel on the twin: every AI core's cube (AIC) and two vector (AIV) threads
// run at once; core identity, the GM registry, cross-core flags, SyncAll and the
// deadlock detector.
//
// Blocking waits (CrossCoreWaitFlag, SyncAll) all go through one launch-wide mutex, so
// the detector is exact: when every thread of the launch that has not finished is in a
// wait whose condition is false, no thread can ever change that, and the launch stops
// with every wait and its kernel site. A long timeout remains only as a backstop.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "kernel_operator.h"
#include "twin/launch.h"
#include "twin/race.h"
#include "twin/timing.h"

namespace twin {
namespace {

thread_local CoreState g_core;
std::mutex g_launchMutex;  // launches are serialised
std::chrono::milliseconds g_backstopTimeout{120000};

constexpr int kMaxPendingFlag = 15;
// CrossCoreSetFlag ids 0-10 are the kernel's; SyncAll's hardware implementation uses
// 11-14 (asc-devkit docs, SyncAll / CrossCoreWaitFlag: "flagId 0-10").
constexpr uint16_t kMaxUserFlag = 10;

// Cross-core flags of one AI core: AIC -> each AIV, and each AIV -> AIC; with each
// pending set, the work it releases (race detector).
struct FlagGroup {
    std::condition_variable changed;
    int toAiv[2][16] = {};
    int toAic[2][16] = {};
    std::deque<Clock> toAivWork[2][16], toAicWork[2][16];
};

struct AllCoreBarrier {
    int participants = 0;
    int arrived = 0;
    uint64_t generation = 0;
    Clock arrivedWork;   // joined from every unit that arrived
    Clock released[2];   // per generation parity, once all have arrived
};

// A thread blocked in a wait.
struct Waiter {
    std::function<bool()> ready;
    std::string what;  // "AIV 0.1: CrossCoreWaitFlag(3)"
    Site site;
};

// What the threads of one launch share. Guarded by `mutex` except `abort`.
struct Run {
    explicit Run(const LaunchConfig& c) : config(c), groups(new FlagGroup[c.blockDim]) {}
    const LaunchConfig& config;
    std::mutex mutex;
    std::atomic<bool> abort{false};
    std::string firstError;
    int live = 0;  // threads that have not finished
    std::vector<Waiter*> waiting;
    std::unique_ptr<FlagGroup[]> groups;
    AllCoreBarrier all, aivs;
    std::condition_variable barrierChanged;
    uint64_t peakBytes[2][6] = {};  // [AIC, AIV][Memory]
    RaceLaunch* race = nullptr;
    TimingLaunch* timing = nullptr;
};

Run* g_run = nullptr;

std::string Who()
{
    std::ostringstream out;
    if (g_core.type == CoreType::AIC) {
        out << "AIC " << g_core.blockIdx;
    } else {
        out << "AIV " << g_core.blockIdx / 2 << "." << g_core.subBlockIdx;
    }
    return out.str();
}

FlagGroup& Group()
{
    const int64_t core = g_core.type == CoreType::AIV ? g_core.blockIdx / 2 : g_core.blockIdx;
    return g_run->groups[static_cast<size_t>(core)];
}

void RequireMix(const Site& site, const char* what)
{
    Require(g_core.mixDeclared, site, "[R31] ", what, " needs a MIX kernel: declare "
            "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)");
}

void WakeAll(Run& run)
{
    for (uint32_t i = 0; i < run.config.blockDim; ++i) {
        run.groups[i].changed.notify_all();
    }
    run.barrierChanged.notify_all();
}

// Called with run.mutex held.
void RecordLocked(Run& run, const std::string& message)
{
    if (run.firstError.empty()) {
        run.firstError = message;
    }
    run.abort = true;
    WakeAll(run);
}

// Every thread that has not finished waits, and no wait can complete.
bool Deadlocked(const Run& run)
{
    if (run.waiting.empty() || static_cast<int>(run.waiting.size()) != run.live) {
        return false;
    }
    for (const Waiter* w : run.waiting) {
        if (w->ready()) {
            return false;
        }
    }
    return true;
}

std::string DeadlockReport(const Run& run)
{
    std::ostringstream out;
    const Waiter& first = *run.waiting.front();
    out << first.site.file << ":" << first.site.line
        << ": deadlock: every core of the launch that has not finished is waiting, and no "
           "wait can complete:";
    for (const Waiter* w : run.waiting) {
        out << " [" << w->what << " at " << w->site.file << ":" << w->site.line << "]";
    }
    return out.str();
}

// Blocks until ready() (evaluated under run.mutex); reports a deadlock or aborts.
void BlockUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& changed,
                const std::function<bool()>& ready, const std::string& what, const Site& site)
{
    Run& run = *g_run;
    if (ready()) {
        return;
    }
    Waiter self{ready, Who() + ": " + what, site};
    run.waiting.push_back(&self);
    struct Leave {
        Run& run;
        Waiter* self;
        ~Leave()
        {
            run.waiting.erase(std::find(run.waiting.begin(), run.waiting.end(), self));
        }
    } leave{run, &self};
    const auto deadline = std::chrono::steady_clock::now() + g_backstopTimeout;
    while (!ready()) {
        if (run.abort) {
            throw Violation("aborted: another core failed");
        }
        if (Deadlocked(run)) {
            const std::string report = DeadlockReport(run);
            RecordLocked(run, report);
            throw Violation(report);
        }
        if (changed.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
            Fail(site, "[R32] ", what, ": still waiting after ", g_backstopTimeout.count(),
                 " ms (backstop timeout)");
        }
    }
}

void ThreadFinished(Run& run)
{
    std::lock_guard<std::mutex> lock(run.mutex);
    --run.live;
    const int type = g_core.type == CoreType::AIC ? 0 : 1;
    for (int m = 0; m < 6; ++m) {
        run.peakBytes[type][m] = std::max(run.peakBytes[type][m], g_core.peakBytes[m]);
    }
    if (Deadlocked(run)) {
        RecordLocked(run, DeadlockReport(run));
    }
}

void RunThread(Run& run, const std::function<void()>& kernel, uint32_t core, int role)
{
    LocalMemories memories;
    CoreState& state = g_core;
    state = CoreState{};
    state.memories = &memories;
    state.blockNum = run.config.blockDim;
    if (role == 0) {
        state.type = CoreType::AIC;
        state.blockIdx = core;
        for (Memory m : {Memory::L1, Memory::L0A, Memory::L0B, Memory::L0C}) {
            memories.Bytes(m).assign(MemoryBytes(m), 0xFF);
        }
    } else {
        state.type = CoreType::AIV;
        state.subBlockIdx = role - 1;
        state.blockIdx = 2 * int64_t{core} + state.subBlockIdx;
        memories.ub.assign(MemoryBytes(Memory::UB), 0xFF);
    }
    BeginRaceThread(run.race, core, role);
    BeginTimingThread(run.timing, core, role);
    std::string error;
    try {
        kernel();
        error = state.pending;
        Require(!error.empty() || state.intSaturation < 0 || state.intSaturation == kIntSaturationAtEntry,
                state.intSaturationSite, "[R99] ", "the kernel exits with CTRL's integer saturation "
                "bit (SetSaturationFlag<SaturationMode::INT>) not as it found it (",
                int{kIntSaturationAtEntry}, ", now ", int{state.intSaturation}, "): restore the value "
                "GetSaturationFlag read");
    } catch (const Violation& v) {
        if (std::string(v.what()).rfind("aborted", 0) != 0) {
            error = v.what();
        }
    } catch (const std::exception& e) {
        error = std::string("unexpected exception: ") + e.what();
    }
    if (!error.empty()) {
        std::lock_guard<std::mutex> lock(run.mutex);
        RecordLocked(run, error);
    }
    EndTimingThread(run.timing);
    EndRaceThread(run.race);
    ThreadFinished(run);
}

}  // namespace

std::vector<uint8_t>& LocalMemories::Bytes(Memory memory)
{
    switch (memory) {
        case Memory::L1: return l1;
        case Memory::L0A: return l0a;
        case Memory::L0B: return l0b;
        case Memory::L0C: return l0c;
        default: return ub;
    }
}

CoreState& Core()
{
    return g_core;
}

uint64_t TilingKey()
{
    return g_run->config.tilingKey;
}

void CheckGm(const void* begin, size_t bytes, const Site& site, const char* what)
{
    const auto* b = static_cast<const uint8_t*>(begin);
    for (const GmRegion& region : g_run->config.gm) {
        const auto* r = static_cast<const uint8_t*>(region.begin);
        if (b >= r && b + bytes <= r + region.bytes) {
            return;
        }
    }
    Fail(site, "[R33] ", what, ": GM access of ", bytes, " bytes at ", begin,
         " lies outside every tensor handed to the kernel");
}

void CrossCoreSet(uint16_t flag, int pipe, const Site& site)
{
    RequireMix(site, "CrossCoreSetFlag");
    Require(flag <= kMaxUserFlag, site, "[R34] ", "CrossCoreSetFlag: flag id ", flag,
            " outside [0, 10] (11-14 belong to SyncAll)");
    Clock work = SyncEdge("CrossCoreSetFlag", site) ? Completed(pipe) : Clock{};
    work.stamp = AfterFlag(work.stamp);
    Run& run = *g_run;
    std::lock_guard<std::mutex> lock(run.mutex);
    FlagGroup& group = Group();
    if (g_core.type == CoreType::AIC) {
        for (int sub = 0; sub < 2; ++sub) {
            Require(group.toAiv[sub][flag] < kMaxPendingFlag, site, "[R35] ", "CrossCoreSetFlag(", flag,
                    "): more than 15 sets not yet waited on");
            ++group.toAiv[sub][flag];
            group.toAivWork[sub][flag].push_back(work);
        }
    } else {
        int& pending = group.toAic[g_core.subBlockIdx][flag];
        Require(pending < kMaxPendingFlag, site, "[R36] ", "CrossCoreSetFlag(", flag,
                "): more than 15 sets not yet waited on");
        ++pending;
        group.toAicWork[g_core.subBlockIdx][flag].push_back(work);
    }
    group.changed.notify_all();
}

void CrossCoreWait(uint16_t flag, const Site& site)
{
    RequireMix(site, "CrossCoreWaitFlag");
    Require(flag <= kMaxUserFlag, site, "[R37] ", "CrossCoreWaitFlag: flag id ", flag,
            " outside [0, 10] (11-14 belong to SyncAll)");
    Run& run = *g_run;
    std::unique_lock<std::mutex> lock(run.mutex);
    FlagGroup& group = Group();
    const CoreType type = g_core.type;
    const int64_t sub = g_core.subBlockIdx;
    auto ready = [&group, flag, type, sub] {
        if (type == CoreType::AIC) {  // mode 2: both vector cores must have set it
            return group.toAic[0][flag] > 0 && group.toAic[1][flag] > 0;
        }
        return group.toAiv[sub][flag] > 0;
    };
    BlockUntil(lock, group.changed, ready, "CrossCoreWaitFlag(" + std::to_string(flag) + ")",
               site);
    // The wait blocks every later instruction of this unit (CrossCoreWaitFlag docs).
    const bool edge = SyncEdge("CrossCoreWaitFlag", site);
    auto take = [edge](int& count, std::deque<Clock>& work) {
        --count;
        if (edge) {
            AcquireAll(work.front());
        }
        work.pop_front();
    };
    if (type == CoreType::AIC) {
        take(group.toAic[0][flag], group.toAicWork[0][flag]);
        take(group.toAic[1][flag], group.toAicWork[1][flag]);
    } else {
        take(group.toAiv[sub][flag], group.toAivWork[sub][flag]);
    }
}

void SyncAllCores(bool aivOnly, const Site& site)
{
    RequireMix(site, "SyncAll (the hardware barrier)");
    Require(!aivOnly || g_core.type == CoreType::AIV, site, "[R38] ",
            "SyncAll<true> synchronises the vector cores only: the cube core would hang in it; "
            "a MIX kernel calls SyncAll<false>()");
    Run& run = *g_run;
    // asc-devkit SyncAll: a hard SyncAll may deadlock under concurrent streams unless the
    // tiling set batch mode (some blocks resident, the others held by another stream's
    // kernel), and the launch's blocks must not outnumber the cores running it.
    Require(run.config.scheduleMode == 1, site, "[R97] ", "SyncAll in a launch whose tiling did not "
            "set batch schedule mode (SetScheduleMode(1); got ", run.config.scheduleMode, "): "
            "under concurrent streams some blocks may wait for blocks that never start");
    Require(run.config.aiCores == 0 || run.config.blockDim <= run.config.aiCores, site, "[R98] ",
            "SyncAll in a launch of ", run.config.blockDim, " blocks on ", run.config.aiCores,
            " AI cores: the runtime runs the blocks in rounds and the first round waits for the "
            "next forever (blockDim must be <= the AI cores)");
    std::unique_lock<std::mutex> lock(run.mutex);
    const bool edge = SyncEdge("SyncAll", site);
    AllCoreBarrier& barrier = aivOnly ? run.aivs : run.all;
    const uint64_t generation = barrier.generation;
    if (edge) {
        Join(barrier.arrivedWork, CompletedAll());
    }
    if (++barrier.arrived == barrier.participants) {
        barrier.arrived = 0;
        barrier.released[generation % 2] = std::move(barrier.arrivedWork);
        barrier.released[generation % 2].stamp = AfterSyncAll(barrier.released[generation % 2].stamp);
        barrier.arrivedWork = Clock{};
        ++barrier.generation;
        run.barrierChanged.notify_all();
    } else {
        BlockUntil(lock, run.barrierChanged,
                   [&barrier, generation] { return barrier.generation != generation; },
                   aivOnly ? "SyncAll<true>" : "SyncAll<false>", site);
    }
    if (edge) {
        AcquireAll(barrier.released[generation % 2]);
    }
}

void AtomicAddFloat(float* to, float value)
{
    static_assert(sizeof(float) == sizeof(uint32_t), "fp32");
    auto* word = reinterpret_cast<uint32_t*>(to);
    uint32_t expected = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        float current;
        std::memcpy(&current, &expected, sizeof(current));
        const float sum = current + value;
        uint32_t desired;
        std::memcpy(&desired, &sum, sizeof(desired));
        if (__atomic_compare_exchange_n(word, &expected, desired, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            return;
        }
    }
}

void SetDeadlockTimeout(std::chrono::milliseconds timeout)
{
    g_backstopTimeout = timeout;
}

uint64_t LaunchReport::PeakBytes(CoreType type, Memory memory) const
{
    return peakBytes[type == CoreType::AIC ? 0 : 1][static_cast<int>(memory)];
}

std::string Launch(const LaunchConfig& config, const std::function<void()>& kernel,
                   LaunchReport* report)
{
    std::lock_guard<std::mutex> launchLock(g_launchMutex);
    Run run(config);
    run.live = 3 * static_cast<int>(config.blockDim);
    run.all.participants = run.live;
    run.aivs.participants = 2 * static_cast<int>(config.blockDim);
    run.timing = BeginTimingLaunch(config.blockDim);
    run.race = SkipsArithmetic(run.timing) ? nullptr : BeginRaceLaunch(config);
    g_run = &run;
    std::vector<std::thread> threads;
    for (uint32_t core = 0; core < config.blockDim; ++core) {
        for (int role = 0; role < 3; ++role) {  // AIC, AIV0, AIV1
            threads.emplace_back(RunThread, std::ref(run), std::cref(kernel), core, role);
        }
    }
    for (std::thread& t : threads) {
        t.join();
    }
    g_run = nullptr;
    std::vector<std::string> unorderedAtomicAdds = EndRaceLaunch(run.race);
    std::string timing = EndTimingLaunch(run.timing);
    if (report != nullptr) {
        std::memcpy(report->peakBytes, run.peakBytes, sizeof(run.peakBytes));
        report->unorderedAtomicAdds = std::move(unorderedAtomicAdds);
        report->timing = std::move(timing);
    }
    return run.firstError;
}

}  // namespace twin
