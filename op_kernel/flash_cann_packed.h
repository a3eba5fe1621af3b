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
// plus a per-tile share: + kScoresAhead was the pipeline's fill and drain when tiles did
// not overlap (the cube's round stream now crosses tiles, the vector cores' per-tile
// epilogue remains; the constant is not re-tuned). Counting sub-blocks + 1 instead (a first version)
// left the busiest core 1.55x the mean in the schedule model for 7 documents of 16k
// tokens (short documents' tiles were underpriced); rounds + 2 gives 1.06 (docs/schedule-model.md).
// A tile that sees no key still costs its fill/drain share (it writes its rows). Work of a backward unit: its steps (query
// blocks x group), + 1 for the unit's K/V load and dK/dV write-out; of a query unit of the
// deterministic dQ's query pass: its key blocks, + 1 for its Q/dO load and dQ write-out.
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

// ---- Backward: key-block units and query units ---------------------------------------

// The backward's work of an item (the cut rule's w): its steps, + 1 for what it loads once
// and writes once (K/V and dK/dV of a unit; Q/dO and dQ of a query unit); an item with no
// step (a window hides it) costs that 1 only.
__aicore__ inline uint64_t PackedUnitWork(const GradTilingData& t, const GradUnit& u)
{
    return uint64_t{t.group} * (u.endQueryBlock - u.firstQueryBlock) + 1;
}

__aicore__ inline uint64_t PackedUnitWork(const GradTilingData&, const GradQueryUnit& q)
{
    return uint64_t{q.endKeyBlock - q.firstKeyBlock} + 1;
}

// Every item of a packed batch in order: (sequence, kv head, key block) for the key pass,
// (sequence, query head, query block) for the deterministic dQ's query pass.
template <bool CAUSAL, bool QUERY_PASS, typename Offsets>
class PackedItems {
public:
    __aicore__ PackedItems() = default;
    __aicore__ PackedItems(const GradTilingData& t, const Offsets& cu) : t_(&t), cu_(&cu) {}

    template <typename Item>
    __aicore__ bool Next(Item& item)
    {
        const uint32_t heads = QUERY_PASS ? t_->headsQ : t_->headsKv;
        const uint32_t block = QUERY_PASS ? t_->blockQ : t_->blockK;
        while (seq_ < t_->batch) {
            if (!loaded_) {
                s_ = ReadSequence(*cu_, seq_, t_->tokensQ, t_->tokensK);
                blocks_ = ((QUERY_PASS ? s_.lenQ : s_.lenK) + block - 1) / block;
                loaded_ = true;
            }
            if (block_ < blocks_) {
                if constexpr (QUERY_PASS) {
                    item = MakeQueryUnit<CAUSAL>(*t_, seq_, head_, block_, s_.lenQ, s_.lenK, s_.q0, s_.k0);
                } else {
                    item = MakeUnit<CAUSAL>(*t_, seq_, head_, block_, s_.lenQ, s_.lenK, s_.q0, s_.k0);
                }
                ++block_;
                return true;
            }
            block_ = 0;
            if (++head_ == heads) {
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
    PackedSequence s_{};
    uint32_t blocks_ = 0;
    uint32_t seq_ = 0;
    uint32_t head_ = 0;
    uint32_t block_ = 0;
    bool loaded_ = false;
};

// The items of one core: its contiguous run of PackedItems under the cut rule.
template <bool CAUSAL, bool QUERY_PASS, typename Offsets>
class PackedOwnedItems {
public:
    using Item = typename PassOf<QUERY_PASS>::Type::Item;

    __aicore__ PackedOwnedItems() = default;
    // First pass: the total work. `cu` must outlive the walk.
    __aicore__ PackedOwnedItems(const GradTilingData& t, const Offsets& cu, uint32_t core, uint32_t cores)
        : t_(&t), items_(t, cu), core_(core), cores_(cores), done_(false)
    {
        PackedItems<CAUSAL, QUERY_PASS, Offsets> all(t, cu);
        Item item{};
        while (all.Next(item)) {
            total_ += PackedUnitWork(t, item);
        }
    }

    __aicore__ bool Next(Item& item)
    {
        while (!done_ && items_.Next(item)) {
            const uint64_t work = PackedUnitWork(*t_, item);
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
    const GradTilingData* t_ = nullptr;
    PackedItems<CAUSAL, QUERY_PASS, Offsets> items_{};
    uint32_t core_ = 0;
    uint32_t cores_ = 1;
    uint64_t total_ = 0;
    uint64_t before_ = 0;
    bool done_ = true;
};

// The steps of one core of a packed batch, as DenseStepWalk walks a dense split.
template <bool CAUSAL, bool QUERY_PASS, typename Offsets>
using PackedStepWalk = GradStepWalk<CAUSAL, typename PassOf<QUERY_PASS>::Type,
                                    PackedOwnedItems<CAUSAL, QUERY_PASS, Offsets>>;

}  // namespace flash_cann

#endif  // FLASH_CANN_PACKED_H
