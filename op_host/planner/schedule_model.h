// The schedule model of a FlashAttention forward kernel on an Ascend AI core: a
// PREDICTION (never a measurement, never used to decide correctness).
//
// A kernel design is data (KernelDesign): the shape of one round (query rows x keys on
// one AI core), the order in which the cube issues S = Q.K^T and P.V, how far the
// vector's O update lags the softmax, the GM workspace rings, the vector instructions
// per round. For every AI core the model builds the task graph of its rounds -- cube
// MTE2 loads, MTE1, MMAD and Fixpipe; vector MTE2, V and MTE3 -- with exactly the
// dependencies the design allows (data, cross-core flags with their latency, buffer
// reuse, in-order pipes) and runs it on a Timeline. Long tiles are extrapolated from
// the simulated steady state; the shared L2 and HBM bandwidths bound the result from
// below. docs/schedule-model.md gives the figures, their sources and the calibration.
#ifndef FLASH_CANN_PLANNER_SCHEDULE_MODEL_H
#define FLASH_CANN_PLANNER_SCHEDULE_MODEL_H

#include <cstdint>
#include <string>
#include <vector>

#include "engine_rates.h"
#include "timeline.h"

namespace flash_cann {

// One vector instruction of `repeats` 256-byte repeats, issued `times` times; `barrier`:
// a PipeBarrier<PIPE_V> follows each, so its head latency is exposed.
struct VecInstr {
    VecOp op;
    double repeats;
    bool barrier;
    double times = 1;
};
using VecProgram = std::vector<VecInstr>;

double VecSeconds(const VecProgram& program, const EngineRates& rates);
// 256-byte repeats of `elements` fp32 values.
double FloatRepeats(double elements);
// Appends an instruction (none when `repeats` or `times` is 0).
void AppendVec(VecProgram& program, VecOp op, double repeats, bool barrier, double times = 1);

// The vector programs of the online softmax (flash_attention_vector.h's instruction
// sequence; the incumbent's SoftmaxFlashV2 performs the same steps):
//   per score tile [rows x keys]: scale, row max, rescale factor, subtract, exp, row sum,
//   cast to P; `barriers`: a PipeBarrier<PIPE_V> after each step.
VecProgram SoftmaxProgram(double rows, double keys, bool barriers);
//   per round of O: rescale the running O and add the partial product
VecProgram OutputUpdateProgram(double rows, double headDim, bool barriers);
//   per tile: O / l, cast, lse
VecProgram EpilogueProgram(double rows, double headDim);
//   per diagonal round of a causal tile
VecProgram CausalMaskProgram(double rows, double keys, bool perRow);
//   per round with a key padding mask
VecProgram KeyMaskProgram(double rows, double keys);
//   per round, the features' score arithmetic (softcap's tanh, ALiBi's bias)
VecProgram FeatureProgram(double rows, double keys, bool softcap, bool alibi);
//   per slice of fp16 scores (fp16_scores): clamp to +-65504 (fp16), widen to fp32
VecProgram ScoreWidenProgram(double rows, double keys);

// Dropout's keep mask (op_kernel/flash_attention_philox.h): which Philox draws, and how
// many elements' keep bits one Philox4x32 call gives.
struct DropoutDraw {
    uint32_t rounds = 10;        // Philox4x32-10 (the contract); 7 is the default of Ascend
                                 // 950's PhiloxRandom (asc-devkit adv_api/math/philox.h)
    uint32_t drawsPerCall = 1;   // 1: the first output per element (variant.keep_mask today);
                                 // 4: all four 32-bit outputs; 16: their 16 bytes against an
                                 // 8-bit threshold (flash-attn 2's CUDA layout)
};
//   PhiloxDropout::Generate on a [rows x keys] tile in passes of `passElements`
//   elements: its instructions, step by step, each step's independent instructions
//   followed by one PipeBarrier<PIPE_V> (the header's schedule). drawsPerCall > 1 and
//   rounds != 10 are not implemented in the kernel: they price contract changes.
//   Integer instructions are costed as the fp32 ones of their class: shifts and Muls by
//   a scalar as kScalarArith, Add/Sub/And/Or as kBinary, int32 -> float as kCast (the
//   MindStudio table has no integer rows).
VecProgram DropoutMaskProgram(double rows, double keys, double passElements,
                              const DropoutDraw& draw = DropoutDraw());

// Per engine of the timeline, `rates`' arrival of a transfer's data (EngineRates).
EngineSeconds ArrivalOf(const EngineRates& rates);

struct KernelDesign {
    std::string name;
    // One round on one AI core.
    uint32_t keysPerRound = 0;
    uint32_t keysPerMatmul = 0;  // keys of one Mmad / Fixpipe of S / load of K, V, P (the
                                 // cube's sub-block); 0: the whole round
    uint32_t headDimPad = 0;
    uint32_t elemBytes = 2;
    uint32_t vectorSlices = 1;   // a vector core's round runs as this many row slices
    uint32_t ubScoreBuffers = 1; // UB copies of a score slice (2: next load overlaps)
    bool probBufferIsScratch = false;  // softmax(j+1) waits for P(j) to leave UB
    // Order and overlap.
    uint32_t scoresAhead = 1;    // rounds of S issued before P.V(0): S(j + scoresAhead - 1)
                                 // precedes P.V(j)
    uint32_t outputDelay = 0;    // the vector updates O(j) after softmax(j + outputDelay)
    bool loadsBeforeProbWait = false;  // V(j) and the next K load issue before waiting for P(j)
    bool pipelineAcrossTiles = false;  // the rounds of the next tile enter the cube's
                                       // pipeline before the current tile drains
    bool outputAcrossTiles = false;    // the vector's O update of a tile's last round may
                                       // follow the next tile's first softmax (else the
                                       // vector finishes a tile before the next one)
    bool blockPerTile = false;   // each tile is a kernel block of its own: it starts once
                                 // the previous one has finished on every engine
    bool queryInL0a = false;     // Q stays in L0A across a tile (no per-round MTE1 of Q)
    uint32_t cubeRows = 0;       // > 0: the cube works on a tile in passes of this many rows
                                 // (Q and O of the whole tile overflow L0A/L0C): per pass
                                 // an Mmad, a Fixpipe of S and a load of P per sub-block,
                                 // and P.V accumulated over the round's stack, one Fixpipe
                                 // of O per pass: the passes' O take turns in the one O
                                 // buffer (outputOwnL0c), so a pass's Mmads wait for the
                                 // previous pass's O Fixpipe
    bool valuesPerPass = false;  // with cubeRows: V of a round is loaded into L1 for every
                                 // pass (else it stays in L1 for all passes); MTE1 moves it
                                 // into L0B for every pass either way
    uint32_t scoreSlots = 2, probSlots = 2, outputSlots = 2;  // GM workspace rings
    uint32_t l0Buffers = 2;      // L0A/L0B operand ring
    uint32_t l0cBuffers = 2;     // L0C ring of S (and of O when !outputOwnL0c)
    bool outputOwnL0c = false;   // O has its own single L0C buffer
    // Workspace bytes per element.
    double scoreBytes = 4;       // S from Fixpipe to the vector cores
    bool widenScores = false;    // fp16 S (fp16_scores): the vector widens each slice to
                                 // fp32 and clamps it (ScoreWidenProgram) before the softmax
    // fp16 S with a per-row offset (a design change, not built; docs/kernel-backward.md, "The
    // fp16-score fast path"): the cube subtracts c, the running max the vector hands back
    // with P (kScoresAhead + 1 rounds late), by one more Mmad of depth scoreOffsetColumns
    // per sub-block on an offset panel loaded per round (GM -> L1 -> L0A); the first
    // fp32LeadRounds rounds of a tile, which have no c yet, leave S as fp32 (fp32-sized
    // slots, no widening).
    uint32_t scoreOffsetColumns = 0;
    uint32_t fp32LeadRounds = 0;
    double outputBytes = 4;      // O partial per output element per round (0: none)
    double finalOutputBytes = 2; // the tile's output per element (the input dtype's)
    bool vectorBarriers = true;  // PipeBarrier<PIPE_V> between softmax steps
    bool causalMaskPerRow = true;  // causal diagonal masked row by row (else one 2-D op)
    // Features computed on the scores of every round (the band of a sliding window is
    // costed as the causal diagonal's, on the rounds TileWork marks).
    bool softcap = false;
    bool alibi = false;
    // Dropout: > 0, every slice draws its keep mask (DropoutMaskProgram, passes of this
    // many elements) and applies it to P with one Select.
    uint32_t dropoutPassElements = 0;
    DropoutDraw dropoutDraw;
};

// One tile of an AI core's work: `rows` query rows (both vector cores together),
// `rounds` rounds of keysPerRound keys, `diagonalRounds` of which cross a band edge (the
// causal diagonal, a window bound): the last ones, as the causal diagonal's are.
struct TileWork {
    uint32_t rows;
    uint32_t rounds;
    uint32_t diagonalRounds;
    bool operator<(const TileWork& o) const
    {
        return rows != o.rows ? rows < o.rows
               : rounds != o.rounds ? rounds < o.rounds : diagonalRounds < o.diagonalRounds;
    }
};

// `count` consecutive identical tiles.
struct TileRun {
    TileWork tile;
    uint64_t count;
};
using CoreWorkList = std::vector<TileRun>;

// Appends `tile` to `work`, extending the last run when it is the same tile.
void AppendTile(CoreWorkList& work, const TileWork& tile);

struct SchedulePrediction {
    double seconds = 0;            // launch + slowest core (or the HBM floor)
    double launchSeconds = 0;
    double hbmSeconds = 0;         // the HBM floor
    double meanCoreSeconds = 0;
    std::string bound;             // what limits the slowest core
    EngineSeconds busy{};          // the slowest core's engines
    double coreSeconds = 0;        // the slowest core's time
};

// Predicts a kernel: `cores[c]` is AI core c's tiles in order; `hbmBytes` the unique
// traffic to HBM (inputs and outputs once); `hasMask` adds the key-mask vector work.
SchedulePrediction PredictSchedule(const KernelDesign& design,
                                   const std::vector<CoreWorkList>& cores,
                                   double hbmBytes, bool hasMask, const EngineRates& rates);

}  // namespace flash_cann

#endif
