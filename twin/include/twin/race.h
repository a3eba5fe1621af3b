// The twin's race detector.
//
// Agents are the pipes of every unit of the launch: (AI core, AIC | AIV0 | AIV1, pipe).
// Each agent has a vector clock. Every API call is one instruction on one pipe (see the
// pipe of each call in cube.h, vector.h, tensor.h); its reads and writes of local memory
// (32-byte granules) and of the GM the launch asks to check (byte ranges) are compared
// with the last write and the reads since: an access that conflicts with one it is not
// ordered after (write/write, write/read; two atomic adds do not conflict) stops the
// launch with "race", both kernel call sites, their pipes, the memory and the bytes.
// Atomic adds into one element from different agents with no happens-before edge between
// them are no race, but the hardware fixes no order among them, so an fp32 sum of them
// may differ from run to run: the launch reports the checked GM tensors where that
// happened (LaunchReport::unorderedAtomicAdds), the structural check of a deterministic
// kernel variant.
//
// The ordering model (docs/twin.md, "The race detector"):
// - a pipe issues its instructions in order, but a later one may overlap an earlier one:
//   a dependency within one pipe needs PipeBarrier<pipe> (asc-devkit docs, PipeBarrier:
//   "same-pipe instructions with a data dependency need this barrier"); exceptions the
//   hardware interlocks: the scalar pipe (PipeBarrier docs: scalar ordering is guaranteed
//   by hardware) and accumulating Mmads into one L0C with (m/16)*(n/16) >= 10 (Mmad docs,
//   "sync optimisation");
// - SetFlag<SRC_DST>/WaitFlag: the src pipe's completed work happens before what the dst
//   pipe issues after the wait; PipeBarrier<PIPE_ALL>: every pipe of the unit;
// - TQue EnQue -> DeQue and FreeTensor -> the buffer's next AllocTensor carry the events
//   Ascend C inserts for the queue's position (asc-devkit impl/basic_api/kernel_event.h,
//   GetQueEvt);
// - CrossCoreSetFlag<mode, pipe> releases that pipe's completed work; CrossCoreWaitFlag
//   blocks everything the waiting unit issues after it; SyncAll orders everything before
//   it on every unit before everything after it.
#ifndef FLASH_CANN_TWIN_RACE_H
#define FLASH_CANN_TWIN_RACE_H

#include <cstdint>
#include <string>
#include <vector>

#include "core.h"
#include "timing.h"

namespace twin {

// The values of pipe_t (sync.h).
enum PipeId : int { kPipeS = 0, kPipeV, kPipeM, kPipeMte1, kPipeMte2, kPipeMte3, kPipeAll, kPipeFix };
constexpr int kPipes = 8;
const char* PipeName(int pipe);


// One instruction on `pipe`, issued now: check and record what it touches. Reads first,
// then writes (an instruction never conflicts with itself). `work`: what the timing mode
// charges for it (twin/timing.h).
class Instruction {
public:
    Instruction(int pipe, const Site& site, const Work& work);
    void Read(Memory memory, const void* begin, uint64_t bytes) const { Touch(memory, begin, bytes, false); }
    void Write(Memory memory, const void* begin, uint64_t bytes) const { Touch(memory, begin, bytes, true); }
    // `rows` ranges of `rowBytes`, `pitch` bytes apart.
    void Rows(Memory memory, const void* begin, uint64_t rows, uint64_t rowBytes, uint64_t pitch,
              bool write) const;
    int pipe() const { return pipe_; }

private:
    void Touch(Memory memory, const void* begin, uint64_t bytes, bool write) const;
    int pipe_;
    uint32_t clock_;
    uint32_t siteId_;
    Site site_;
};

// Happens-before edges of the calling unit.
Clock Completed(int pipe);               // everything `pipe` issued so far, finished
Clock CompletedAll();                    // the same for every pipe of the unit
void Acquire(int pipe, const Clock& clock);  // `pipe`'s later instructions come after `clock`
void AcquireAll(const Clock& clock);
void Barrier(int pipe);                  // PipeBarrier<pipe> (kPipeAll: every pipe)
// The hardware interlock of accumulating Mmads: the M pipe waits for its own earlier work.
void InterlockM();
void Join(Clock& into, const Clock& from);

// Sync call sites: every one is recorded; some may be switched off (a mutation) with
// FLASH_CANN_TWIN_DROP_SYNC=<file>:<line>[,<file>:<line>...] or DropSyncSite(). Returns
// false when the site's edge must be dropped (its bookkeeping still runs). `queue`: the
// InitBuffer site of the queue a hand-off belongs to.
bool SyncEdge(const char* kind, const Site& site, const Site* queue = nullptr);
void DropSyncSite(const std::string& sites);  // "" restores every edge
// "kind file:line [queue file:line]" of every sync site the last launch executed, sorted.
std::vector<std::string> ExecutedSyncSites();

// Launch plumbing (launch.cpp).
struct RaceLaunch;
struct LaunchConfig;
RaceLaunch* BeginRaceLaunch(const LaunchConfig& config);
// Returns the names of the checked GM tensors with unordered multi-agent atomic adds.
std::vector<std::string> EndRaceLaunch(RaceLaunch* launch);
void BeginRaceThread(RaceLaunch* launch, uint32_t core, int role);
void EndRaceThread(RaceLaunch* launch);
bool RaceDetectorOn();

}  // namespace twin

#endif
