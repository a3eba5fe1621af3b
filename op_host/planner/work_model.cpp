#include "work_model.h"

#include <algorithm>

#include "balanced_split.h"

namespace flash_cann {
namespace {

// The split works on units of 16 rows (one cube fractal), coarsened for very long
// sequences so that the per-segment prefix table stays small.
constexpr uint64_t kMaxUnitsPerSegment = 65536;

struct Work {
    uint64_t tiles = 0;
    uint64_t scoreElements = 0;
    uint64_t keyColumns = 0;

    void Add(const TilingData& t, const QueryTile& tile, bool causal)
    {
        const uint64_t cols = VisitedColumns(t, tile, causal);
        tiles += 1;
        scoreElements += uint64_t{AlignUp(tile.rows, kCubeBlock)} * cols;
        keyColumns += cols;
    }

    void Add(const Work& other, uint64_t times)
    {
        tiles += other.tiles * times;
        scoreElements += other.scoreElements * times;
        keyColumns += other.keyColumns * times;
    }
};

// The tiles of one whole segment (a (batch, head) pair) walked from its first row: the
// same for every segment.
Work SegmentWork(const TilingData& t, bool causal)
{
    Work work;
    uint64_t cursor = 0;
    QueryTile tile{};
    while (NextTile(t, cursor, t.seqlenQ, tile)) {
        work.Add(t, tile, causal);
    }
    return work;
}

}  // namespace

uint64_t VisitedColumns(const TilingData& t, const QueryTile& tile, bool causal)
{
    const KeyRange keys = causal ? TileKeys<true>(t, tile) : TileKeys<false>(t, tile);
    // The cube computes whole blockK sub-blocks (the last one's keys zero-padded); blocks
    // outside the tile's band are skipped.
    return (uint64_t{keys.end} - keys.begin + t.blockK - 1) / t.blockK * t.blockK;
}

namespace {

// Modelled work of the rows [begin, end), walking tiles as the kernel does; whole
// segments are counted at once.
Work MeasureRange(const TilingData& t, bool causal, const Work& segment, uint64_t begin,
                  uint64_t end)
{
    const uint64_t sq = t.seqlenQ;
    Work work;
    uint64_t cursor = begin;
    QueryTile tile{};
    while (cursor < end) {
        if (cursor % sq == 0 && end - cursor >= sq) {
            const uint64_t whole = (end - cursor) / sq;
            work.Add(segment, whole);
            cursor += whole * sq;
            continue;
        }
        NextTile(t, cursor, end, tile);
        work.Add(t, tile, causal);
    }
    return work;
}

// The prefix model ignores where tiles start, so the boundaries are refined against the
// exact work of the kernel's tiles: this settles the last few percent.
void RefineSplit(TilingData& t, bool causal, const Work& segment, uint64_t unit)
{
    constexpr int kPasses = 16;
    RefineBoundaries(t.rowStart, t.usedCores, unit, [&](uint64_t begin, uint64_t end) {
        return static_cast<double>(MeasureRange(t, causal, segment, begin, end).scoreElements);
    }, kPasses);
}

}  // namespace

void SplitRows(TilingData& t, bool causal, uint32_t cores)
{
    const uint64_t sq = t.seqlenQ;
    const uint64_t segments = uint64_t{t.batch} * t.headsQ;
    uint64_t unit = kCubeBlock;
    while ((sq + unit - 1) / unit > kMaxUnitsPerSegment) {
        unit *= 2;
    }
    const uint64_t units = (sq + unit - 1) / unit;
    // prefix[k]: modelled work of the first k units of a segment.
    std::vector<double> prefix(units + 1, 0.0);
    for (uint64_t k = 0; k < units; ++k) {
        const uint64_t row0 = k * unit;
        const QueryTile piece = DenseTile(t, 0, 0, static_cast<uint32_t>(row0),
                                          static_cast<uint32_t>(std::min(unit, sq - row0)));
        prefix[k + 1] = prefix[k] + static_cast<double>(AlignUp(piece.rows, kCubeBlock)) *
                                        static_cast<double>(VisitedColumns(t, piece, causal));
    }
    const uint64_t totalRows = segments * sq;
    std::vector<uint64_t> starts = SplitPeriodic(prefix, segments, cores);
    for (uint64_t& start : starts) {  // units -> rows (the last unit of a segment may be short)
        start = start == segments * units ? totalRows : start / units * sq + start % units * unit;
    }
    t.usedCores = static_cast<uint32_t>(starts.size() - 1);
    std::fill(std::begin(t.rowStart), std::end(t.rowStart), 0);
    std::copy(starts.begin(), starts.end(), t.rowStart);
    RefineSplit(t, causal, SegmentWork(t, causal), unit);
}

std::vector<CoreWork> MeasureCores(const TilingData& t, bool causal)
{
    const Work segment = SegmentWork(t, causal);
    std::vector<CoreWork> cores;
    for (uint32_t c = 0; c < t.usedCores; ++c) {
        const Work work = MeasureRange(t, causal, segment, t.rowStart[c], t.rowStart[c + 1]);
        const double macs = 2.0 * static_cast<double>(work.scoreElements) * t.headDimPad;
        cores.push_back({t.rowStart[c], t.rowStart[c + 1], work.tiles, work.scoreElements,
                         work.keyColumns, macs});
    }
    return cores;
}

}  // namespace flash_cann
