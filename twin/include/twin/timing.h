// The twin's timing mode: a cycle-approximate timeline of the kernel as it runs.
//
// Off by default; when off, nothing here is consulted and nothing the twin computes or
// reports changes. When on (SetTiming before a launch), every instruction the kernel
// issues (twin::Instruction, with the Work it carries) is charged on its pipe from a cost
// table (twin/timing/costs.json, one entry per SoC, every figure with its source):
//
// - each unit (an AI core's AIC, AIV0, AIV1) has a scalar issue point (`cursor`) and,
//   per pipe, when the pipe is free for its next instruction and when everything issued
//   to it has finished; an instruction is dispatched at the cursor (which then advances
//   by the dispatch cost), starts when its pipe is free and its waits allow, occupies the
//   pipe for issue + amount / throughput cycles and finishes a latency later (a later
//   instruction of the same pipe may start before the earlier one has finished, as the
//   race detector's ordering model allows: only a PipeBarrier or an event waits for it);
// - the dependencies are the race detector's happens-before edges (twin/race.h): every
//   Clock an edge carries also carries the Stamp of the work it releases, so SetFlag/
//   WaitFlag, PipeBarrier, queue hand-offs, cross-core flags and SyncAll order the
//   timeline exactly as they order the detector's accesses. A wait on one pipe delays
//   that pipe; a wait that blocks the unit (WaitFlag on PIPE_S, CrossCoreWaitFlag,
//   SyncAll, PipeBarrier<PIPE_ALL>) moves the cursor. A cross-core flag adds its latency,
//   SyncAll its own;
// - GM transfers of the cores running at once share one L2 bandwidth: each core gets the
//   total divided by the launch's cores, and a transfer runs at the lower of that share
//   and its engine's rate (a simple model: it ignores that cores do not all move data at
//   the same moment).
//
// Each Stamp also carries its critical path: the cycles of the chain of instructions and
// latencies that made it as late as it is, per pipe. The launch's last Stamp gives the
// critical path summary of the report.
#ifndef FLASH_CANN_TWIN_TIMING_H
#define FLASH_CANN_TWIN_TIMING_H

#include <cstdint>
#include <string>
#include <vector>

#include "core.h"

namespace twin {

// The later of two stamps (its critical path with it).
const Stamp& Later(const Stamp& a, const Stamp& b);

// Vector instructions by cost class (the cost table's "vector" entries).
enum class VecClass : uint8_t {
    kScalarArith, kBinary, kExp, kLn, kDiv, kBlockReduce, kWholeReduce, kBroadcast, kCast,
    kDuplicate, kCompare, kSelect, kCount
};
// The data paths of the transfer instructions (the cost table's rates).
enum class Route : uint8_t { kGmToL1, kGmToUb, kUbToGm, kL1ToL0a, kL1ToL0b, kL0cToGm, kL1Fill, kCount };

// What one instruction does, in the units its cost is counted in.
struct Work {
    enum Kind : uint8_t { kNone, kTransfer, kCube, kVector, kScalarLocal, kScalarGm } kind = kNone;
    uint8_t what = 0;     // Route or VecClass
    uint64_t amount = 0;  // bytes, 16x16x16 fractal products, or 256-byte repeats

    static Work Transfer(Route route, uint64_t bytes) { return {kTransfer, static_cast<uint8_t>(route), bytes}; }
    static Work Cube(uint64_t fractalProducts) { return {kCube, 0, fractalProducts}; }
    static Work Vector(VecClass op, uint64_t repeats) { return {kVector, static_cast<uint8_t>(op), repeats}; }
    static Work Scalar(bool gm) { return {gm ? kScalarGm : kScalarLocal, 0, 1}; }
};

// 256-byte repeats of `bytes` of vector operand (a partial repeat costs a whole one).
inline uint64_t RepeatsOf(uint64_t bytes)
{
    return (bytes + 255) / 256;
}

// The cost table, in cycles of the SoC's clock (names: CostNames(); values from
// twin/timing/costs.json through the C ABI).
struct TimingCosts {
    double clockGhz = 1;
    double dispatchCycles = 0;                     // scalar issue of one instruction
    double issueCycles[kTimedPipes] = {};          // per instruction, on its pipe
    double bytesPerCycle[static_cast<int>(Route::kCount)] = {};
    double latencyCycles[static_cast<int>(Route::kCount)] = {};
    double cubeFractalCycles = 1;                  // one 16x16x16 product
    double vectorCycles[static_cast<int>(VecClass::kCount)] = {};  // per repeat
    double vectorHead[static_cast<int>(VecClass::kCount)] = {};    // first repeat's latency
    double scalarLocalCycles = 0, scalarGmCycles = 0;
    double l2BytesPerCycle = 0;                    // all AI cores of the SoC together
    double crossCoreFlagCycles = 0, syncAllCycles = 0, launchCycles = 0;
};
// The names of the table's figures, in the order SetTimingCosts takes their values.
std::vector<std::string> CostNames();
// Fills `costs` from values in CostNames() order; false if `count` is not their number.
bool SetTimingCosts(TimingCosts& costs, const double* values, size_t count);

// Switches timing on for the following launches (nullptr: off). `traceCore`: the AI core
// whose every instruction the trace records (-1: none). `skipArithmetic`: the API calls
// skip their arithmetic (the instruction stream does not depend on values; the race
// detector is off for such launches), for long shapes. `shareCores`: the cores the L2
// bandwidth is shared by (0: the launch's), so that a launch on fewer cores can stand in
// for one core's share of a launch on all of them.
void SetTiming(const TimingCosts* costs, int traceCore, bool skipArithmetic, uint32_t shareCores = 0);
bool TimingOn();
// The API calls compute their results (false only in a timing-only launch).
bool Computing();

// The calling unit's timeline (launch.cpp's threads, race.cpp's edges, Instruction).
void Issue(int pipe, const Work& work, const Site& site);
Stamp CompletedAt(int pipe);           // when `pipe`'s work so far has finished
void WaitPipe(int pipe, const Stamp& stamp);  // `pipe`'s next instructions start after it
void WaitUnit(const Stamp& stamp);     // the unit issues nothing before it
Stamp AfterFlag(const Stamp& stamp);   // a cross-core flag's latency on top
Stamp AfterSyncAll(const Stamp& stamp);

// Launch plumbing (launch.cpp).
struct TimingLaunch;
TimingLaunch* BeginTimingLaunch(uint32_t blockDim);
bool SkipsArithmetic(const TimingLaunch* launch);  // the race detector stays off then
void BeginTimingThread(TimingLaunch* launch, uint32_t core, int role);
void EndTimingThread(TimingLaunch* launch);
// The launch's report as JSON (docs/twin.md, "Timing mode"); "" when timing was off.
std::string EndTimingLaunch(TimingLaunch* launch);
// The last timed launch's report, and the Chrome-trace JSON of its traced core's
// instructions ("traceEvents", microseconds; one thread per unit and pipe).
std::string LastReport();
std::string LastTrace();

}  // namespace twin

#endif
