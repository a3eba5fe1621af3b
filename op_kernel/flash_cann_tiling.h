// The contract between the host planner (op_host/planner) and the forward kernel
// (op_kernel/flash_cann_attention.cpp): the tiling data, the buffer sizes every stage
// allocates, and the walk over query tiles. Both sides include this header, so they
// cannot disagree on a layout, a size or a tile boundary.
//
// Plain C++17 with fixed-width integers (a POD struct, as CANN's standard-C++ tiling
// style requires); functions are `__aicore__ inline` so the NPU compiler accepts them,
// and the host defines `__aicore__` away.
#ifndef FLASH_CANN_TILING_H
#define FLASH_CANN_TILING_H

#include <cstdint>

#include "flash_cann_variant.h"

#ifndef __aicore__
#define __aicore__
#endif

namespace flash_cann {

// Upper bound on AI cores (AIC + 2 AIV groups) the tiling data can describe.
// 910B/910_93 have at most 24; the bound leaves room and keeps the struct < 2 KB
// (CANN's default tiling buffer is 2048 bytes).
constexpr uint32_t kMaxCores = 48;
// The cube works on 16 x 16 fractals; every matrix dimension is padded to this.
constexpr uint32_t kCubeBlock = 16;
constexpr uint32_t kByteBlock = 32;  // UB/L1 alignment and DataCopy unit
// fp16 scores: the extra depth of the S product that subtracts each row's offset (one
// fractal panel; flash_attention_scores.h).
constexpr uint32_t kScoreOffsetColumns = kCubeBlock;

// TND: packed sequences (tokens, heads, head_dim), delimited by cu_seqlens_q/k in GM
// (flash_cann_packed.h); seqlenQ/seqlenK are then max_seqlen_q/k, bounds for sizing.
enum class Layout : uint32_t { BNSD = 0, BSND = 1, TND = 2 };

// The tiling key selects one kernel instantiation: element type, causal, key mask, and
// whether the features of VariantTiling are compiled in. Decimal fields so a key reads as
// what it is: FDCM (F: 1 plain, 2 features; D: 0 fp16, 1 bf16). fp16_scores has no forward
// key: the forward keeps fp32 S (docs/kernel-backward.md, "The fp16-score fast path"). The features
// themselves (window, softcap, ALiBi, dropout, sinks) are runtime branches on the tiling
// data: one FEATURES binary per plain one keeps the count at 16 (docs/kernel.md, "Variants:
// the tiling key").
constexpr uint64_t TilingKey(uint32_t isBf16, uint32_t causal, uint32_t hasMask,
                             uint32_t features)
{
    return 1000u + features * 1000u + isBf16 * 100u + causal * 10u + hasMask;
}

struct TilingData {
    // Problem (elements unless a name says bytes).
    uint32_t batch;
    uint32_t headsQ;
    uint32_t headsKv;
    uint32_t group;       // headsQ / headsKv
    uint32_t seqlenQ;
    uint32_t seqlenK;
    uint32_t headDim;
    uint32_t headDimPad;  // headDim rounded up to kCubeBlock (32 bytes of fp16/bf16)
    int64_t causalOffset; // seqlenK - seqlenQ: query i sees key j iff j <= i + offset
    float scale;
    uint32_t layout;      // Layout
    // Strides (elements) of batch, head and sequence position; query and output share
    // theirs, key and value share theirs.
    uint64_t qStrideBatch, qStrideHead, qStrideRow;
    uint64_t kvStrideBatch, kvStrideHead, kvStrideRow;
    // Blocking (see docs/kernel.md for the schedule these drive):
    //   blockQ    query tile rows (at most); the two vector cores take half each.
    //   cubeRows  rows of one cube pass: blockQ, when Q of the whole tile stays in L0A
    //             beside the P operand and O of the whole tile fits L0C beside the S
    //             ring; else blockQ / 2 (256-row tiles at head_dim 128): the cube works on
    //             the tile in row halves, Q from L1 into L0A per product, O of one half
    //             accumulated over the round's stack, then the other (docs/kernel.md,
    //             "The cube in row passes").
    //   blockK    key sub-block: the unit of one cube product (S = Q K^T of blockK keys,
    //             or the P.V contribution of blockK keys) and of the K/V/P L1 loads.
    //   keyStack  sub-blocks per round: one round = blockK * keyStack keys, at most
//             kMaxRoundKeys. The cube
    //             Fixpipes S per sub-block, accumulates P.V over the whole stack in L0C
    //             and writes O once per round; the vector cores hand over S, P and O
    //             once per round (one cross-core flag each).
    //   vecRows   rows of one vector slice: the vector cores process a round's S as
    //             slices of vecRows rows x (blockK * keyStack) columns, double-buffered
    //             in UB. A multiple of 8 (row statistics stay 32-byte aligned).
    uint32_t blockQ;
    uint32_t blockK;
    uint32_t keyStack;
    uint32_t vecRows;
    // Copies of each ring buffer (1 or 2; 2 = double-buffered). The K, V and P loads
    // into L1 and the L0B operand ring are always double-buffered where they fit.
    uint32_t kvL1Buffers;  // K sub-blocks in L1, and V sub-blocks in L1
    uint32_t pL1Buffers;   // P sub-blocks in L1
    uint32_t l0aBuffers;   // P operand sub-blocks in L0A (Q has its own L0A region)
    uint32_t l0bBuffers;   // B operand (K^T or V sub-block) in L0B
    uint32_t l0cBuffers;   // S sub-block results in L0C (O has its own L0C region)
    uint32_t cubeRows;     // rows of one cube pass (see above): the L0A/L0C operands' rows
    uint32_t causal;       // 1: the causal mask is compiled in (also in the tiling key);
    uint32_t hasMask;      // 1: a key padding mask is (ditto). Both decide UB buffers.
    // Work split: AI core c owns the rows [rowStart[c], rowStart[c + 1]) of the
    // flattened (batch, head_q, seqlen_q) row space (dense layouts; TND: all 0, the
    // kernel splits on the device, flash_cann_packed.h).
    uint32_t usedCores;
    uint32_t features;     // 1: the FEATURES kernel (tiling key); 0 iff IsPlain(variant)
    uint64_t rowStart[kMaxCores + 1];
    // Per-core user workspace (GM) for the cube <-> vector exchange (Workspace below).
    uint64_t workspacePerCore;
    // The features beyond plain attention (flash_cann_variant.h).
    VariantTiling variant;
    // Layout TND: the packed query and key tokens (the tensors' first dimension). The
    // work split is then made on the device (flash_cann_packed.h), not in rowStart.
    uint64_t tokensQ;
    uint64_t tokensK;
};

__aicore__ inline uint32_t AlignUp(uint32_t value, uint32_t unit)
{
    return (value + unit - 1) / unit * unit;
}

__aicore__ inline uint32_t MinU32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

// The widest round: the vector cores reduce a fp32 row of a round to one value per
// 32-byte block, fold blocks past the 64th onto the first 64 once, and reduce those 64
// with one WholeReduce repeat, so a row holds at most 2 x 64 blocks of 8 keys.
constexpr uint32_t kMaxRoundKeys = 1024;

// Keys of one full round.
__aicore__ inline uint32_t RoundKeys(const TilingData& t)
{
    return t.blockK * t.keyStack;
}

// Whether the cube works on a tile in row passes (cubeRows < blockQ): Q comes from L1 into
// L0A per product, P and Q share one L0A ring, and V of a whole round stays in L1 for
// every pass (docs/kernel.md, "The cube in row passes").
__aicore__ inline bool CubeInPasses(const TilingData& t)
{
    return t.cubeRows < t.blockQ;
}

// Row passes of the cube over a tile of `rows` rows (1, or 2 when cubeRows < blockQ and
// the tile has more than cubeRows rows), and the rows of pass `pass`.
__aicore__ inline uint32_t CubePasses(const TilingData& t, uint32_t rows)
{
    return (rows + t.cubeRows - 1) / t.cubeRows;
}

__aicore__ inline uint32_t CubePassRows(const TilingData& t, uint32_t rows, uint32_t pass)
{
    return MinU32(t.cubeRows, rows - pass * t.cubeRows);
}

// Rows of one vector core's half of a full tile.
__aicore__ inline uint32_t VectorRows(const TilingData& t)
{
    return t.blockQ / 2;
}

// Bytes of every buffer the kernel allocates, per copy. One formula for the planner's
// accounting (ListBuffers) and the kernel's InitBuffer calls. AIC buffers live in
// L1/L0A/L0B/L0C; each AIV has its own UB. W = blockK * keyStack (a round's columns),
// rows = blockQ / 2, D = headDimPad.
struct BufferBytes {
    // AIC
    // (C = cubeRows: blockQ, or the row half a cube pass works on)
    uint32_t qL1;      // Q tile (Nz per pass: C rows each), blockQ x D, loaded once per tile
    uint32_t kL1;      // K sub-block (Nz = Zn of K^T), blockK x D
    uint32_t vL1;      // V sub-block (Nz), blockK x D; in passes: V of a round, W x D
    uint32_t pL1;      // P sub-block of a pass (Nz), C x blockK
    uint32_t qL0a;     // Q tile (Zz), resident for the whole tile; in passes: one buffer
                       // of the L0A ring Q of a pass and P take turns in, C x max(D, blockK)
    uint32_t pL0a;     // P sub-block (Zz), C x blockK; in passes: 0 (P is in the Q ring)
    uint32_t l0b;      // K^T or V sub-block (Zn), blockK x D
    uint32_t oL0c;     // O of a round and pass, fp32, C x D, accumulated over the stack
    uint32_t sL0c;     // S of a sub-block and pass, fp32, C x blockK
    // AIV (per vector core)
    uint32_t sUb;      // S slice, fp32, vecRows x W
    uint32_t pUb;      // P slice, input dtype, vecRows x W (row-reduction scratch before)
    uint32_t oUb;      // O partial slice, fp32, vecRows x D
    uint32_t accUb;    // running output, fp32, rows x D
    uint32_t outUb;    // output slice, input dtype, vecRows x D
    uint32_t rowUb;    // one per-row statistic, fp32, rows
    uint32_t brcUb;    // a slice's per-row values broadcast to one 32-byte block per row
    uint32_t keyUb;    // one per-key row of a round (bias, column index, scratch), fp32
    uint32_t maskUb;   // key mask bytes of a round (MASK only)
    uint32_t maskHalfUb;  // the same as half (MASK only)
    uint32_t bitsUb;   // comparison bits of a slice
    uint32_t diagUb;   // band template c - r of a slice, fp32 (causal, window or ALiBi)
    uint32_t alibiUb;  // ALiBi distances of a slice, fp32 (ALiBi only)
    uint32_t philoxUb; // dropout's Philox scratch, passes of one round's width (dropout only)
    uint32_t keepUb;   // dropout's keep bits of one pass (dropout only)
};

// Dropout draws its keep mask in passes of RoundKeys elements (flash_attention_philox.h):
// the Philox scratch is kDropoutWordArrays words per element plus two 256-byte key rows
// (PhiloxScratchBytes; flash_attention_vector.h asserts the two agree).
constexpr uint32_t kDropoutWordArrays = 14;
__aicore__ inline constexpr uint32_t DropoutScratchBytes(uint32_t passElements)
{
    return kDropoutWordArrays * passElements * 4u + 2u * 256u;
}

// Per-row statistics the vector core keeps in one buffer: m, l, the ring of kAlphaRing
// rescale factors alpha (the O update runs one round behind the softmax), and the
// slice's max and sum. The lse output row has its own queue buffer.
constexpr uint32_t kAlphaRing = 2;
constexpr uint32_t kRowStats = 4 + kAlphaRing;
// Per-key rows the vector core keeps: key bias, column index, scratch.
constexpr uint32_t kKeyRows = 3;
// Double-buffered vector queues (S, P, O partial and output slices).
constexpr uint32_t kVecBuffers = 2;

__aicore__ inline BufferBytes ComputeBufferBytes(const TilingData& t, uint32_t elemBytes)
{
    const uint32_t bq = t.blockQ;
    const uint32_t bk = t.blockK;
    const uint32_t d = t.headDimPad;
    const uint32_t w = RoundKeys(t);
    const uint32_t vr = t.vecRows;
    BufferBytes b{};
    b.qL1 = bq * d * elemBytes;
    b.kL1 = bk * d * elemBytes;
    const uint32_t cr = t.cubeRows;
    const bool passes = CubeInPasses(t);
    b.vL1 = (passes ? w : bk) * d * elemBytes;
    b.pL1 = cr * bk * elemBytes;
    b.qL0a = cr * (passes && bk > d ? bk : d) * elemBytes;
    b.pL0a = passes ? 0u : cr * bk * elemBytes;
    b.l0b = bk * d * elemBytes;
    b.oL0c = cr * d * 4u;
    b.sL0c = cr * bk * 4u;
    b.sUb = vr * w * 4u;
    b.pUb = vr * w * elemBytes;
    b.oUb = vr * d * 4u;
    b.accUb = VectorRows(t) * d * 4u;
    b.outUb = vr * d * elemBytes;
    b.rowUb = AlignUp(VectorRows(t) * 4u, kByteBlock);
    b.brcUb = AlignUp(vr, 8u) * kByteBlock;
    b.keyUb = w * 4u;
    b.maskUb = AlignUp(w, kByteBlock);
    b.maskHalfUb = w * 2u;
    b.bitsUb = AlignUp(vr * w / 8u, kByteBlock);
    b.diagUb = vr * w * 4u;
    b.alibiUb = vr * w * 4u;
    b.philoxUb = DropoutScratchBytes(w);
    b.keepUb = AlignUp(w / 8u, kByteBlock);
    return b;
}

// The per-AI-core workspace through which the cube and vector cores exchange one
// round's data: kScoreSlots slots of S (fp32, blockQ x W), kProbSlots of P (input
// dtype, blockQ x W) and kOutputSlots of O (fp32, blockQ x D); round n of a core (counted
// over all its tiles) uses slot n mod the ring's size. Three S slots: the cube writes
// S(r+2) before it waits for P(r), so S(r), S(r+1) and S(r+2) are live at once; S(r-1)'s
// slot is free because the cube waited for P(r-1), which the vector cores write after
// reading S(r-1). Two of P and O: every slot is rewritten only after a cross-core flag
// shows that its previous contents were consumed (docs/kernel.md, "The workspace
// ring"). Rows have the round's width: S and P of a round with fewer sub-blocks are
// packed with that width. Offsets in bytes from the core's part of the user workspace.
constexpr uint32_t kScoreSlots = 3;
constexpr uint32_t kProbSlots = 2;
constexpr uint32_t kOutputSlots = 2;
// Rounds of S the cube computes before the P.V of the first: S(r + kScoresAhead) is
// issued before P.V(r).
constexpr uint32_t kScoresAhead = kScoreSlots - 1;

struct Workspace {
    uint64_t slotBytes[3];  // scores S (fp32), probabilities P (input dtype), output O (fp32)
    uint64_t scores;
    uint64_t probs;
    uint64_t output;
    uint64_t total;

    __aicore__ static uint64_t Align(uint64_t bytes) { return (bytes + 511) / 512 * 512; }

    __aicore__ Workspace(const TilingData& t, uint32_t elemBytes)
    {
        const uint64_t w = RoundKeys(t);
        slotBytes[0] = Align(uint64_t{t.blockQ} * w * 4);
        slotBytes[1] = Align(uint64_t{t.blockQ} * w * elemBytes);
        slotBytes[2] = Align(uint64_t{t.blockQ} * t.headDimPad * 4);
        scores = 0;
        probs = kScoreSlots * slotBytes[0];
        output = probs + kProbSlots * slotBytes[1];
        total = output + kOutputSlots * slotBytes[2];
    }
};

// A query tile: `rows` consecutive query rows of one (batch, head) pair -- with layout
// TND, of one (sequence, head) pair, `batch` then being the sequence's index. The
// sequence's own lengths and its offsets in GM travel with the tile, so the kernel
// addresses dense and packed layouts alike: query row r of the tile is element
// qBase + (row0 + r) * qStrideRow, its lse entry lseBase + row0 + r, key j of the
// sequence element kvBase + j * kvStrideRow.
struct QueryTile {
    uint32_t batch;
    uint32_t headQ;
    uint32_t headKv;
    uint32_t row0;
    uint32_t rows;
    uint32_t seqlenQ;      // this sequence's query rows
    uint32_t seqlenK;      // and keys
    int64_t causalOffset;  // seqlenK - seqlenQ of this sequence (bottom-right alignment)
    uint64_t qBase;
    uint64_t kvBase;
    uint64_t lseBase;
};

// The sequence-level fields of a tile of (batch, headQ) with the given lengths, whose
// first query row and first key are tokens q0 and k0 of a packed (TND) tensor, or rows
// 0 of batch `batch` of a dense one (q0 = k0 = 0).
__aicore__ inline void PlaceTile(const TilingData& t, uint32_t batch, uint32_t headQ, uint32_t seqlenQ,
                                 uint32_t seqlenK, uint64_t q0, uint64_t k0, QueryTile& tile)
{
    tile.batch = batch;
    tile.headQ = headQ;
    tile.headKv = headQ / t.group;
    tile.seqlenQ = seqlenQ;
    tile.seqlenK = seqlenK;
    tile.causalOffset = static_cast<int64_t>(seqlenK) - seqlenQ;
    tile.qBase = uint64_t{batch} * t.qStrideBatch + uint64_t{headQ} * t.qStrideHead + q0 * t.qStrideRow;
    tile.kvBase = uint64_t{batch} * t.kvStrideBatch + uint64_t{tile.headKv} * t.kvStrideHead +
                  k0 * t.kvStrideRow;
    tile.lseBase = t.layout == static_cast<uint32_t>(Layout::TND)
                       ? uint64_t{headQ} * t.tokensQ + q0
                       : (uint64_t{batch} * t.headsQ + headQ) * t.seqlenQ;
}

// A dense layout's tile of rows [row0, row0 + rows) of (batch, headQ).
__aicore__ inline QueryTile DenseTile(const TilingData& t, uint32_t batch, uint32_t headQ, uint32_t row0,
                                      uint32_t rows)
{
    QueryTile tile{};
    PlaceTile(t, batch, headQ, t.seqlenQ, t.seqlenK, 0, 0, tile);
    tile.row0 = row0;
    tile.rows = rows;
    return tile;
}

// The tiles of one core, in order: its row range is cut at (batch, head) boundaries
// and every blockQ rows. `cursor` starts at rowStart[core]. Dense layouts only (TND:
// PackedTileWalk, flash_cann_packed.h).
__aicore__ inline bool NextTile(const TilingData& t, uint64_t& cursor, uint64_t end,
                                QueryTile& tile)
{
    if (cursor >= end) {
        return false;
    }
    const uint64_t pair = cursor / t.seqlenQ;  // batch * headsQ + head
    const uint32_t row = static_cast<uint32_t>(cursor - pair * t.seqlenQ);
    uint64_t rows = t.seqlenQ - row;
    if (rows > t.blockQ) {
        rows = t.blockQ;
    }
    if (rows > end - cursor) {
        rows = end - cursor;
    }
    const uint32_t batch = static_cast<uint32_t>(pair / t.headsQ);
    tile = DenseTile(t, batch, static_cast<uint32_t>(pair - static_cast<uint64_t>(batch) * t.headsQ), row,
                     static_cast<uint32_t>(rows));
    cursor += rows;
    return true;
}

// The keys a tile visits: [begin, end) holds every key some row of the tile sees under
// the bottom-right causal mask and the sliding window (flash_cann_variant.h), with begin
// rounded down to a blockK boundary (the cube loads whole sub-blocks); key blocks wholly
// outside the tile's band are never visited. begin == end: the tile sees no key.
struct KeyRange {
    uint32_t begin;
    uint32_t end;
};

template <bool CAUSAL>
__aicore__ inline KeyRange TileKeys(const TilingData& t, const QueryTile& tile)
{
    const int64_t firstDiagonal = static_cast<int64_t>(tile.row0) + tile.causalOffset;
    const int64_t lastDiagonal = firstDiagonal + tile.rows - 1;
    int64_t end = tile.seqlenK;
    if (CAUSAL) {
        end = lastDiagonal + 1 < end ? lastDiagonal + 1 : end;
    } else if (t.variant.windowRight >= 0) {
        const int64_t right = lastDiagonal + t.variant.windowRight + 1;
        end = right < end ? right : end;
    }
    int64_t begin = 0;
    if (t.variant.windowLeft >= 0 && firstDiagonal - t.variant.windowLeft > 0) {
        begin = firstDiagonal - t.variant.windowLeft;
    }
    if (end <= begin) {
        return {0, 0};
    }
    return {static_cast<uint32_t>(begin) / t.blockK * t.blockK, static_cast<uint32_t>(end)};
}

// One round of a tile: keys [key0, key0 + columns) in `subBlocks` sub-blocks of
// blockK keys; S and P rows of the round are `width` = subBlocks x blockK wide (the
// last sub-block's keys past `columns` are zero-padded by the cube and masked by the
// vector cores). Rounds lie on one grid for every tile, key0 a multiple of RoundKeys:
// a row's keys then sit at the same columns of the same rounds whichever tile holds the
// row, so its result does not depend on how rows are cut into tiles and split over
// cores (batch and core-count invariance, bit for bit). The sub-blocks before
// `firstSub` hold keys no row of the tile sees (a window's left edge inside the
// tile's first round): the cube skips them, and the vector cores' band mask sets
// their columns to -inf whatever the workspace holds there.
struct KeyRound {
    uint32_t key0;
    uint32_t columns;
    uint32_t subBlocks;
    uint32_t width;
    uint32_t firstSub;
};

// Rounds of a tile whose keys are `keys`: the grid cells of RoundKeys keys they touch.
__aicore__ inline uint32_t RoundCount(const TilingData& t, const KeyRange& keys)
{
    if (keys.end == keys.begin) {
        return 0;
    }
    const uint32_t w = RoundKeys(t);
    return (keys.end + w - 1) / w - keys.begin / w;
}

__aicore__ inline KeyRound MakeRound(const TilingData& t, const KeyRange& keys, uint32_t round)
{
    const uint32_t w = RoundKeys(t);
    KeyRound r;
    r.key0 = (keys.begin / w + round) * w;
    r.columns = MinU32(w, keys.end - r.key0);
    r.subBlocks = (r.columns + t.blockK - 1) / t.blockK;
    r.width = r.subBlocks * t.blockK;
    r.firstSub = round == 0 ? (keys.begin - r.key0) / t.blockK : 0;
    return r;
}

}  // namespace flash_cann

#endif  // FLASH_CANN_TILING_H
