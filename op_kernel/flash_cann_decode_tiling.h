// The contract between the decode planner (op_host/planner/decode_planner.cpp) and the
// decode kernel (op_kernel/flash_cann_attention_kvcache.cpp): the tiling data, the buffer
// sizes, the workspace layout and the walk over work units. Both sides include this
// header, so they cannot disagree on a layout, a size or a unit boundary.
//
// The problem is fwd_kvcache's (python/flash_cann/contract/flash_cann_ops.yaml): query
// rows of each sequence attend to the keys cache_leftpad[b] .. seqlens_k[b] - 1 of its
// cache (contiguous with cache_batch_idx, or paged through block_table). Every
// per-sequence value (seqlens_k, cache_leftpad, cache_batch_idx, block_table,
// cu_seqlens_q) is read by the kernel in GM; the tiling depends on shapes only, so a
// decode step can be captured into a graph.
//
// A work unit is (sequence b, kv head g, row tile t, split s):
//   rows   the group's query heads x the sequence's query rows, packed position-major
//          (row r = query position r / group, head g * group + r % group), cut into
//          tiles of blockQ rows: one K/V page is read once for the whole group;
//   keys   the keys the tile's rows see, cut into `splits` equal chunks (a multiple of
//          blockK keys, computed on the device from the sequence's length): split s is
//          one chunk, so a single long sequence spreads over every core.
// Each unit writes a partial (out, lse) in fp32 to the workspace; after a SyncAll the
// vector cores combine the splits of every row in split order (deterministic), with the
// sink as one more term, and write out and softmax_lse.
#ifndef FLASH_CANN_DECODE_TILING_H
#define FLASH_CANN_DECODE_TILING_H

#include <cstdint>

#include "flash_cann_tiling.h"

namespace flash_cann {

enum class DecodeLayout : uint32_t { BSND = 0, TND = 1 };

// Tiling keys of the decode kernel: 3000 + 100 * bf16 (one binary per dtype; causal,
// paging, TND and the features are runtime branches on a handful of scalars per unit
// or row, next to which the HBM traffic of the K/V pages is everything).
constexpr uint64_t DecodeTilingKey(uint32_t isBf16)
{
    return 3000u + isBf16 * 100u;
}

// The widest round of keys the decode vector core reduces with one WholeReduce per row
// (64 blocks of 8 fp32).
constexpr uint32_t kDecodeMaxRoundKeys = 512;

struct DecodeTiling {
    // Problem.
    uint32_t batch;
    uint32_t headsQ;
    uint32_t headsKv;
    uint32_t group;        // headsQ / headsKv
    uint32_t seqlenQ;      // BSND: query rows per sequence; TND: max_seqlen_q (a bound)
    uint32_t tokensQ;      // TND: total query rows (softmax_lse's row pitch); BSND: batch * seqlenQ
    uint32_t headDim;
    uint32_t headDimPad;   // headDim rounded up to kCubeBlock
    uint32_t layout;       // DecodeLayout
    uint32_t causal;
    float scale;
    // The cache: key j of sequence b is at row j of cache sequence cacheBatchIdx[b]
    // (contiguous), or at row j % pageSize of block blockTable[b][j / pageSize] (paged).
    // Either way a cache "block" is blockRows rows of headsKv * headDim elements.
    uint32_t paged;
    uint32_t blockRows;    // paged: page_size; contiguous: seqlen_cache
    uint32_t maxBlocks;    // paged: block_table's row length; contiguous: 1
    uint32_t hasBatchIdx;
    uint32_t hasLeftpad;
    // Blocking: blockQ rows per tile (a multiple of 16; the two vector cores take half
    // each), blockK keys per cube product and K/V/P load, keyStack products per round
    // (one S/P/O hand-over), vecRows rows per vector slice (a multiple of 8).
    uint32_t blockQ;
    uint32_t rowTiles;     // tiles per (sequence, kv head): ceil(group * seqlenQ / blockQ)
    uint32_t blockK;
    uint32_t keyStack;
    uint32_t vecRows;
    uint32_t splits;       // key chunks per tile
    // Work split: AI core c owns the units [unitStart[c], unitStart[c + 1]) of the
    // flattened (batch, headsKv, rowTiles, splits) space.
    uint32_t usedCores;
    uint32_t reserved;
    uint32_t unitStart[kMaxCores + 1];
    uint64_t workspacePerCore;  // the cube <-> vector exchange of one AI core
    uint64_t partialOffset;     // the partial (out, lse) of every unit, after all cores' exchange
    VariantTiling variant;
};

__aicore__ inline uint32_t DecodeRoundKeys(const DecodeTiling& t)
{
    return t.blockK * t.keyStack;
}

__aicore__ inline uint32_t DecodeUnits(const DecodeTiling& t)
{
    return t.batch * t.headsKv * t.rowTiles * t.splits;
}

// Bytes of every buffer the decode kernel allocates, per copy (the planner's accounting
// and the kernel's InitBuffer calls use this one formula). W = a round's keys,
// D = headDimPad, rows = blockQ / 2.
struct DecodeBufferBytes {
    // AIC
    uint32_t qL1;      // Q tile (Nz), blockQ x D
    uint32_t kvL1;     // K or V sub-block (Nz), blockK x D
    uint32_t pL1;      // P sub-block (Nz), blockQ x blockK
    uint32_t qL0a;     // Q tile (Zz), resident for the unit
    uint32_t pL0a;     // P sub-block (Zz)
    uint32_t l0b;      // K^T or V sub-block (Zn)
    uint32_t oL0c;     // O of a round, fp32, blockQ x D
    uint32_t sL0c;     // S of a sub-block, fp32, blockQ x blockK
    // AIV
    uint32_t sUb;      // S slice, fp32, vecRows x W (the combine's partial-out slices too)
    uint32_t pUb;      // P slice, input dtype, vecRows x W (row-reduction scratch before)
    uint32_t oUb;      // O partial slice, fp32, vecRows x D
    uint32_t accUb;    // running output, fp32, rows x D
    uint32_t outUb;    // output slice, input dtype, vecRows x D
    uint32_t rowUb;    // one per-row statistic, fp32, rows
    uint32_t brcUb;    // per-row values broadcast to one 32-byte block per row
    uint32_t keyUb;    // one per-key row (column index, ALiBi distances, scratch), fp32
    uint32_t bitsUb;   // comparison bits of one key row
    uint32_t splitUb;  // the combine's lse of every split (+ the sink) for vecRows rows
};

// Per-key rows: column index, ALiBi distance, scratch.
constexpr uint32_t kDecodeKeyRows = 3;

__aicore__ inline DecodeBufferBytes ComputeDecodeBufferBytes(const DecodeTiling& t, uint32_t elemBytes)
{
    const uint32_t bq = t.blockQ;
    const uint32_t bk = t.blockK;
    const uint32_t d = t.headDimPad;
    const uint32_t w = DecodeRoundKeys(t);
    const uint32_t vr = t.vecRows;
    DecodeBufferBytes b{};
    b.qL1 = bq * d * elemBytes;
    b.kvL1 = bk * d * elemBytes;
    b.pL1 = bq * bk * elemBytes;
    b.qL0a = bq * d * elemBytes;
    b.pL0a = bq * bk * elemBytes;
    b.l0b = bk * d * elemBytes;
    b.oL0c = bq * d * 4u;
    b.sL0c = bq * bk * 4u;
    const uint32_t sliceFloats = vr * (w > d ? w : d);
    b.sUb = sliceFloats * 4u;
    b.pUb = vr * w * elemBytes;
    b.oUb = vr * d * 4u;
    b.accUb = bq / 2u * d * 4u;
    b.outUb = vr * d * elemBytes;
    b.rowUb = AlignUp(bq / 2u * 4u, kByteBlock);
    b.brcUb = AlignUp(vr, 8u) * kByteBlock;
    b.keyUb = w * 4u;
    b.bitsUb = AlignUp(w / 8u, kByteBlock);
    b.splitUb = (t.splits + 1u) * AlignUp(vr * 4u, kByteBlock);
    return b;
}

// The workspace: per AI core the exchange rings (S, P, O: the forward's Workspace sizes
// for blockQ rows and W keys, two slots each: S runs one round ahead of P.V), then, for
// every unit, its partial output (fp32, blockQ x D) and lse (fp32, blockQ).
constexpr uint32_t kDecodeSlots = 2;

struct DecodeWorkspace {
    uint64_t slotBytes[3];  // S (fp32), P (input dtype), O (fp32) of one round
    uint64_t scores;
    uint64_t probs;
    uint64_t output;
    uint64_t perCore;
    uint64_t partialOut;    // bytes of one unit's partial output
    uint64_t partialLse;    // bytes of one unit's partial lse

    __aicore__ static uint64_t Align(uint64_t bytes) { return (bytes + 511) / 512 * 512; }

    __aicore__ DecodeWorkspace(const DecodeTiling& t, uint32_t elemBytes)
    {
        const uint64_t w = DecodeRoundKeys(t);
        slotBytes[0] = Align(uint64_t{t.blockQ} * w * 4);
        slotBytes[1] = Align(uint64_t{t.blockQ} * w * elemBytes);
        slotBytes[2] = Align(uint64_t{t.blockQ} * t.headDimPad * 4);
        scores = 0;
        probs = kDecodeSlots * slotBytes[0];
        output = probs + kDecodeSlots * slotBytes[1];
        perCore = output + kDecodeSlots * slotBytes[2];
        partialOut = uint64_t{t.blockQ} * t.headDimPad * 4;
        partialLse = uint64_t{t.blockQ} * 4;
    }
    // Total user workspace for `cores` AI cores and `units` units.
    __aicore__ uint64_t Total(uint32_t cores, uint32_t units) const
    {
        return Align(perCore * cores) + Align(partialOut * units) + Align(partialLse * units);
    }
};

// One unit of work, decoded from its index (shape only), and what the device values
// make of it (DecodeCursor::Resolve).
struct DecodeUnit {
    uint32_t batch;
    uint32_t headKv;
    uint32_t tile;
    uint32_t split;
    uint32_t index;      // the unit's index (its partial's slot)
    // Resolved from GM:
    uint32_t rowBase;    // the sequence's first query row (BSND b * seqlenQ, TND cu_seqlens_q[b])
    uint32_t seqRows;    // the sequence's query rows
    uint32_t row0;       // the tile's first packed row
    uint32_t rows;       // the tile's packed rows (0: the tile lies past the sequence)
    uint32_t length;     // keys in the cache for this sequence (seqlens_k[b])
    uint32_t leftpad;    // the first visible key (cache_leftpad[b], or 0)
    uint32_t keyBegin;   // this split's keys [keyBegin, keyEnd)
    uint32_t keyEnd;
};

__aicore__ inline DecodeUnit UnitAt(const DecodeTiling& t, uint32_t index)
{
    DecodeUnit u{};
    u.index = index;
    u.split = index % t.splits;
    uint32_t rest = index / t.splits;
    u.tile = rest % t.rowTiles;
    rest /= t.rowTiles;
    u.headKv = rest % t.headsKv;
    u.batch = rest / t.headsKv;
    return u;
}

__aicore__ inline int64_t MinI64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

__aicore__ inline int64_t MaxI64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

// The band of query position `qi` of a sequence with `seqRows` query rows, `length` keys
// and leftpad `leftpad`: keys [first, last] (bottom-right aligned to length, as the
// contract says; last < first: none).
struct KeyBand {
    int64_t first;
    int64_t last;
};

__aicore__ inline KeyBand RowBand(const DecodeTiling& t, int64_t qi, int64_t seqRows, int64_t length,
                                  int64_t leftpad)
{
    const int64_t diagonal = qi + length - seqRows;
    KeyBand band{leftpad, length - 1};
    if (t.causal != 0) {
        band.last = MinI64(band.last, diagonal);
    } else if (t.variant.windowRight >= 0) {
        band.last = MinI64(band.last, diagonal + t.variant.windowRight);
    }
    if (t.variant.windowLeft >= 0) {
        band.first = MaxI64(band.first, diagonal - t.variant.windowLeft);
    }
    return band;
}

// The unit's rows and keys once the sequence's values are known: the tile's rows, the
// union of their bands, and this split's chunk of it (chunks of a multiple of blockK
// keys, so that every split but the last is whole sub-blocks).
__aicore__ inline void ResolveUnit(const DecodeTiling& t, DecodeUnit& u, uint32_t rowBase, uint32_t seqRows,
                                   uint32_t length, uint32_t leftpad)
{
    u.rowBase = rowBase;
    u.seqRows = seqRows;
    u.length = length;
    u.leftpad = leftpad;
    const uint32_t packed = seqRows * t.group;
    u.row0 = u.tile * t.blockQ;
    u.rows = u.row0 < packed ? MinU32(t.blockQ, packed - u.row0) : 0;
    u.keyBegin = u.keyEnd = 0;
    if (u.rows == 0) {
        return;
    }
    const KeyBand low = RowBand(t, u.row0 / t.group, seqRows, length, leftpad);
    const KeyBand high = RowBand(t, (u.row0 + u.rows - 1) / t.group, seqRows, length, leftpad);
    const int64_t begin = MaxI64(low.first, 0);
    const int64_t end = high.last + 1;
    if (end <= begin) {
        return;
    }
    const uint32_t keys = static_cast<uint32_t>(end - begin);
    const uint32_t chunk = AlignUp((keys + t.splits - 1) / t.splits, t.blockK);
    const uint64_t first = uint64_t{u.split} * chunk;
    if (first >= keys) {
        return;
    }
    u.keyBegin = static_cast<uint32_t>(begin + first);
    u.keyEnd = static_cast<uint32_t>(begin + MinU32(keys, static_cast<uint32_t>(first) + chunk));
}

// Rounds of a unit: keys [keyBegin + n W, ...) in sub-blocks of blockK.
__aicore__ inline uint32_t DecodeRounds(const DecodeTiling& t, const DecodeUnit& u)
{
    const uint32_t w = DecodeRoundKeys(t);
    return (u.keyEnd - u.keyBegin + w - 1) / w;
}

struct DecodeRound {
    uint32_t key0;       // first key of the round
    uint32_t columns;    // keys in the round
    uint32_t subBlocks;  // ceil(columns / blockK)
    uint32_t width;      // subBlocks * blockK: S and P row width of the round
};

__aicore__ inline DecodeRound MakeDecodeRound(const DecodeTiling& t, const DecodeUnit& u, uint32_t round)
{
    const uint32_t w = DecodeRoundKeys(t);
    DecodeRound r;
    r.key0 = u.keyBegin + round * w;
    r.columns = MinU32(w, u.keyEnd - r.key0);
    r.subBlocks = (r.columns + t.blockK - 1) / t.blockK;
    r.width = r.subBlocks * t.blockK;
    return r;
}

}  // namespace flash_cann

#endif  // FLASH_CANN_DECODE_TILING_H
