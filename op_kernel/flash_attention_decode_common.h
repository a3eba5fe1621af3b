// What the cube (AIC) and vector (AIV) halves of the decode kernel share: the exchange
// rings in the workspace (S, P, O of a round; the forward's cross-core flag ids) and the
// per-sequence values both halves read from GM to resolve a unit (flash_cann_decode_tiling.h).
// Both halves resolve every unit from the same GM values, so they agree on its rows,
// keys and rounds without telling each other.
#ifndef FLASH_CANN_FLASH_ATTENTION_DECODE_COMMON_H
#define FLASH_CANN_FLASH_ATTENTION_DECODE_COMMON_H

#include "kernel_operator.h"
#include "flash_attention_common.h"
#include "flash_cann_decode_tiling.h"
#include "flash_cann_packed.h"

namespace flash_cann {

// The GM inputs of the decode kernel, as its entry receives them.
struct DecodeArgs {  // GM_ADDR is a pointer macro: one declarator per member
    GM_ADDR query;
    GM_ADDR kCache;
    GM_ADDR vCache;
    GM_ADDR seqlensK;
    GM_ADDR cacheBatchIdx;
    GM_ADDR blockTable;
    GM_ADDR cacheLeftpad;
    GM_ADDR cuSeqlensQ;
    GM_ADDR alibiSlopes;
    GM_ADDR sinks;
    GM_ADDR out;
    GM_ADDR softmaxLse;
    GM_ADDR userWorkspace;
};

// The per-sequence values in GM (int32, read on the scalar unit): lengths, leftpad and
// the TND query offsets. Read per unit, never by the host.
class DecodeSequences {
public:
    __aicore__ inline void Init(const DecodeArgs& a, const DecodeTiling& t)
    {
        t_ = &t;
        seqlensK_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(a.seqlensK));
        if (t.hasLeftpad != 0) {
            leftpad_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(a.cacheLeftpad));
        }
        if (t.layout == static_cast<uint32_t>(DecodeLayout::TND)) {
            cuSeqlensQ_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(a.cuSeqlensQ));
        }
    }

    // The sequence's first query row and its query rows.
    __aicore__ inline void QueryRows(uint32_t batch, uint32_t& rowBase, uint32_t& seqRows) const
    {
        if (t_->layout == static_cast<uint32_t>(DecodeLayout::TND)) {
            // Clamped to [0, tokens_q] as every packed walk (flash_cann_packed.h): bad
            // offsets cannot move a read of query or a write of out and lse outside them.
            uint64_t first = 0;
            uint32_t rows = 0;
            ClampedSpan(cuSeqlensQ_.GetValue(batch), cuSeqlensQ_.GetValue(batch + 1), t_->tokensQ,
                        first, rows);
            rowBase = static_cast<uint32_t>(first);
            // Rows past max_seqlen_q have no tile (the plan's rowTiles bound them): the
            // caller keeps cu_seqlens_q within max_seqlen_q, as flash-attn requires.
            seqRows = MinU32(rows, t_->seqlenQ);
        } else {
            rowBase = batch * t_->seqlenQ;
            seqRows = t_->seqlenQ;
        }
    }

    __aicore__ inline DecodeUnit Resolve(uint32_t index) const
    {
        DecodeUnit u = UnitAt(*t_, index);
        uint32_t rowBase = 0;
        uint32_t seqRows = 0;
        QueryRows(u.batch, rowBase, seqRows);
        const int32_t length = seqlensK_.GetValue(u.batch);
        const int32_t leftpad = t_->hasLeftpad != 0 ? leftpad_.GetValue(u.batch) : 0;
        // A length beyond the cache's capacity (a graph that skipped the Python capacity
        // guard) attends to the capacity: the walk never leaves the block table's row.
        const uint32_t capacity = t_->blockRows * t_->maxBlocks;
        ResolveUnit(*t_, u, rowBase, seqRows, length > 0 ? MinU32(static_cast<uint32_t>(length), capacity) : 0u,
                    leftpad > 0 ? static_cast<uint32_t>(leftpad) : 0u);
        return u;
    }

private:
    const DecodeTiling* t_ = nullptr;
    AscendC::GlobalTensor<int32_t> seqlensK_, leftpad_, cuSeqlensQ_;
};

// One AI core's exchange rings (DecodeWorkspace), as both halves address them, and the
// partial (out, lse) of every unit.
template <typename T>
class DecodeExchange {
public:
    __aicore__ inline void Init(GM_ADDR userWorkspace, uint32_t core, const DecodeTiling& t)
    {
        const DecodeWorkspace ws(t, sizeof(T));
        GM_ADDR mine = userWorkspace + core * t.workspacePerCore;
        scores_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(mine + ws.scores));
        probs_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(mine + ws.probs));
        output_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(mine + ws.output));
        scoreSlot_ = ws.slotBytes[0] / sizeof(float);
        probSlot_ = ws.slotBytes[1] / sizeof(T);
        outputSlot_ = ws.slotBytes[2] / sizeof(float);
        const uint32_t units = DecodeUnits(t);
        partialOut_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(userWorkspace + t.partialOffset));
        partialLse_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(
            userWorkspace + t.partialOffset + DecodeWorkspace::Align(ws.partialOut * units)));
        unitRows_ = t.blockQ;
        headDimPad_ = t.headDimPad;
    }
    __aicore__ inline AscendC::GlobalTensor<float> Scores(uint32_t seq, uint64_t offset) const
    {
        return scores_[seq % kDecodeSlots * scoreSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<T> Probs(uint32_t seq, uint64_t offset) const
    {
        return probs_[seq % kDecodeSlots * probSlot_ + offset];
    }
    __aicore__ inline AscendC::GlobalTensor<float> Output(uint32_t seq, uint64_t offset) const
    {
        return output_[seq % kDecodeSlots * outputSlot_ + offset];
    }
    // Row `row` of unit `unit`'s partial output (headDimPad floats) and lse.
    __aicore__ inline AscendC::GlobalTensor<float> PartialOut(uint32_t unit, uint32_t row) const
    {
        return partialOut_[(uint64_t{unit} * unitRows_ + row) * headDimPad_];
    }
    __aicore__ inline AscendC::GlobalTensor<float> PartialLse(uint32_t unit, uint32_t row) const
    {
        return partialLse_[uint64_t{unit} * unitRows_ + row];
    }

private:
    AscendC::GlobalTensor<float> scores_, output_, partialOut_, partialLse_;
    AscendC::GlobalTensor<T> probs_;
    uint64_t scoreSlot_ = 0, probSlot_ = 0, outputSlot_ = 0;
    uint32_t unitRows_ = 0;
    uint32_t headDimPad_ = 0;
};

}  // namespace flash_cann

#endif
