#include "cost_model.h"
#include "plan_parts.h"

#include <algorithm>

#include "../../op_kernel/flash_cann_packed.h"


namespace flash_cann {
namespace {

// The incumbent: S1 128 rows per vector core, S2 128 x nRatio 8 keys per round
// (FlashAttentionScoreTilingS1s2Bn2gs1::CalcS1S2BasicBlock, CalcNRatio).
constexpr uint32_t kIncumbentRowsPerVectorCore = 128;
constexpr uint32_t kIncumbentKeysPerRound = 128 * 8;
constexpr uint32_t kIncumbentSlicesPerRound = 8;  // softmax on [S1 / nRatio, S2 x nRatio]

uint64_t CeilDiv(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

// The tile of `rows` query rows starting at `row0`, visiting `range` in rounds of `keys`;
// its band rounds hold keys visible to some of its rows but not all: past the first
// row's right bound (causal diagonal or window) or before the last row's left bound.
TileWork Tile(const TilingData& t, bool causal, const QueryTile& tile, const KeyRange& range,
              uint32_t keys)
{
    const uint32_t row0 = tile.row0;
    const uint32_t rows = tile.rows;
    // Rounds on the grid of `keys` (MakeRound): the cells the range touches.
    const uint32_t rounds = static_cast<uint32_t>(CeilDiv(range.end, keys) - range.begin / keys);
    const int64_t rightBound = causal ? 0 : t.variant.windowRight;
    uint32_t band = 0;
    if (rightBound >= 0) {
        const int64_t firstRowEnd = int64_t{row0} + tile.causalOffset + rightBound + 1;
        if (firstRowEnd < range.end) {
            band += rounds - static_cast<uint32_t>(
                                 std::max<int64_t>(0, firstRowEnd / keys - range.begin / keys));
        }
    }
    if (t.variant.windowLeft >= 0) {
        const int64_t lastRowBegin = int64_t{row0} + rows - 1 + tile.causalOffset - t.variant.windowLeft;
        if (lastRowBegin > range.begin) {
            band += static_cast<uint32_t>(CeilDiv(lastRowBegin, keys) - range.begin / keys);
        }
    }
    return {rows, rounds, std::min(band, rounds)};
}

// Every used core's tiles, walked as the kernel walks them.
std::vector<CoreWorkList> CoreTiles(const TilingData& t, bool causal, uint32_t keys)
{
    std::vector<CoreWorkList> cores(t.usedCores);
    for (uint32_t c = 0; c < t.usedCores; ++c) {
        uint64_t cursor = t.rowStart[c];
        QueryTile tile{};
        while (NextTile(t, cursor, t.rowStart[c + 1], tile)) {
            const KeyRange range = causal ? TileKeys<true>(t, tile) : TileKeys<false>(t, tile);
            if (range.end > range.begin) {
                AppendTile(cores[c], Tile(t, causal, tile, range, keys));
            }
        }
    }
    return cores;
}

// Host copies of cu_seqlens: the packed walk's Offsets reader, so the model walks the
// tiles the kernel walks on the device.
struct HostOffsets {
    const std::vector<int32_t>* q;
    const std::vector<int32_t>* k;
    int64_t Query(uint32_t b) const { return (*q)[b]; }
    int64_t Key(uint32_t b) const { return (*k)[b]; }
};

// Every used core's tiles under the device-side split of packed sequences
// (flash_cann_packed.h), as the kernel walks them.
template <bool CAUSAL>
std::vector<CoreWorkList> PackedCoreTiles(const TilingData& t, const HostOffsets& cu, uint32_t keys)
{
    std::vector<CoreWorkList> cores(t.usedCores);
    for (uint32_t c = 0; c < t.usedCores; ++c) {
        PackedTileWalk<CAUSAL, HostOffsets> walk;
        walk.Start(t, cu, c, t.usedCores);
        QueryTile tile{};
        while (walk.Next(tile)) {
            const KeyRange range = TileKeys<CAUSAL>(t, tile);
            if (range.end > range.begin) {
                AppendTile(cores[c], Tile(t, CAUSAL, tile, range, keys));
            }
        }
    }
    return cores;
}

// The incumbent's split (FlashAttentionScoreTilingS1s2Bn2gs1 with L1 reuse): the
// (batch, head, 128-row block) space cut into equal runs of splitFactor blocks, one run
// per pair of vector cores = one AI core, the two vector cores taking alternate blocks;
// a round of the AI core covers one block of each (256 rows).
std::vector<CoreWorkList> IncumbentTiles(const TilingData& t, bool causal,
                                                  uint32_t vectorCores)
{
    const uint64_t blocksPerHead = CeilDiv(t.seqlenQ, kIncumbentRowsPerVectorCore);
    const uint64_t total = uint64_t{t.batch} * t.headsQ * blocksPerHead;
    const uint64_t split = CeilDiv(total, std::min<uint64_t>(total, vectorCores)) * 2;
    std::vector<CoreWorkList> cores;
    for (uint64_t first = 0; first < total; first += split) {
        CoreWorkList tiles;
        for (uint64_t b = first; b < std::min(total, first + split); b += 2) {
            // The later block of the pair sees the most keys (causal).
            const uint64_t last = std::min(total, b + 2) - 1;
            const uint32_t row0 = static_cast<uint32_t>(last % blocksPerHead) *
                                  kIncumbentRowsPerVectorCore;
            const uint32_t rows = std::min(kIncumbentRowsPerVectorCore, t.seqlenQ - row0);
            const QueryTile tile = DenseTile(t, 0, 0, row0, rows);
            const KeyRange range = causal ? TileKeys<true>(t, tile) : TileKeys<false>(t, tile);
            if (range.end > range.begin) {
                QueryTile pair = tile;
                pair.rows = 2 * kIncumbentRowsPerVectorCore;
                AppendTile(tiles, Tile(t, causal, pair, range, kIncumbentKeysPerRound));
            }
        }
        cores.push_back(tiles);
    }
    return cores;
}

// PTO's split: (batch, head, CUBE_S0-row block) blocks, block b on AI core b mod cores.
std::vector<CoreWorkList> PtoTiles(const TilingData& t, bool causal, const PtoTiling& pto,
                                   uint32_t aiCores)
{
    const uint64_t blocksPerHead = CeilDiv(t.seqlenQ, pto.cubeS0);
    const uint64_t total = uint64_t{t.batch} * t.headsQ * blocksPerHead;
    std::vector<CoreWorkList> cores(std::min<uint64_t>(total, aiCores));
    for (uint64_t b = 0; b < total; ++b) {
        const uint32_t row0 = static_cast<uint32_t>(b % blocksPerHead) * pto.cubeS0;
        const QueryTile tile = DenseTile(t, 0, 0, row0, std::min(pto.cubeS0, t.seqlenQ - row0));
        const KeyRange range = causal ? TileKeys<true>(t, tile) : TileKeys<false>(t, tile);
        if (range.end > range.begin) {
            AppendTile(cores[b % cores.size()], Tile(t, causal, tile, range, pto.tileS1));
        }
    }
    return cores;
}

double HbmBytes(const PlanRequest& r)
{
    const double e = ElementBytes(r.dtype);
    if (r.layout == Layout::TND) {  // every token once: q, out, k, v, lse
        return 2.0 * r.tokensQ * r.headsQ * r.headDim * e + 2.0 * r.tokensK * r.headsKv * r.headDim * e +
               4.0 * r.tokensQ * r.headsQ;
    }
    const double qo = 2.0 * r.batch * r.headsQ * r.seqlenQ * r.headDim * e;
    const double kv = 2.0 * r.batch * r.headsKv * r.seqlenK * r.headDim * e;
    const double lse = 4.0 * r.batch * r.headsQ * r.seqlenQ;
    const double mask = r.hasMask ? static_cast<double>(r.batch) * r.seqlenK : 0.0;
    return qo + kv + lse + mask;
}

Prediction Finish(const KernelDesign& design, const std::vector<CoreWorkList>& cores,
                  const PlanRequest& r, const Platform& p)
{
    const SchedulePrediction s = PredictSchedule(design, cores, HbmBytes(r), r.hasMask, RatesFor(p));
    Prediction pr;
    pr.design = design.name;
    pr.seconds = s.seconds;
    pr.launchSeconds = s.launchSeconds;
    pr.hbmSeconds = s.hbmSeconds;
    pr.coreSeconds = s.coreSeconds;
    pr.meanCoreSeconds = s.meanCoreSeconds;
    pr.bound = s.bound;
    for (uint32_t e = 0; e < kEngines; ++e) {
        pr.engineBusySeconds.emplace_back(EngineName(Engine(e)), s.busy[e]);
    }
    pr.usefulFlops = 4.0 * r.headDim * r.batch * r.headsQ *
                     VisiblePairs(r.seqlenQ, r.seqlenK, r.causal, r.variant.windowLeft,
                                  r.variant.windowRight);
    pr.cubeUtilization = pr.seconds > 0 ? pr.usefulFlops / (pr.seconds * CubePeakFlops(p)) : 0;
    return pr;
}

// A TilingData with the problem of `r` (strides, sizes, causal offset), for designs
// planned outside MakePlan.
TilingData ProblemTiling(const PlanRequest& r)
{
    TilingData t{};
    SetProblem(t, r);
    return t;
}

}  // namespace

double VisiblePairs(int64_t seqlenQ, int64_t seqlenK, bool causal, int64_t windowLeft,
                    int64_t windowRight)
{
    if (windowLeft >= 0 || (!causal && windowRight >= 0)) {
        // A band: row i sees keys [i + offset - left, i + offset + right], clipped.
        const int64_t offset = seqlenK - seqlenQ;
        const int64_t right = causal ? 0 : windowRight;
        double pairs = 0;
        for (int64_t i = 0; i < seqlenQ; ++i) {
            const int64_t end = right >= 0 ? std::min(seqlenK, i + offset + right + 1) : seqlenK;
            const int64_t begin = windowLeft >= 0 ? std::max<int64_t>(0, i + offset - windowLeft) : 0;
            pairs += static_cast<double>(std::max<int64_t>(0, end - begin));
        }
        return pairs;
    }
    if (!causal) {
        return static_cast<double>(seqlenQ) * static_cast<double>(seqlenK);
    }
    // Row i sees max(0, i + offset + 1) keys, offset = seqlenK - seqlenQ; the last row
    // sees exactly seqlenK, so rows [first, seqlenQ) form an arithmetic series.
    const int64_t offset = seqlenK - seqlenQ;
    const int64_t first = std::max<int64_t>(0, -offset);       // first row that sees a key
    const double n = static_cast<double>(seqlenQ - first);
    const double a = static_cast<double>(first + offset + 1);  // keys seen by row `first`
    return n * a + n * (n - 1) / 2;
}

KernelDesign DesignFromTiling(const TilingData& t, uint32_t elemBytes)
{
    KernelDesign d;
    d.name = "flash-cann pipelined kernel (S two rounds ahead of P.V, one round stream over the core's tiles)";
    d.keysPerRound = RoundKeys(t);
    d.keysPerMatmul = t.blockK;
    d.headDimPad = t.headDimPad;
    d.elemBytes = elemBytes;
    d.vectorSlices = std::max<uint32_t>(1, (VectorRows(t) + t.vecRows - 1) / t.vecRows);
    d.ubScoreBuffers = 2;            // S, P, O-partial slices double-buffered in UB
    d.probBufferIsScratch = false;
    d.scoresAhead = kScoresAhead + 1;  // S(0), S(1), then S(r + 2) before PV(r)
    d.scoreSlots = kScoreSlots;
    d.probSlots = kProbSlots;
    d.outputSlots = kOutputSlots;
    d.outputDelay = 1;               // U(r - 1) after SM(r)
    d.loadsBeforeProbWait = true;    // V(r) and K(r + 2) issued before waiting for P(r)
    d.pipelineAcrossTiles = true;    // one round stream over the core's tiles (the cube's S
                                     // of the next tile before this tile's last P.V)
    // Q stays in L0A for the tile unless the cube works on it in row passes: then each
    // product loads its pass's Q from L1, V of a round stays in L1 for every pass (MTE1
    // moves it into L0B once per pass), and the passes' O share one L0C buffer.
    const bool passes = CubeInPasses(t);
    d.queryInL0a = !passes;
    d.cubeRows = passes ? t.cubeRows : 0;
    d.l0Buffers = std::min(t.l0aBuffers, t.l0bBuffers);
    d.l0cBuffers = t.l0cBuffers;     // the S ring
    d.outputOwnL0c = true;           // O accumulated over the stack in its own buffer
    d.causalMaskPerRow = false;      // one 2-D Compares + Select per slice (each band side)
    d.softcap = t.variant.softcap > 0.0f;
    d.alibi = t.variant.alibi != static_cast<uint32_t>(Alibi::kNone);
    d.dropoutPassElements = t.variant.dropoutP > 0.0f ? RoundKeys(t) : 0;  // as the kernel's passes
    return d;
}

KernelDesign IncumbentDesign(uint32_t headDimPad, uint32_t elemBytes)
{
    KernelDesign d;
    d.name = "incumbent FlashAttentionScore design (S1 128 x S2 1024 per vector core)";
    d.keysPerRound = kIncumbentKeysPerRound;
    d.keysPerMatmul = kIncumbentKeysPerRound / kIncumbentSlicesPerRound;  // S2 base block 128
    d.headDimPad = headDimPad;
    d.elemBytes = elemBytes;
    d.vectorSlices = kIncumbentSlicesPerRound;
    d.ubScoreBuffers = 2;
    d.probBufferIsScratch = false;
    d.scoresAhead = 2;               // bmm1(i) is issued before bmm2(i-1)
    d.outputDelay = 1;               // vec2(i-2) after vec1(i-1)
    d.pipelineAcrossTiles = true;    // taskId ring continues over S1 blocks
    d.outputAcrossTiles = true;
    d.causalMaskPerRow = false;      // SelectWithBytesMask on the whole tile
    return d;
}

KernelDesign PtoDesign(uint32_t headDimPad, const PtoTiling& pto)
{
    KernelDesign d;
    d.name = "PTO hand kernel design (CUBE_S0 x TILE_S1 logical tiles, fp32 S fifo)";
    d.keysPerRound = pto.tileS1;
    d.keysPerMatmul = pto.cubeS1;
    d.headDimPad = headDimPad;
    d.elemBytes = 2;
    d.vectorSlices = pto.tileS1 / pto.cubeS1;   // Vec_S0 = CUBE_S0 / 2 / kTileFactor rows
    d.ubScoreBuffers = 2;                       // srcVecTNBuffers
    d.probBufferIsScratch = false;              // xexpVecTNBuffers = 2
    d.scoresAhead = pto.qkPreload + 1;          // compute_qk(tile + qkPreload) before compute_pv(tile)
    d.outputDelay = pto.qkPreload;              // compute_gu(tile) after compute_p(tile + qkPreload)
    d.loadsBeforeProbWait = false;              // compute_pv: TPOP of P, then the V load
    d.pipelineAcrossTiles = false;
    d.blockPerTile = true;                      // each CUBE_S0 block is a kernel block
    d.queryInL0a = false;                       // Q from L1 to L0A for every product
    d.scoreSlots = d.probSlots = d.outputSlots = pto.fifoSlots;
    d.l0Buffers = 2;
    d.l0cBuffers = 2;                           // S streams out under the unit flag
    d.outputOwnL0c = true;                      // P.V accumulates in its own L0C tile
    d.finalOutputBytes = 4;                     // o_out is fp32
    d.causalMaskPerRow = false;
    return d;
}

Prediction PredictPto(const PlanRequest& r, const Platform& p, const PtoTiling& pto)
{
    TilingData t = ProblemTiling(r);
    t.blockK = pto.tileS1;
    return Finish(PtoDesign(t.headDimPad, pto), PtoTiles(t, r.causal, pto, p.aicCores), r, p);
}

Prediction Predict(const Plan& plan, const PlanRequest& r, const Platform& p)
{
    return PredictDesign(DesignFromTiling(plan.tiling, ElementBytes(r.dtype)), plan.tiling, r, p);
}

Prediction PredictIncumbent(const PlanRequest& r, const Platform& p)
{
    TilingData t = ProblemTiling(r);
    t.blockK = kIncumbentKeysPerRound / kIncumbentSlicesPerRound;  // S2 base block: window skips
    return Finish(IncumbentDesign(t.headDimPad, ElementBytes(r.dtype)),
                  IncumbentTiles(t, r.causal, p.aivCores), r, p);
}

Prediction PredictPacked(const Plan& plan, const PlanRequest& r, const Platform& p,
                         const std::vector<int32_t>& cuSeqlensQ, const std::vector<int32_t>& cuSeqlensK)
{
    const KernelDesign design = DesignFromTiling(plan.tiling, ElementBytes(r.dtype));
    const HostOffsets cu{&cuSeqlensQ, &cuSeqlensK};
    Prediction pr = Finish(design,
                           r.causal ? PackedCoreTiles<true>(plan.tiling, cu, design.keysPerRound)
                                    : PackedCoreTiles<false>(plan.tiling, cu, design.keysPerRound),
                           r, p);
    double pairs = 0;  // Finish counted batch x max_seqlen: the sequences' own pairs instead
    for (size_t b = 0; b + 1 < cuSeqlensQ.size(); ++b) {
        const int64_t lq = cuSeqlensQ[b + 1] - cuSeqlensQ[b];
        const int64_t lk = cuSeqlensK[b + 1] - cuSeqlensK[b];
        if (lq > 0 && lk > 0) {
            pairs += VisiblePairs(lq, lk, r.causal, r.variant.windowLeft, r.variant.windowRight);
        }
    }
    pr.usefulFlops = 4.0 * r.headDim * r.headsQ * pairs;
    pr.cubeUtilization = pr.seconds > 0 ? pr.usefulFlops / (pr.seconds * CubePeakFlops(p)) : 0;
    return pr;
}

Prediction PredictDesign(const KernelDesign& design, const TilingData& split,
                         const PlanRequest& r, const Platform& p)
{
    return Finish(design, CoreTiles(split, r.causal, design.keysPerRound), r, p);
}

}  // namespace flash_cann
