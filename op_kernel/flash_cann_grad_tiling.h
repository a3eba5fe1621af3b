// The contract between the backward planner (op_host) and the backward kernel
// (op_kernel/flash_cann_attention_grad.cpp): the tiling data, the bytes of every buffer
// the kernel allocates, the GM workspace layout, and the walk over work units. Both
// sides include this header, so they cannot disagree on a layout, a size or a split.
//
// Stable interface: later changes are additive only (new fields at the end of
// GradTilingData, new functions), announced in the commit message.
//
// The backward in one paragraph (docs/kernel-backward.md has the timeline):
//   pre-pass    (AIV) zero the fp32 dQ accumulator; D = rowsum(dO * O) - dLSE per query
//               row into the workspace; SyncAll.
//   key pass    core c owns the work units [unitStart[c], unitStart[c+1]) of the
//               flattened (batch, head_kv, key block) space. Per unit, K and V stay in
//               L1; for every query head of the group and every query block that sees
//               the key block: S = Q K^T, dP = dO V^T (AIC); P = exp(S scale - lse),
//               dS = P (dP - D) (AIV); dV += P^T dO, dK += dS^T Q (AIC, in L0C over the
//               whole unit), and with the fast dQ dQ += dS K (AIC, fp32 atomic add into
//               the workspace, in column pieces of dqColumns). dK/dV of a unit leave L0C
//               once, to the fp32 workspace.
//   query pass  deterministic dQ only: core c owns the query units [queryStart[c],
//               queryStart[c+1]) of the flattened (batch, head_q, query block) space. Per
//               unit, Q and dO stay in L1; for every key block the query block sees, S
//               and dP again (AIC), dS again (AIV), dQ += dS K accumulated in L0C; dQ of
//               the unit leaves L0C once, a plain store: no atomics, and the sum's order
//               (key blocks ascending) depends on the problem alone. SyncAll.
//   post-pass   (AIV) dQ = scale * dQ, dK *= scale, cast, DataCopyPad into the output
//               layout.
// The products S, dP and the fast dQ leave L0C in pieces of productRows rows (and dQ of
// dqColumns columns), so the L0C scratch is productRows x max(blockK, dqColumns) fp32 and
// leaves room beside the dK/dV accumulators for longer key blocks.
#ifndef FLASH_CANN_GRAD_TILING_H
#define FLASH_CANN_GRAD_TILING_H

#include "flash_cann_tiling.h"

namespace flash_cann {

// The grad tiling key selects one kernel instantiation. Decimal fields, so a key reads as
// what it is: 2XDCM (X: deterministic dQ, D: 0 fp16 / 1 bf16 / 2 fp16 with fp16 scores,
// C: causal, M: key mask).
constexpr uint64_t GradTilingKey(uint32_t isBf16, uint32_t causal, uint32_t hasMask,
                                 uint32_t deterministic, uint32_t fp16Scores)
{
    return 20000u + deterministic * 1000u + (isBf16 + 2u * fp16Scores) * 100u + causal * 10u +
           hasMask;
}

// Cube <-> vector exchange slots per AI core (S, dP, P, dS each), used round-robin.
constexpr uint32_t kGradExchangeSlots = 2;
// GM regions of the workspace start on 512-byte boundaries.
constexpr uint64_t kGradWorkspaceAlign = 512;

struct GradTilingData {
    // Problem (elements unless a name says bytes); as TilingData.
    uint32_t batch;
    uint32_t headsQ;
    uint32_t headsKv;
    uint32_t group;        // headsQ / headsKv
    uint32_t seqlenQ;
    uint32_t seqlenK;
    uint32_t headDim;
    uint32_t headDimPad;   // headDim rounded up to kCubeBlock
    int64_t causalOffset;  // seqlenK - seqlenQ: query i sees key j iff j <= i + offset
    float scale;
    uint32_t layout;       // Layout
    // Strides (elements): query, out, grad_out and grad_query share theirs; key, value,
    // grad_key and grad_value share theirs.
    uint64_t qStrideBatch, qStrideHead, qStrideRow;
    uint64_t kvStrideBatch, kvStrideHead, kvStrideRow;
    // Blocking. blockQ, blockK: multiples of kCubeBlock (blockQ even, so the two vector
    // cores split a query block). keyBlocks = ceil(seqlenK / blockK). The AIC's L0C holds
    // the product scratch copies and both unit accumulators (see l0cScratchBuffers).
    uint32_t blockQ;
    uint32_t blockK;
    uint32_t keyBlocks;
    // Retired by issue 25 (the deterministic dQ has no per-chunk slots since): always
    // keyBlocks and 1; kept so that the layout only ever grows.
    uint32_t dqChunkBlocks;
    uint32_t dqSlots;
    // Rows per chunk of the pre- and post-passes (a multiple of 8).
    uint32_t passRows;
    // Work split: AI core c owns the units [unitStart[c], unitStart[c + 1]) of the
    // flattened (batch, head_kv, key block) space; units = batch * headsKv * keyBlocks.
    // The kernel is launched on exactly usedCores AI cores (SyncAll spans all of them).
    uint32_t usedCores;
    uint32_t reserved;
    uint64_t units;
    uint64_t unitStart[kMaxCores + 1];
    // Added after the first release (additive). Copies of the L0C product scratch (1 or
    // kGradMaxL0cScratch): with two, the cube multiplies the next S, dP or dQ while
    // Fixpipe drains the previous one; with one, every product waits for the last to
    // leave L0C. l0cScratchBuffers * l0c + dkL0c + dvL0c <= L0C.
    uint32_t l0cScratchBuffers;
    uint32_t reserved2;
    // Added with the features (additive): what the call computes beyond plain attention
    // (flash_cann_variant.h), as the forward had it.
    VariantTiling variant;
    // Added with packed sequences (additive). Layout TND: the packed query and key tokens;
    // the units are then walked and split on the device (flash_cann_packed.h) and
    // unitStart is unused.
    uint64_t tokensQ;
    uint64_t tokensK;
    // Added for issue 25 (additive). The L0C product scratch holds one piece of a product:
    // productRows rows (a multiple of kCubeBlock, at most blockQ) of S, dP or the fast dQ,
    // and of dQ = dS K dqColumns columns (a multiple of kCubeBlock: one Mmad per column
    // panel range of K, n = dqColumns; the last piece may be narrower). Scratch copy:
    // productRows x max(blockK, dqColumns) fp32.
    uint32_t productRows;
    uint32_t dqColumns;
    // The deterministic dQ's query pass (dense layouts): queryBlocks = ceil(seqlenQ /
    // blockQ); core c owns the query units [queryStart[c], queryStart[c + 1]) of the
    // flattened (batch, head_q, query block) space, queryUnits in all. Zero for the fast
    // dQ, and with layout TND (the device walks and splits the query units).
    uint32_t queryBlocks;
    uint32_t reserved3;
    uint64_t queryUnits;
    uint64_t queryStart[kMaxCores + 1];
    // Added with the fp16-score fast path (additive). 1: S leaves the cube as fp16 into
    // the exchange slots (fp16 inputs only; the tiling key's D digit 2); dP stays fp32.
    uint32_t fp16Scores;
};

// The most L0C product scratch copies the planner gives the kernel.
constexpr uint32_t kGradMaxL0cScratch = 2;

// The depth of the S product Q K^T: headDimPad, and with fp16 scores one more 16-column
// panel (kScoreOffsetColumns) on each side, Q's holding -c / 16 in every column and K's
// ones, so that the product is S - c, c the row's offset (flash_attention_scores.h).
__aicore__ inline uint32_t ScoreDepth(const GradTilingData& t)
{
    return t.headDimPad + (t.fp16Scores != 0 ? kScoreOffsetColumns : 0u);
}

// Bytes of every buffer the kernel allocates: one copy each unless its comment gives a
// count. One formula for the planner's accounting and the kernel's InitBuffer
// calls. AIC buffers live in L1/L0A/L0B/L0C; each AIV has its own UB.
struct GradBufferBytes {
    // AIC, L1 (Nz)
    uint32_t qL1;       // query block (blockQ x ScoreDepth: the offset panel with fp16
                        // scores) (kGradStepsInFlight of them)
    uint32_t doL1;      // grad_out block (blockQ x D) (kGradStepsInFlight of them)
    uint32_t kL1;       // key block (blockK x ScoreDepth: the ones panel with fp16 scores),
                        // resident for a unit (kGradStepsInFlight)
    uint32_t vL1;       // value block (blockK x D), resident for a unit (kGradStepsInFlight)
    uint32_t pL1;       // probabilities (blockQ x blockK)
    uint32_t dsL1;      // dS (blockQ x blockK)
    // AIC, L0
    uint32_t l0a;       // A: Q (with its offset panel), dO, dS (blockQ rows) or P^T, dS^T
                        // (blockK rows)
    uint32_t l0b;       // B: K^T (with the ones panel), V^T (D x blockK) or dO, Q (blockQ x
                        // D) or K (blockK x D)
    uint32_t l0c;       // product scratch: a piece of S, dP (productRows x blockK) or dQ
                        // (productRows x dqColumns), fp32 (l0cScratchBuffers of them)
    uint32_t dkL0c;     // dK accumulator of a unit (blockK x D), fp32
    uint32_t dvL0c;     // dV accumulator of a unit (blockK x D), fp32; the deterministic
                        // query pass accumulates dQ (blockQ x D <= 2 blockK x D) in the
                        // place of both
    // AIV, main loop (rows = blockQ / 2 per vector core)
    uint32_t sUb;       // S rows as the exchange slot holds them (fp32; fp16 with fp16Scores)
    uint32_t dpUb;      // dP rows, fp32 (becomes dS in fp32)
    uint32_t pUb;       // P rows, input dtype
    uint32_t dsUb;      // dS rows, input dtype
    uint32_t rowUb;     // one per-row statistic, fp32 (kGradRowStats of them: lse, D)
    uint32_t brcUb;     // a per-row statistic broadcast to one 32-byte block per row
    uint32_t keyUb;     // one per-key row (bias, column index, scratch), fp32, kKeyLanes-padded
    uint32_t maskUb;    // key mask bytes (with a key mask only)
    uint32_t maskHalfUb;  // the key mask as half (with a key mask only)
    uint32_t bitsUb;    // comparison bit mask
    // AIV, pre- and post-passes (passRows rows of D)
    uint32_t passInUb;  // rows of dO or O, input dtype (two of them)
    uint32_t passAccUb; // rows in fp32 (three: accumulator, operand, load from GM)
    uint32_t passOutUb; // rows of a gradient, input dtype
    uint32_t passRowUb; // one value per row, fp32 (two: D, partial row sums)
    // AIV, features (flash_cann_variant.h): 0 bytes, and no buffer, when the call does not
    // use the feature. Rows as the main loop's (blockQ / 2 x blockK).
    uint32_t tanhUb;      // tanh(S / softcap), fp32: the softcap chain rule needs it for dS
    uint32_t featureUb;   // scratch rows, fp32 (softcap's exp, ALiBi's distances)
    uint32_t alibiUb;     // ALiBi's column-minus-row template, fp32
    uint32_t bandKeyUb;   // the window's column index, fp32, kKeyLanes-padded
    uint32_t bandBitsUb;  // the window's comparison bit mask
    uint32_t philoxUb;    // dropout: PhiloxDropout's scratch for passes of GradDropoutPass
    uint32_t keepUb;      // dropout: the tile's keep bits (rows x blockK bits)
    // AIV, the fp16-score path only (0 bytes, no buffer, otherwise).
    uint32_t sF32Ub;      // S rows widened to fp32 (becomes P in fp32)
};

// Per-row statistics of the main loop's vector core: lse, D.
constexpr uint32_t kGradRowStats = 2;
// Per-key rows: key bias, column index, scratch (as the forward's).
constexpr uint32_t kGradKeyRows = kKeyRows;
// Per-key rows span whole fp32 vector repeats (Compares works on 256-byte repeats).
constexpr uint32_t kKeyLanes = 64;

// Dropout's keep mask is drawn in passes of this many elements (PhiloxDropout: a multiple
// of 256, whole rows of blockK keys): 8 rows where 8 blockK is whole repeats of 256, else
// 16 (blockK is a multiple of 16).
__aicore__ inline constexpr uint32_t GradDropoutPass(uint32_t blockK)
{
    return (8u * blockK % 256u == 0u ? 8u : 16u) * blockK;
}

// PhiloxScratchBytes (flash_attention_philox.h, a kernel header the host does not
// include) for GradDropoutPass(blockK): fourteen uint32 word arrays and two key repeats;
// the vector kernel static_asserts the two agree.
__aicore__ inline constexpr uint32_t GradPhiloxScratchBytes(uint32_t blockK)
{
    return 14u * GradDropoutPass(blockK) * 4u + 512u;
}

__aicore__ inline GradBufferBytes ComputeGradBufferBytes(const GradTilingData& t, uint32_t elemBytes)
{
    const uint32_t bq = t.blockQ;
    const uint32_t bk = t.blockK;
    const uint32_t d = t.headDimPad;
    const uint32_t rows = bq / 2;
    const uint32_t qk = bq * bk;
    // S = Q K^T runs over depth ds: with fp16 scores Q carries the offset panel and K the
    // ones panel (ScoreDepth).
    const uint32_t ds = ScoreDepth(t);
    GradBufferBytes b{};
    b.qL1 = bq * ds * elemBytes;
    b.doL1 = bq * d * elemBytes;
    b.kL1 = bk * ds * elemBytes;
    b.vL1 = bk * d * elemBytes;
    b.pL1 = qk * elemBytes;
    b.dsL1 = qk * elemBytes;
    b.l0a = (bq * ds > qk ? bq * ds : qk) * elemBytes;
    b.l0b = (bk * ds > bq * d ? bk * ds : bq * d) * elemBytes;
    b.l0c = t.productRows * (bk > t.dqColumns ? bk : t.dqColumns) * 4u;
    b.dkL0c = bk * d * 4u;
    b.dvL0c = bk * d * 4u;
    b.sUb = rows * bk * (t.fp16Scores != 0 ? 2u : 4u);
    b.sF32Ub = t.fp16Scores != 0 ? rows * bk * 4u : 0u;
    b.dpUb = rows * bk * 4u;
    b.pUb = rows * bk * elemBytes;
    b.dsUb = rows * bk * elemBytes;
    b.rowUb = AlignUp(rows * 4u, kByteBlock);
    b.brcUb = AlignUp(rows, 8u) * kByteBlock;
    const uint32_t lanes = AlignUp(bk, kKeyLanes);
    b.keyUb = lanes * 4u;
    b.maskUb = lanes;
    b.maskHalfUb = lanes * 2u;
    b.bitsUb = AlignUp(lanes / 8u, kByteBlock);
    b.passInUb = t.passRows * d * elemBytes;
    b.passAccUb = t.passRows * d * 4u;
    b.passOutUb = t.passRows * d * elemBytes;
    b.passRowUb = AlignUp(t.passRows * 4u, kByteBlock);
    const VariantTiling& v = t.variant;
    b.tanhUb = v.softcap > 0.0f ? rows * bk * 4u : 0u;
    b.featureUb = v.softcap > 0.0f || v.alibi != 0u ? rows * bk * 4u : 0u;
    b.alibiUb = v.alibi != 0u ? rows * bk * 4u : 0u;
    b.bandKeyUb = IsWindowed(v) ? b.keyUb : 0u;
    b.bandBitsUb = IsWindowed(v) ? b.bitsUb : 0u;
    b.philoxUb = v.dropoutP > 0.0f ? GradPhiloxScratchBytes(bk) : 0u;
    b.keepUb = v.dropoutP > 0.0f ? AlignUp(rows * bk / 8u, kByteBlock) : 0u;
    return b;
}

// The flattened query rows (the lse / D / dQ row space) and key rows (dK, dV): (batch,
// head, seqlen), or with layout TND (head, token), as softmax_lse (heads_q, tokens_q).
__aicore__ inline bool IsPacked(const GradTilingData& t)
{
    return t.layout == static_cast<uint32_t>(Layout::TND);
}

__aicore__ inline uint64_t GradQueryRows(const GradTilingData& t)
{
    return IsPacked(t) ? uint64_t{t.headsQ} * t.tokensQ : uint64_t{t.batch} * t.headsQ * t.seqlenQ;
}

__aicore__ inline uint64_t GradKeyRows(const GradTilingData& t)
{
    return IsPacked(t) ? uint64_t{t.headsKv} * t.tokensK : uint64_t{t.batch} * t.headsKv * t.seqlenK;
}

// Rows of one (batch, head) pair of those row spaces, as the pre- and post-passes cut
// them (NextPassChunk): with TND a pair is a head and its rows are all its tokens.
__aicore__ inline uint32_t GradQueryRowsPerPair(const GradTilingData& t)
{
    return IsPacked(t) ? static_cast<uint32_t>(t.tokensQ) : t.seqlenQ;
}

__aicore__ inline uint32_t GradKeyRowsPerPair(const GradTilingData& t)
{
    return IsPacked(t) ? static_cast<uint32_t>(t.tokensK) : t.seqlenK;
}

// The user workspace (GM), byte offsets from its start; every region 512-byte aligned.
//   delta     D = rowsum(dO * O) - dLSE, fp32, one per query row (GradQueryRows)
//   dq        the fp32 dQ accumulator [query row][headDimPad]
//   dk, dv    fp32 [key row][headDimPad] (GradKeyRows), unscaled
//   exchange  per AI core, kGradExchangeSlots slots of S and dP (fp32) and P and dS
//             (input dtype), blockQ x blockK each, row-major
//   offsets   fp16 scores only: per query row kScoreOffsetColumns halves, -c / 16 in
//             each (c the row's score offset, from lse): the rows of Q's offset panel.
//             After the exchange, so that the packed layouts' zeroing of dq .. exchange
//             never meets the pre-pass's writes of it.
struct GradWorkspace {
    uint64_t delta;
    uint64_t dq;
    uint64_t dk;
    uint64_t dv;
    uint64_t exchange;
    uint64_t offsets;
    uint64_t exchangePerCore;
    uint64_t scoresSlot;  // bytes of one fp32 slot (S or dP)
    uint64_t probsSlot;   // bytes of one input-dtype slot (P or dS)
    uint64_t total;

    __aicore__ static uint64_t Align(uint64_t bytes)
    {
        return (bytes + kGradWorkspaceAlign - 1) / kGradWorkspaceAlign * kGradWorkspaceAlign;
    }

    __aicore__ GradWorkspace(const GradTilingData& t, uint32_t elemBytes)
    {
        const uint64_t queryRows = GradQueryRows(t);
        const uint64_t keyRows = GradKeyRows(t);
        delta = 0;
        dq = Align(queryRows * 4);
        dk = dq + Align(queryRows * t.headDimPad * 4);
        dv = dk + Align(keyRows * t.headDimPad * 4);
        exchange = dv + Align(keyRows * t.headDimPad * 4);
        scoresSlot = Align(uint64_t{t.blockQ} * t.blockK * 4);
        probsSlot = Align(uint64_t{t.blockQ} * t.blockK * elemBytes);
        exchangePerCore = kGradExchangeSlots * 2 * (scoresSlot + probsSlot);
        offsets = exchange + t.usedCores * exchangePerCore;
        total = offsets + (t.fp16Scores != 0 ? Align(queryRows * kScoreOffsetColumns * 2) : 0);
    }
};

// ---- The main loop's work walk ------------------------------------------------------

// One work unit: a key block of one (batch, kv head), with the query blocks that see it.
// With layout TND, of one (sequence, kv head): `batch` is the sequence's index, and the
// sequence's lengths and first tokens come with the unit (dense: the problem's, and 0).
struct GradUnit {
    uint32_t batch;
    uint32_t headKv;
    uint32_t keyBlock;
    uint32_t key0;             // first key
    uint32_t keys;             // keys in the block (< blockK only for the last block)
    uint32_t firstQueryBlock;  // query blocks [firstQueryBlock, endQueryBlock) see a key
    uint32_t endQueryBlock;    // of it; none (first == end) when a window hides the block
    uint32_t seqlenQ;          // the sequence's query rows and keys
    uint32_t seqlenK;
    int64_t causalOffset;      // seqlenK - seqlenQ of the sequence
    uint64_t q0;               // its first query token and key token (TND; 0 dense)
    uint64_t k0;
};

// The query rows [first, end) that see a key of [key0, key0 + keys). Query row i sees
// key j only if i + causalOffset - left <= j <= i + causalOffset + right (bottom-right
// aligned, flash_cann_variant.h; causal is right = 0, a window side < 0 is unbounded),
// so the block's keys are seen by rows key0 - causalOffset - right .. key0 + keys - 1 -
// causalOffset + left. Rows outside are skipped, not masked: a sliding window costs its
// band, not the square.
template <bool CAUSAL>
__aicore__ inline void QueryRowRange(const GradTilingData& t, uint32_t key0, uint32_t keys,
                                     uint32_t& first, uint32_t& end, int64_t seqlenQ, int64_t causalOffset)
{
    int64_t lo = 0;
    int64_t hi = seqlenQ;  // exclusive
    const int64_t right = CAUSAL ? 0 : t.variant.windowRight;
    if (right >= 0) {
        lo = static_cast<int64_t>(key0) - causalOffset - right;
    }
    if (t.variant.windowLeft >= 0) {
        hi = static_cast<int64_t>(key0) + keys - 1 - causalOffset + t.variant.windowLeft + 1;
    }
    lo = lo < 0 ? 0 : (lo > seqlenQ ? seqlenQ : lo);
    hi = hi < lo ? lo : (hi > seqlenQ ? seqlenQ : hi);
    first = static_cast<uint32_t>(lo);
    end = static_cast<uint32_t>(hi);
}

// The dense problem's rows (every batch has seqlenQ query rows).
template <bool CAUSAL>
__aicore__ inline void QueryRowRange(const GradTilingData& t, uint32_t key0, uint32_t keys,
                                     uint32_t& first, uint32_t& end)
{
    QueryRowRange<CAUSAL>(t, key0, keys, first, end, t.seqlenQ, t.causalOffset);
}

// Key block `keyBlock` of (batch, headKv), a sequence of seqlenQ query rows and seqlenK
// keys starting at tokens q0 and k0 (dense: the problem's lengths, 0 and 0).
template <bool CAUSAL>
__aicore__ inline GradUnit MakeUnit(const GradTilingData& t, uint32_t batch, uint32_t headKv,
                                    uint32_t keyBlock, uint32_t seqlenQ, uint32_t seqlenK, uint64_t q0,
                                    uint64_t k0)
{
    GradUnit u{};
    u.batch = batch;
    u.headKv = headKv;
    u.keyBlock = keyBlock;
    u.seqlenQ = seqlenQ;
    u.seqlenK = seqlenK;
    u.causalOffset = static_cast<int64_t>(seqlenK) - seqlenQ;
    u.q0 = q0;
    u.k0 = k0;
    u.key0 = keyBlock * t.blockK;
    u.keys = MinU32(t.blockK, seqlenK - u.key0);
    uint32_t firstRow, endRow;
    QueryRowRange<CAUSAL>(t, u.key0, u.keys, firstRow, endRow, seqlenQ, u.causalOffset);
    u.firstQueryBlock = firstRow / t.blockQ;
    u.endQueryBlock = endRow > firstRow ? (endRow + t.blockQ - 1) / t.blockQ : u.firstQueryBlock;
    return u;
}

// A unit index of a flattened (batch, head, block) space, block fastest, in its parts:
// the key pass's units (head_kv, key block) and the query pass's (head_q, query block).
struct UnitPosition {
    uint32_t batch;
    uint32_t head;
    uint32_t block;
};

__aicore__ inline UnitPosition SplitUnit(uint64_t unit, uint32_t heads, uint32_t blocks)
{
    const uint64_t pair = unit / blocks;  // batch * heads + head
    UnitPosition p{};
    p.batch = static_cast<uint32_t>(pair / heads);
    p.head = static_cast<uint32_t>(pair - uint64_t{p.batch} * heads);
    p.block = static_cast<uint32_t>(unit - pair * blocks);
    return p;
}

template <bool CAUSAL>
__aicore__ inline GradUnit UnitAt(const GradTilingData& t, uint64_t unit)
{
    const UnitPosition p = SplitUnit(unit, t.headsKv, t.keyBlocks);
    return MakeUnit<CAUSAL>(t, p.batch, p.head, p.block, t.seqlenQ, t.seqlenK, 0, 0);
}

// Where a unit's rows live: query row `row` of query head headQ (element offset in
// query / out / grad_out / grad_query, and index in the lse / D / dQ row space), and key
// `key` of the unit's sequence (element offset in key / value, and dK / dV row).
__aicore__ inline uint64_t QueryElement(const GradTilingData& t, const GradUnit& u, uint32_t headQ, uint32_t row)
{
    return uint64_t{u.batch} * t.qStrideBatch + uint64_t{headQ} * t.qStrideHead + (u.q0 + row) * t.qStrideRow;
}

__aicore__ inline uint64_t QueryRowIndex(const GradTilingData& t, const GradUnit& u, uint32_t headQ, uint32_t row)
{
    return IsPacked(t) ? uint64_t{headQ} * t.tokensQ + u.q0 + row
                       : (uint64_t{u.batch} * t.headsQ + headQ) * t.seqlenQ + row;
}

__aicore__ inline uint64_t KeyElement(const GradTilingData& t, const GradUnit& u, uint32_t key)
{
    return uint64_t{u.batch} * t.kvStrideBatch + uint64_t{u.headKv} * t.kvStrideHead + (u.k0 + key) * t.kvStrideRow;
}

__aicore__ inline uint64_t KeyRowIndex(const GradTilingData& t, const GradUnit& u, uint32_t key)
{
    return IsPacked(t) ? uint64_t{u.headKv} * t.tokensK + u.k0 + key
                       : (uint64_t{u.batch} * t.headsKv + u.headKv) * t.seqlenK + key;
}

// The cube work of a unit, in query blocks (the planner balances unitStart on it).
template <bool CAUSAL>
__aicore__ inline uint64_t UnitCost(const GradTilingData& t, uint64_t unit)
{
    const GradUnit u = UnitAt<CAUSAL>(t, unit);
    return uint64_t{t.group} * (u.endQueryBlock - u.firstQueryBlock);
}

// One step of a unit: a query block of one query head of the group.
struct GradStep {
    uint32_t headQ;
    uint32_t row0;
    uint32_t rows;
    bool first;  // the unit's first step (the dK/dV accumulators start here)
    bool last;   // the unit's last step (dK/dV leave L0C after it)
};

// The steps of a unit in order: query head of the group, then query block. `index`
// counts from 0; false once the unit is done.
__aicore__ inline bool StepAt(const GradTilingData& t, const GradUnit& u, uint32_t index,
                              GradStep& step)
{
    const uint32_t perHead = u.endQueryBlock - u.firstQueryBlock;
    const uint32_t steps = t.group * perHead;
    if (index >= steps) {
        return false;
    }
    const uint32_t g = index / perHead;
    const uint32_t block = u.firstQueryBlock + (index - g * perHead);
    step.headQ = u.headKv * t.group + g;
    step.row0 = block * t.blockQ;
    step.rows = MinU32(t.blockQ, u.seqlenQ - step.row0);
    step.first = index == 0;
    step.last = index + 1 == steps;
    return true;
}

// ---- The deterministic dQ's query pass: query units --------------------------------

// The key blocks [first, end) that query rows [row0, row0 + rows) see: QueryRowRange's
// band read the other way (row i sees keys i + causalOffset - left .. i + causalOffset +
// right), so a query block walks key block j exactly when j's unit walks the query block.
template <bool CAUSAL>
__aicore__ inline void KeyBlockRange(const GradTilingData& t, uint32_t row0, uint32_t rows, int64_t seqlenK,
                                     int64_t causalOffset, uint32_t& first, uint32_t& end)
{
    int64_t lo = 0;
    int64_t hi = seqlenK;  // exclusive
    const int64_t right = CAUSAL ? 0 : t.variant.windowRight;
    if (right >= 0) {
        hi = static_cast<int64_t>(row0) + rows - 1 + causalOffset + right + 1;
    }
    if (t.variant.windowLeft >= 0) {
        lo = static_cast<int64_t>(row0) + causalOffset - t.variant.windowLeft;
    }
    lo = lo < 0 ? 0 : (lo > seqlenK ? seqlenK : lo);
    hi = hi < lo ? lo : (hi > seqlenK ? seqlenK : hi);
    first = static_cast<uint32_t>(lo / t.blockK);
    end = hi > lo ? static_cast<uint32_t>((hi + t.blockK - 1) / t.blockK) : first;
}

// A query unit: one query block of one (batch, head_q), with the key blocks it sees; with
// layout TND of one (sequence, head_q), as GradUnit.
struct GradQueryUnit {
    uint32_t batch;
    uint32_t headQ;
    uint32_t row0;
    uint32_t rows;
    uint32_t firstKeyBlock;  // key blocks [firstKeyBlock, endKeyBlock) are seen by a row
    uint32_t endKeyBlock;
    uint32_t seqlenQ;
    uint32_t seqlenK;
    uint64_t q0;
    uint64_t k0;
};

template <bool CAUSAL>
__aicore__ inline GradQueryUnit MakeQueryUnit(const GradTilingData& t, uint32_t batch, uint32_t headQ,
                                              uint32_t queryBlock, uint32_t seqlenQ, uint32_t seqlenK,
                                              uint64_t q0, uint64_t k0)
{
    GradQueryUnit q{};
    q.batch = batch;
    q.headQ = headQ;
    q.row0 = queryBlock * t.blockQ;
    q.rows = MinU32(t.blockQ, seqlenQ - q.row0);
    q.seqlenQ = seqlenQ;
    q.seqlenK = seqlenK;
    q.q0 = q0;
    q.k0 = k0;
    KeyBlockRange<CAUSAL>(t, q.row0, q.rows, seqlenK, static_cast<int64_t>(seqlenK) - seqlenQ, q.firstKeyBlock,
                          q.endKeyBlock);
    return q;
}

template <bool CAUSAL>
__aicore__ inline GradQueryUnit QueryUnitAt(const GradTilingData& t, uint64_t unit)
{
    const UnitPosition p = SplitUnit(unit, t.headsQ, t.queryBlocks);
    return MakeQueryUnit<CAUSAL>(t, p.batch, p.head, p.block, t.seqlenQ, t.seqlenK, 0, 0);
}

// The query pass's work of a query unit: its steps (the planner balances queryStart on it).
template <bool CAUSAL>
__aicore__ inline uint64_t QueryUnitCost(const GradTilingData& t, uint64_t unit)
{
    const GradQueryUnit q = QueryUnitAt<CAUSAL>(t, unit);
    return q.endKeyBlock - q.firstKeyBlock;
}

// Step `index` of a query unit, in the key pass's terms (the key block's GradUnit, the
// query block's GradStep), so that both halves compute a step of either pass with the
// same code; key blocks ascending. false once the unit is done.
template <bool CAUSAL>
__aicore__ inline bool QueryStepAt(const GradTilingData& t, const GradQueryUnit& q, uint32_t index,
                                   GradUnit& unit, GradStep& step)
{
    const uint32_t keyBlock = q.firstKeyBlock + index;
    if (keyBlock >= q.endKeyBlock) {
        return false;
    }
    unit = MakeUnit<CAUSAL>(t, q.batch, q.headQ / t.group, keyBlock, q.seqlenQ, q.seqlenK, q.q0, q.k0);
    step.headQ = q.headQ;
    step.row0 = q.row0;
    step.rows = q.rows;
    step.first = index == 0;
    step.last = keyBlock + 1 == q.endKeyBlock;
    return true;
}

// ---- Walking a pass's steps ----------------------------------------------------------

// The key pass's items are GradUnits: their steps are StepAt's.
struct KeyPassSteps {
    using Item = GradUnit;
    template <bool CAUSAL>
    __aicore__ static bool At(const GradTilingData& t, const GradUnit& item, uint32_t index, GradUnit& unit,
                              GradStep& step)
    {
        unit = item;
        return StepAt(t, item, index, step);
    }
};

struct QueryPassSteps {
    using Item = GradQueryUnit;
    template <bool CAUSAL>
    __aicore__ static bool At(const GradTilingData& t, const GradQueryUnit& item, uint32_t index,
                              GradUnit& unit, GradStep& step)
    {
        return QueryStepAt<CAUSAL>(t, item, index, unit, step);
    }
};

template <bool QUERY_PASS>
struct PassOf {
    using Type = KeyPassSteps;
};
template <>
struct PassOf<true> {
    using Type = QueryPassSteps;
};

// The steps of a sequence of items (`Items::Next(item)`: this core's units or query
// units, in order), each item's steps in order (Pass::At).
template <bool CAUSAL, typename Pass, typename Items>
class GradStepWalk {
public:
    __aicore__ GradStepWalk() = default;
    __aicore__ GradStepWalk(const GradTilingData& t, const Items& items) : t_(&t), items_(items) {}

    // Advances to the next step (unit and step then describe it); false when done.
    __aicore__ bool Next()
    {
        for (;;) {
            if (open_ && Pass::template At<CAUSAL>(*t_, item_, index_, unit, step)) {
                ++index_;
                return true;
            }
            if (!items_.Next(item_)) {
                return false;
            }
            index_ = 0;
            open_ = true;
        }
    }

    GradUnit unit{};
    GradStep step{};

private:
    const GradTilingData* t_ = nullptr;
    Items items_{};
    typename Pass::Item item_{};
    uint32_t index_ = 0;
    bool open_ = false;
};

// A dense split's items of one core: the units [unitStart[c], unitStart[c + 1]) (key
// pass) or query units [queryStart[c], queryStart[c + 1]) (query pass).
template <bool CAUSAL, bool QUERY_PASS>
class DenseItems {
public:
    __aicore__ DenseItems() = default;
    __aicore__ DenseItems(const GradTilingData& t, uint32_t core)
        : t_(&t),
          next_(QUERY_PASS ? t.queryStart[core] : t.unitStart[core]),
          end_(QUERY_PASS ? t.queryStart[core + 1] : t.unitStart[core + 1]) {}

    template <typename Item>
    __aicore__ bool Next(Item& item)
    {
        if (next_ >= end_) {
            return false;
        }
        if constexpr (QUERY_PASS) {
            item = QueryUnitAt<CAUSAL>(*t_, next_++);
        } else {
            item = UnitAt<CAUSAL>(*t_, next_++);
        }
        return true;
    }

private:
    const GradTilingData* t_ = nullptr;
    uint64_t next_ = 0;
    uint64_t end_ = 0;
};

// The steps of one core in a dense split (the planner's unitStart / queryStart).
template <bool CAUSAL, bool QUERY_PASS>
using DenseStepWalk = GradStepWalk<CAUSAL, typename PassOf<QUERY_PASS>::Type, DenseItems<CAUSAL, QUERY_PASS>>;

// Steps in flight on the cube: it issues S and dP of the next step before the products
// of the current one, so Q, dO, K and V have this many L1 buffers each.
constexpr uint32_t kGradStepsInFlight = 2;

// ---- The pre- and post-passes -------------------------------------------------------

// Vector core `aiv` of `aivs` owns rows [begin, end) of a row space of `total` rows.
__aicore__ inline void PassRange(uint64_t total, uint32_t aiv, uint32_t aivs, uint64_t& begin,
                                 uint64_t& end)
{
    begin = total * aiv / aivs;
    end = total * (aiv + 1) / aivs;
}

// A chunk of a pass: `rows` consecutive rows of one (batch, head) pair.
struct PassChunk {
    uint64_t pair;   // batch * heads + head
    uint32_t row0;
    uint32_t rows;
};

// The chunks of [cursor, end), cut at pair boundaries and every passRows rows.
__aicore__ inline bool NextPassChunk(const GradTilingData& t, uint32_t rowsPerPair, uint64_t& cursor,
                                     uint64_t end, PassChunk& chunk)
{
    if (cursor >= end) {
        return false;
    }
    chunk.pair = cursor / rowsPerPair;
    chunk.row0 = static_cast<uint32_t>(cursor - chunk.pair * rowsPerPair);
    uint64_t rows = rowsPerPair - chunk.row0;
    rows = rows < t.passRows ? rows : t.passRows;
    rows = rows < end - cursor ? rows : end - cursor;
    chunk.rows = static_cast<uint32_t>(rows);
    cursor += rows;
    return true;
}

}  // namespace flash_cann

#endif  // FLASH_CANN_GRAD_TILING_H
