// Packed sequences (layout TND) on the device: the walk over cu_seqlens_q/k and the
// balanced split of its work over the AI cores, as the forward (query tiles) and the
// backward (key-block units) use them.
//
// The host never reads cu_seqlens (they live in GM and may change between replays of a
// captured graph), so the planner cannot cut the work into per-core ranges as it does
// for dense layouts (TilingData::rowStart, GradTilingData::unitStart). Instead every core
// walks the same sequence of work items -- sequence by sequence, head by head, tile by
// tile (or key block by key block) -- reading the offsets with scalar GM reads, and
// measures each item's visible work with the same functions the dense walk uses
// (TileKeys, QueryRowRange: causal, window, bottom-right aligned to the sequence's own
// lengths; an empty sequence has no item). Two passes: the first sums the work W, the
// second hands item u, with work w_u and work P_u before it, to the core
//
//     owner(u) = floor((2 P_u + w_u) * N / (2 W))      (N cores; clamped to N - 1)
//
// i.e. the core whose equal share [c W / N, (c + 1) W / N) holds the item's midpoint.
// owner is non-decreasing in u, so each core gets one contiguous run of items, the runs
// tile the sequence exactly (every item has exactly one owner), and every core computes
// the same cut because it evaluates the same integer formula on the same data. This is
// the device counterpart of the planner's balanced split (op_host/planner/
// balanced_split.h, a boundary at the unit boundary nearest to c/N of the cumulative
// work): the same rule evaluated per item instead of per boundary, with no search.
// A core's run is within half an item of its share, so the imbalance is bounded by the
// largest item (one query tile's band), as in the dense split.
//
// Work of a forward tile: (its rounds + kScoresAhead) x its 16-row fractals. The kernel
// works in rounds (a partly visible round, e.g. the causal diagonal, costs a whole one),
// and a tile fills and drains the cube's pipeline: S runs kScoresAhead rounds ahead of
// P.V, and tiles do not overlap. Counting sub-blocks + 1 instead (a first version)
// left the busiest core 1.55x the mean in the schedule model for 7 documents of 16k
// tokens (short documents' tiles were underpriced); rounds + 2 gives 1.06 (docs/planner.md).
// A tile that sees no key still costs its fill/drain share (it writes its rows). Work of a backward unit: its steps (query
// blocks x group), + 1 for the unit's K/V load and dK/dV write-out.
//
// Robustness without host checks: offsets are clamped to [0, tokens] and made
// non-decreasing, so malformed cu_seqlens cannot address memory outside the tensors.
// (The CPU-side checks refuse them with a message where the values may be read.)
//
// Plain C++17 templates over an `Offsets` reader (uint32_t Query(b), Key(b): cu_seqlens
// entry b), so the planner's model and tests walk exactly what the kernel walks; the
// kernel's reader does GlobalTensor<int32_t>::GetValue.
#ifndef FLASH_CANN_PACKED_H
#define FLASH_CANN_PACKED_H

#include "flash_cann_grad_tiling.h"
#include "flash_cann_tiling.h"

namespace flash_cann {

// The owner core of a work item (the cut rule above).
__aicore__ inline uint32_t OwnerCore(uint64_t before, uint64_t work, uint64_t total, uint32_t cores)
{
    if (total == 0) {
        return 0;
    }
    const uint64_t owner = (2 * before + work) * cores / (2 * total);
    return owner < cores ? static_cast<uint32_t>(owner) : cores - 1;
}

// Sequence b's tokens [q0, q0 + lenQ) and keys [k0, k0 + lenK) of a packed batch.
struct PackedSequence {
    uint64_t q0;
    uint32_t lenQ;
    uint64_t k0;
    uint32_t lenK;
};

// One offset pair, clamped (see above); `previousEnd` is the clamped end of b - 1.
__aicore__ inline void ClampedSpan(int64_t begin, int64_t end, uint64_t tokens, uint64_t& start,
                                   uint32_t& length)
{
    const int64_t limit = static_cast<int64_t>(tokens);
    begin = begin < 0 ? 0 : (begin > limit ? limit : begin);
    end = end < begin ? begin : (end > limit ? limit : end);
    start = static_cast<uint64_t>(begin);
    length = static_cast<uint32_t>(end - begin);
}

template <typename Offsets>
__aicore__ inline PackedSequence ReadSequence(const Offsets& cu, uint32_t b, uint64_t tokensQ,
                                              uint64_t tokensK)
{
    PackedSequence s{};
    ClampedSpan(cu.Query(b), cu.Query(b + 1), tokensQ, s.q0, s.lenQ);
    ClampedSpan(cu.Key(b), cu.Key(b + 1), tokensK, s.k0, s.lenK);
    return s;
}

// ---- Forward: query tiles ------------------------------------------------------------

// The forward's work of a tile (the cut rule's w).
template <bool CAUSAL>
__aicore__ inline uint64_t PackedTileWork(const TilingData& t, const QueryTile& tile)
{
    const KeyRange keys = TileKeys<CAUSAL>(t, tile);
    return (RoundCount(t, keys) + kScoresAhead) * ((tile.rows + kCubeBlock - 1) / kCubeBlock);
}

// Every tile of a packed batch in order (sequence, head, blockQ rows), for any core.
template <bool CAUSAL, typename Offsets>
class PackedTiles {
public:
    __aicore__ PackedTiles() = default;
    __aicore__ PackedTiles(const TilingData& t, const Offsets& cu) : t_(&t), cu_(&cu) {}

    __aicore__ bool Next(QueryTile& tile)
    {
        while (seq_ < t_->batch) {
            if (!loaded_) {
                s_ = ReadSequence(*cu_, seq_, t_->tokensQ, t_->tokensK);
                loaded_ = true;
            }
            if (row_ < s_.lenQ) {
                PlaceTile(*t_, seq_, head_, s_.lenQ, s_.lenK, s_.q0, s_.k0, tile);
                tile.row0 = row_;
                tile.rows = MinU32(t_->blockQ, s_.lenQ - row_);
                row_ += tile.rows;
                return true;
            }
            row_ = 0;
            if (++head_ == t_->headsQ) {
                head_ = 0;
                ++seq_;
                loaded_ = false;
            }
        }
        return false;
    }

private:
    const TilingData* t_ = nullptr;
    const Offsets* cu_ = nullptr;
    PackedSequence s_{};
    uint32_t seq_ = 0;
    uint32_t head_ = 0;
    uint32_t row_ = 0;
    bool loaded_ = false;
};

// The tiles of one core: its contiguous run of PackedTiles under the cut rule.
template <bool CAUSAL, typename Offsets>
class PackedTileWalk {
public:
    // First pass: the total work. `cu` must outlive the walk.
    __aicore__ void Start(const TilingData& t, const Offsets& cu, uint32_t core, uint32_t cores)
    {
        t_ = &t;
        cu_ = &cu;
        core_ = core;
        cores_ = cores;
        total_ = before_ = 0;
        done_ = false;
        PackedTiles<CAUSAL, Offsets> all(t, cu);
        QueryTile tile{};
        while (all.Next(tile)) {
            total_ += PackedTileWork<CAUSAL>(t, tile);
        }
        tiles_ = PackedTiles<CAUSAL, Offsets>(t, cu);
    }

    __aicore__ bool Next(QueryTile& tile)
    {
        while (!done_ && tiles_.Next(tile)) {
            const uint64_t work = PackedTileWork<CAUSAL>(*t_, tile);
            const uint32_t owner = OwnerCore(before_, work, total_, cores_);
            before_ += work;
            if (owner == core_) {
                return true;
            }
            done_ = owner > core_;
        }
        done_ = true;
        return false;
    }

private:
    const TilingData* t_ = nullptr;
    const Offsets* cu_ = nullptr;
    PackedTiles<CAUSAL, Offsets> tiles_{};
    uint32_t core_ = 0;
    uint32_t cores_ = 1;
    uint64_t total_ = 0;
    uint64_t before_ = 0;
    bool done_ = true;
};

// ---- Backward: key-block units --------------------------------------------------------

// The backward's work of a unit (the cut rule's w): its steps, + 1 for its K/V load and
// dK/dV write-out (a unit no query sees costs that 1 only: it has no step).
__aicore__ inline uint64_t PackedUnitWork(const GradTilingData& t, const GradUnit& u)
{
    return uint64_t{t.group} * (u.endQueryBlock - u.firstQueryBlock) + 1;
}

// A run of consecutive key blocks of one (sequence, kv head) that one core owns whole:
// one unit, or with the deterministic dQ one chunk of dqChunkBlocks blocks (its dQ slot
// must take its adds from one core, in program order: GradSplitKeepsChunks' rule).
struct PackedChunk {
    PackedSequence seq;
    uint32_t batch;
    uint32_t headKv;
    uint32_t block0;
    uint32_t blocks;
};

// Every chunk of a packed batch in order (sequence, kv head, key block).
template <typename Offsets>
class PackedChunks {
public:
    __aicore__ PackedChunks() = default;
    __aicore__ PackedChunks(const GradTilingData& t, const Offsets& cu, uint32_t chunkBlocks)
        : t_(&t), cu_(&cu), chunkBlocks_(chunkBlocks) {}

    __aicore__ bool Next(PackedChunk& chunk)
    {
        while (seq_ < t_->batch) {
            if (!loaded_) {
                s_ = ReadSequence(*cu_, seq_, t_->tokensQ, t_->tokensK);
                keyBlocks_ = (s_.lenK + t_->blockK - 1) / t_->blockK;
                loaded_ = true;
            }
            if (block_ < keyBlocks_) {
                chunk.seq = s_;
                chunk.batch = seq_;
                chunk.headKv = head_;
                chunk.block0 = block_;
                chunk.blocks = MinU32(chunkBlocks_, keyBlocks_ - block_);
                block_ += chunk.blocks;
                return true;
            }
            block_ = 0;
            if (++head_ == t_->headsKv) {
                head_ = 0;
                ++seq_;
                loaded_ = false;
            }
        }
        return false;
    }

private:
    const GradTilingData* t_ = nullptr;
    const Offsets* cu_ = nullptr;
    uint32_t chunkBlocks_ = 1;
    PackedSequence s_{};
    uint32_t keyBlocks_ = 0;
    uint32_t seq_ = 0;
    uint32_t head_ = 0;
    uint32_t block_ = 0;
    bool loaded_ = false;
};

template <bool CAUSAL>
__aicore__ inline GradUnit ChunkUnit(const GradTilingData& t, const PackedChunk& c, uint32_t i)
{
    return MakeUnit<CAUSAL>(t, c.batch, c.headKv, c.block0 + i, c.seq.lenQ, c.seq.lenK, c.seq.q0, c.seq.k0);
}

template <bool CAUSAL>
__aicore__ inline uint64_t PackedChunkWork(const GradTilingData& t, const PackedChunk& c)
{
    uint64_t work = 0;
    for (uint32_t i = 0; i < c.blocks; ++i) {
        work += PackedUnitWork(t, ChunkUnit<CAUSAL>(t, c, i));
    }
    return work;
}

// The steps of one core, as GradStepCursor walks a dense split: its contiguous run of
// chunks under the cut rule, each chunk's units, each unit's steps (StepAt).
template <bool CAUSAL, typename Offsets>
class PackedStepCursor {
public:
    // First pass: the total work. `cu` must outlive the cursor. chunkBlocks: 1, or the
    // deterministic dQ's dqChunkBlocks.
    __aicore__ void Start(const GradTilingData& t, const Offsets& cu, uint32_t core, uint32_t cores,
                          uint32_t chunkBlocks)
    {
        t_ = &t;
        core_ = core;
        cores_ = cores;
        total_ = before_ = 0;
        done_ = false;
        open_ = false;
        unitIndex_ = chunk_.blocks = 0;
        PackedChunks<Offsets> all(t, cu, chunkBlocks);
        PackedChunk c{};
        while (all.Next(c)) {
            total_ += PackedChunkWork<CAUSAL>(t, c);
        }
        chunks_ = PackedChunks<Offsets>(t, cu, chunkBlocks);
    }

    // Advances to the next step (unit and step then describe it); false when done.
    __aicore__ bool Next()
    {
        for (;;) {
            if (open_ && StepAt(*t_, unit, index_, step)) {
                ++index_;
                return true;
            }
            if (unitIndex_ < chunk_.blocks) {
                unit = ChunkUnit<CAUSAL>(*t_, chunk_, unitIndex_++);
                index_ = 0;
                open_ = true;
                continue;
            }
            if (!NextOwnedChunk()) {
                return false;
            }
        }
    }

    GradUnit unit{};
    GradStep step{};

private:
    __aicore__ bool NextOwnedChunk()
    {
        while (!done_ && chunks_.Next(chunk_)) {
            const uint64_t work = PackedChunkWork<CAUSAL>(*t_, chunk_);
            const uint32_t owner = OwnerCore(before_, work, total_, cores_);
            before_ += work;
            if (owner == core_) {
                unitIndex_ = 0;
                return true;
            }
            done_ = owner > core_;
        }
        done_ = true;
        chunk_.blocks = 0;
        return false;
    }

    const GradTilingData* t_ = nullptr;
    PackedChunks<Offsets> chunks_{};
    PackedChunk chunk_{};
    uint32_t unitIndex_ = 0;
    uint32_t index_ = 0;
    bool open_ = false;
    uint32_t core_ = 0;
    uint32_t cores_ = 1;
    uint64_t total_ = 0;
    uint64_t before_ = 0;
    bool done_ = true;
};

}  // namespace flash_cann

#endif  // FLASH_CANN_PACKED_H
