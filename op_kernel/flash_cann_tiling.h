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

enum class Layout : uint32_t { BNSD = 0, BSND = 1 };

// The tiling key selects one kernel instantiation: element type, causal, key mask.
// Decimal fields so a key reads as what it is: 1DCM (D: 0 fp16, 1 bf16).
constexpr uint64_t TilingKey(uint32_t isBf16, uint32_t causal, uint32_t hasMask)
{
    return 1000u + isBf16 * 100u + causal * 10u + hasMask;
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
    // Blocking: query tiles of up to blockQ rows, key blocks of blockK columns. Each of
    // the two vector cores of an AI core owns half of a tile's rows.
    uint32_t blockQ;
    uint32_t blockK;
    // How many copies of each double-bufferable buffer the kernel allocates.
    uint32_t kvL1Buffers;
    uint32_t pL1Buffers;
    uint32_t l0aBuffers;
    uint32_t l0bBuffers;
    uint32_t l0cBuffers;
    // Work split: AI core c owns the rows [rowStart[c], rowStart[c + 1]) of the
    // flattened (batch, head_q, seqlen_q) row space.
    uint32_t usedCores;
    uint32_t reserved;
    uint64_t rowStart[kMaxCores + 1];
    // Per-core user workspace (GM) for the cube <-> vector exchange: two slots each of
    // scores S (fp32), probabilities P (input dtype) and partial outputs O (fp32).
    uint64_t workspacePerCore;
};

__aicore__ inline uint32_t AlignUp(uint32_t value, uint32_t unit)
{
    return (value + unit - 1) / unit * unit;
}

__aicore__ inline uint32_t MinU32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

// Bytes of every buffer the kernel allocates, per copy (the *Buffers counts above say
// how many copies). One formula for the planner's accounting and the kernel's
// InitBuffer calls. AIC buffers live in L1/L0A/L0B/L0C; each AIV has its own UB.
struct BufferBytes {
    // AIC
    uint32_t qL1;      // query tile, A operand source (Nz)
    uint32_t kL1;      // key block (Nz = Zn of K^T)
    uint32_t vL1;      // value block (Nz)
    uint32_t pL1;      // probabilities tile, A operand source
    uint32_t l0a;      // A operand: Q (blockQ x D) or P (blockQ x blockK)
    uint32_t l0b;      // B operand: K^T or V (blockK x D)
    uint32_t l0c;      // result: S (blockQ x blockK) or O (blockQ x D), fp32
    // AIV (per vector core, rows = blockQ / 2)
    uint32_t sUb;      // scores rows, fp32
    uint32_t pUb;      // probabilities rows, input dtype
    uint32_t oUb;      // partial output rows, fp32
    uint32_t accUb;    // running output rows, fp32
    uint32_t outUb;    // final output rows, input dtype
    uint32_t rowUb;    // one per-row statistic (m, l, ...), fp32
    uint32_t brcUb;    // a per-row statistic broadcast to one 32-byte block per row
    uint32_t keyUb;    // one per-key row (bias, column index, reduce scratch), fp32
    uint32_t maskUb;   // key mask bytes
    uint32_t maskHalfUb;
    uint32_t bitsUb;   // comparison bit mask
};

// Per-row statistics the vector core keeps: m, l, block max, block sum, alpha, lse.
constexpr uint32_t kRowStats = 6;
// Per-key rows the vector core keeps: key bias, column index, reduction scratch.
constexpr uint32_t kKeyRows = 3;

__aicore__ inline BufferBytes ComputeBufferBytes(const TilingData& t, uint32_t elemBytes)
{
    const uint32_t bq = t.blockQ;
    const uint32_t bk = t.blockK;
    const uint32_t d = t.headDimPad;
    const uint32_t rows = bq / 2;
    BufferBytes b{};
    b.qL1 = bq * d * elemBytes;
    b.kL1 = bk * d * elemBytes;
    b.vL1 = bk * d * elemBytes;
    b.pL1 = bq * bk * elemBytes;
    b.l0a = bq * (d > bk ? d : bk) * elemBytes;
    b.l0b = bk * d * elemBytes;
    b.l0c = bq * (d > bk ? d : bk) * 4u;
    b.sUb = rows * bk * 4u;
    b.pUb = rows * bk * elemBytes;
    b.oUb = rows * d * 4u;
    b.accUb = rows * d * 4u;
    b.outUb = rows * d * elemBytes;
    b.rowUb = AlignUp(rows * 4u, kByteBlock);
    b.brcUb = AlignUp(rows, 8u) * kByteBlock;
    b.keyUb = bk * 4u;
    b.maskUb = AlignUp(bk, kByteBlock);
    b.maskHalfUb = bk * 2u;
    b.bitsUb = AlignUp(bk / 8u, kByteBlock);
    return b;
}

// The per-AI-core workspace through which the cube and vector cores exchange data: two
// slots of each buffer, so the cube computes S of block j+1 while the vector cores turn
// S of block j into P. Offsets in bytes from the core's part of the user workspace.
struct Workspace {
    uint64_t slotBytes[3];  // scores S (fp32), probabilities P (input dtype), output O (fp32)
    uint64_t scores;
    uint64_t probs;
    uint64_t output;
    uint64_t total;

    __aicore__ static uint64_t Align(uint64_t bytes) { return (bytes + 511) / 512 * 512; }

    __aicore__ Workspace(const TilingData& t, uint32_t elemBytes)
    {
        slotBytes[0] = Align(uint64_t{t.blockQ} * t.blockK * 4);
        slotBytes[1] = Align(uint64_t{t.blockQ} * t.blockK * elemBytes);
        slotBytes[2] = Align(uint64_t{t.blockQ} * t.headDimPad * 4);
        scores = 0;
        probs = 2 * slotBytes[0];
        output = probs + 2 * slotBytes[1];
        total = output + 2 * slotBytes[2];
    }
};

// A query tile: `rows` consecutive query rows of one (batch, head) pair.
struct QueryTile {
    uint32_t batch;
    uint32_t headQ;
    uint32_t headKv;
    uint32_t row0;
    uint32_t rows;
};

// The tiles of one core, in order: its row range is cut at (batch, head) boundaries
// and every blockQ rows. `cursor` starts at rowStart[core].
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
    tile.batch = static_cast<uint32_t>(pair / t.headsQ);
    tile.headQ = static_cast<uint32_t>(pair - static_cast<uint64_t>(tile.batch) * t.headsQ);
    tile.headKv = tile.headQ / t.group;
    tile.row0 = row;
    tile.rows = static_cast<uint32_t>(rows);
    cursor += rows;
    return true;
}

// Keys [0, KeyEnd) are visible to at least one row of the tile (bottom-right causal);
// 0 means the tile sees no key at all.
template <bool CAUSAL>
__aicore__ inline uint32_t KeyEnd(const TilingData& t, const QueryTile& tile)
{
    if (!CAUSAL) {
        return t.seqlenK;
    }
    const int64_t last = static_cast<int64_t>(tile.row0) + tile.rows + t.causalOffset;
    if (last <= 0) {
        return 0;
    }
    return last < static_cast<int64_t>(t.seqlenK) ? static_cast<uint32_t>(last) : t.seqlenK;
}

}  // namespace flash_cann

#endif  // FLASH_CANN_TILING_H
