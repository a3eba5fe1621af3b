#include "schedule_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <utility>

namespace flash_cann {

EngineSeconds ArrivalOf(const EngineRates& r)
{
    EngineSeconds a{};
    a[static_cast<uint32_t>(Engine::kCubeMte2)] = r.l2ToL1Arrival;
    a[static_cast<uint32_t>(Engine::kCubeMte1)] = r.l1ToL0Arrival;
    a[static_cast<uint32_t>(Engine::kFixpipe)] = r.fixpipeArrival;
    a[static_cast<uint32_t>(Engine::kVecMte2)] = r.l2ToUbArrival;
    a[static_cast<uint32_t>(Engine::kVecMte3)] = r.ubToL2Arrival;
    return a;
}

namespace {

constexpr double kFloatsPerRepeat = 64;   // 256 bytes of fp32
// Tiles of up to this many rounds are simulated whole; longer ones are extrapolated
// linearly from two simulated lengths (the pipeline's steady state is periodic).
constexpr uint32_t kExactRounds = 8;
constexpr uint32_t kExtrapolationStep = 4;

// Costs of one round and one tile of a design for a tile of `rows` query rows.
struct RoundCosts {
    // cube core
    double loadQ, loadK, loadV, loadP, mte1Scores, mte1Output, mmad, fixScores, fixOutput;
    uint32_t passes;  // the cube's row passes over the tile (KernelDesign::cubeRows): the
                      // P.V costs above are for all of them, each pass taking its share
    uint32_t scorePieces;  // S's Mmad + Fixpipe pairs per round: sub-blocks x passes
    // one vector core (the busier one), per slice of a round / per round / per tile
    double inScores, softmax, outProbs, diagonalExtra, maskExtra;
    double inOutput, updateOutput, epilogue, outFinal;
    double l2BytesRound, l2BytesTile;  // the whole AI core's GM/L2 traffic
};

RoundCosts CostRound(const KernelDesign& d, uint32_t rows, bool hasMask, const EngineRates& r)
{
    const double rows16 = std::ceil(rows / 16.0) * 16;
    const double k = d.keysPerRound;
    const double dim = d.headDimPad;
    const double e = d.elemBytes;
    const double vecRows = std::ceil(rows / 2.0);
    const double slices = d.vectorSlices;
    const double sliceRows = std::ceil(vecRows / slices);
    // Instructions per round: each cube sub-block is one Mmad, one Fixpipe of S, one load
    // of K, of V and of P, one LoadData per operand.
    const double subBlocks = d.keysPerMatmul > 0 ? std::ceil(k / d.keysPerMatmul) : 1;
    const uint32_t passes = d.cubeRows > 0 ? (rows + d.cubeRows - 1) / d.cubeRows : 1;
    const double valueLoads = d.valuesPerPass ? passes : 1;
    RoundCosts c{};
    c.passes = std::max(passes, 1u);
    c.scorePieces = static_cast<uint32_t>(subBlocks) * c.passes;
    c.loadQ = r.L2ToL1(rows * dim * e, c.passes);
    c.loadK = r.L2ToL1(k * dim * e, subBlocks);
    c.loadV = r.L2ToL1(k * dim * e * valueLoads, subBlocks * valueLoads);
    c.loadP = r.L2ToL1(rows16 * k * e, subBlocks * c.passes);
    c.mte1Scores = (d.queryInL0a ? 0 : r.L1ToL0a(rows16 * dim * e, subBlocks * c.passes)) +
                   r.L1ToL0b(k * dim * e, subBlocks);
    c.mte1Output = r.L1ToL0a(rows16 * k * e, subBlocks * c.passes) +
                   r.L1ToL0b(k * dim * e * c.passes, subBlocks * c.passes);
    c.mmad = r.Mmad(rows16 * k * dim, subBlocks * c.passes);
    if (d.scoreOffsetColumns > 0) {  // the offset panel in, and its product per sub-block
        const double x = d.scoreOffsetColumns;
        c.loadK += r.L2ToL1(rows16 * x * e, 1);
        c.mte1Scores += r.L1ToL0a(rows16 * x * e, c.passes);
        c.mmad += r.Mmad(rows16 * k * x, subBlocks * c.passes);
    }
    c.fixScores = r.Fixpipe(rows16 * k * d.scoreBytes, subBlocks * c.passes);
    c.fixOutput = d.outputBytes > 0 ? r.Fixpipe(rows16 * dim * d.outputBytes, c.passes) : 0;
    c.inScores = r.L2ToUb(sliceRows * k * d.scoreBytes, 1);
    c.softmax = VecSeconds(SoftmaxProgram(sliceRows, k, d.vectorBarriers), r) +
                VecSeconds(FeatureProgram(sliceRows, k, d.softcap, d.alibi), r) +
                (d.widenScores ? VecSeconds(ScoreWidenProgram(sliceRows, k), r) : 0);
    c.outProbs = r.UbToL2(sliceRows * k * e, 1);
    if (d.scoreOffsetColumns > 0) {  // per slice: m + c scale folded in, the next panel out
        VecProgram fold;
        AppendVec(fold, VecOp::kScalarArith, FloatRepeats(sliceRows), true, 3);
        AppendVec(fold, VecOp::kBinary, FloatRepeats(sliceRows), true, 2);
        AppendVec(fold, VecOp::kCast, FloatRepeats(sliceRows), true);
        AppendVec(fold, VecOp::kBroadcast, std::ceil(sliceRows / 8), true);
        c.softmax += VecSeconds(fold, r);
        c.outProbs += r.UbToL2(sliceRows * d.scoreOffsetColumns * e, 1);
    }
    c.diagonalExtra = VecSeconds(CausalMaskProgram(sliceRows, k, d.causalMaskPerRow), r);
    c.maskExtra = hasMask ? VecSeconds(KeyMaskProgram(sliceRows, k), r) : 0;
    if (d.dropoutPassElements > 0) {  // the slice's keep mask, then P = keep ? P : 0
        VecProgram dropout = DropoutMaskProgram(sliceRows, k, d.dropoutPassElements, d.dropoutDraw);
        AppendVec(dropout, VecOp::kSelect, FloatRepeats(sliceRows * k), true);
        c.softmax += VecSeconds(dropout, r);
    }
    c.inOutput = d.outputBytes > 0 ? r.L2ToUb(vecRows * dim * d.outputBytes, 1) : 0;
    c.updateOutput = VecSeconds(OutputUpdateProgram(vecRows, dim, d.vectorBarriers), r);
    c.epilogue = VecSeconds(EpilogueProgram(vecRows, dim), r);
    c.outFinal = r.UbToL2(vecRows * (dim * d.finalOutputBytes + 4), 2);  // O, lse
    c.l2BytesRound = (1 + valueLoads) * k * dim * e + rows16 * k * e  // K, V, P into L1
                     + rows16 * k * d.scoreBytes + rows16 * dim * d.outputBytes  // Fixpipe
                     + rows * k * (d.scoreBytes + e) + rows * dim * d.outputBytes;  // vector
    c.l2BytesTile = rows * dim * (e + d.finalOutputBytes) + rows * 4;
    return c;
}

// A tile's fp32 lead rounds: S as fp32, no widening, no offset product.
KernelDesign LeadDesign(const KernelDesign& d)
{
    KernelDesign lead = d;
    if (d.fp32LeadRounds > 0) {
        lead.scoreBytes = 4;
        lead.widenScores = false;
        lead.scoreOffsetColumns = 0;
    }
    return lead;
}

struct SimResult {
    double seconds = 0;
    EngineSeconds busy{};
};

// The task graph of a sequence of tiles on one AI core (see KernelDesign for the knobs).
class ScheduleBuilder {
public:
    ScheduleBuilder(const KernelDesign& d, const std::vector<TileWork>& tiles,
                    const std::vector<RoundCosts>& costs, const std::vector<RoundCosts>& leadCosts,
                    double flag, const EngineSeconds& arrival)
        : d_(d), costs_(costs), leadCosts_(leadCosts), flag_(flag), timeline_(arrival)
    {
        for (uint32_t t = 0; t < tiles.size(); ++t) {
            for (uint32_t j = 0; j < tiles[t].rounds; ++j) {
                const bool diagonal = j + tiles[t].diagonalRounds >= tiles[t].rounds;
                rounds_.push_back({t, j == 0, j + 1 == tiles[t].rounds, diagonal, j < d.fp32LeadRounds});
            }
        }
        ids_.resize(rounds_.size());
        tileIds_.resize(tiles.size());
    }

    SimResult Run()
    {
        BuildCube();
        BuildVector();
        Connect();
        SimResult result;
        result.seconds = timeline_.Run();
        result.busy = timeline_.Busy();
        return result;
    }

private:
    using Id = Timeline::TaskId;
    struct Round {
        uint32_t tile;
        bool first, last, diagonal;
        bool lead;  // one of the tile's fp32LeadRounds (KernelDesign)
    };
    struct RoundIds {
        Id loadK = Timeline::kNone;
        std::vector<Id> mte1S, mmadS, fixS;  // one round task, or per piece (Scores)
        Id loadP = Timeline::kNone, loadV = Timeline::kNone;
        std::vector<Id> mte1O, mmadO, fixO;  // per row pass of the cube
        std::vector<Id> inS, softmax, outP;
        Id inO = Timeline::kNone, updateO = Timeline::kNone;
    };
    struct TileIds {
        Id loadQ = Timeline::kNone, epilogue = Timeline::kNone, out = Timeline::kNone;
    };
    struct Matmul {
        Id mte1, mmad, fix;
        bool output;
    };

    const RoundCosts& Cost(size_t g) const
    {
        return (rounds_[g].lead ? leadCosts_ : costs_)[rounds_[g].tile];
    }

    void LoadKey(size_t g)
    {
        if (rounds_[g].first) {
            tileIds_[rounds_[g].tile].loadQ = timeline_.Add(Engine::kCubeMte2, Cost(g).loadQ);
        }
        ids_[g].loadK = timeline_.Add(Engine::kCubeMte2, Cost(g).loadK);
    }

    // S of round g. With one S buffer in L0C each piece's Mmad waits for the previous
    // piece's Fixpipe, and the cube's in-order M pipe holds the round's P.V behind that
    // chain: S is then modelled piece by piece (the L0C ring in Connect). With a deeper
    // ring the pieces stream and one task per engine stands for the round.
    void Scores(size_t g)
    {
        RoundIds& i = ids_[g];
        const RoundCosts& c = Cost(g);
        const uint32_t pieces = d_.l0cBuffers == 1 ? c.scorePieces : 1;
        for (uint32_t p = 0; p < pieces; ++p) {
            i.mte1S.push_back(timeline_.Add(Engine::kCubeMte1, c.mte1Scores / pieces));
            i.mmadS.push_back(timeline_.Add(Engine::kCube, c.mmad / pieces));
            i.fixS.push_back(timeline_.Add(Engine::kFixpipe, c.fixScores / pieces));
            matmuls_.push_back({i.mte1S.back(), i.mmadS.back(), i.fixS.back(), false});
        }
    }

    // P.V of round g: one product per cube pass, each into the one O buffer, so a pass's
    // Mmads wait for the previous pass's O Fixpipe (the own-L0C ring of depth 1 in
    // Connect), which Fixpipe writes after the S of the round before it.
    void Output(size_t g)
    {
        RoundIds& i = ids_[g];
        const RoundCosts& c = Cost(g);
        for (uint32_t pass = 0; pass < c.passes; ++pass) {
            i.mte1O.push_back(timeline_.Add(Engine::kCubeMte1, c.mte1Output / c.passes));
            i.mmadO.push_back(timeline_.Add(Engine::kCube, c.mmad / c.passes));
            i.fixO.push_back(timeline_.Add(Engine::kFixpipe, c.fixOutput / c.passes));
            matmuls_.push_back({i.mte1O.back(), i.mmadO.back(), i.fixO.back(), true});
        }
    }

    // The cube's program: S of the first scoresAhead rounds, then per round P.V(j)
    // followed by S(j + scoresAhead), over one tile or the whole stream.
    void BuildCube()
    {
        size_t begin = 0;
        while (begin < rounds_.size()) {
            size_t end = begin + 1;
            while (end < rounds_.size() && (d_.pipelineAcrossTiles || !rounds_[end].first)) {
                ++end;
            }
            for (size_t g = begin; g < std::min(end, begin + d_.scoresAhead); ++g) {
                LoadKey(g);
                Scores(g);
            }
            for (size_t g = begin; g < end; ++g) {
                const size_t next = g + d_.scoresAhead;
                if (d_.loadsBeforeProbWait) {
                    ids_[g].loadV = timeline_.Add(Engine::kCubeMte2, Cost(g).loadV);
                    if (next < end) {
                        LoadKey(next);
                    }
                    ids_[g].loadP = timeline_.Add(Engine::kCubeMte2, Cost(g).loadP);
                } else {
                    ids_[g].loadP = timeline_.Add(Engine::kCubeMte2, Cost(g).loadP);
                    ids_[g].loadV = timeline_.Add(Engine::kCubeMte2, Cost(g).loadV);
                    if (next < end) {
                        LoadKey(next);
                    }
                }
                Output(g);
                if (next < end) {
                    Scores(next);
                }
            }
            begin = end;
        }
    }

    void Softmax(size_t g)
    {
        const RoundCosts& c = Cost(g);
        const double extra = (rounds_[g].diagonal ? c.diagonalExtra : 0) + c.maskExtra;
        for (uint32_t s = 0; s < d_.vectorSlices; ++s) {
            ids_[g].inS.push_back(timeline_.Add(Engine::kVecMte2, c.inScores));
            ids_[g].softmax.push_back(timeline_.Add(Engine::kVector, c.softmax + extra));
            ids_[g].outP.push_back(timeline_.Add(Engine::kVecMte3, c.outProbs));
            slices_.push_back({ids_[g].inS.back(), ids_[g].softmax.back(), ids_[g].outP.back()});
        }
    }

    void UpdateOutput(size_t g)
    {
        ids_[g].inO = timeline_.Add(Engine::kVecMte2, Cost(g).inOutput);
        ids_[g].updateO = timeline_.Add(Engine::kVector, Cost(g).updateOutput);
        if (rounds_[g].last) {
            TileIds& t = tileIds_[rounds_[g].tile];
            t.epilogue = timeline_.Add(Engine::kVector, Cost(g).epilogue);
            t.out = timeline_.Add(Engine::kVecMte3, Cost(g).outFinal);
        }
    }

    // The vector core's program: softmax(j), then the O update of round j - outputDelay
    // (within a tile unless the design's O updates cross tiles), the epilogue after a
    // tile's last O update.
    void BuildVector()
    {
        size_t pending = 0;  // next round whose O update is due
        for (size_t g = 0; g < rounds_.size(); ++g) {
            Softmax(g);
            const bool flush = rounds_[g].last && !d_.outputAcrossTiles;
            while (pending <= g && (pending + d_.outputDelay <= g || flush)) {
                UpdateOutput(pending++);
            }
        }
        while (pending < rounds_.size()) {
            UpdateOutput(pending++);
        }
    }

    void Connect()
    {
        Timeline& t = timeline_;
        const size_t n = rounds_.size();
        for (size_t g = 0; g < n; ++g) {
            RoundIds& i = ids_[g];
            t.After(i.mte1S.front(), i.loadK);
            t.After(i.mte1S.front(), tileIds_[rounds_[g].tile].loadQ);
            for (size_t p = 0; p < i.mmadS.size(); ++p) {
                t.After(i.mmadS[p], i.mte1S[p]);
                t.After(i.fixS[p], i.mmadS[p]);
            }
            if (g >= d_.scoreSlots) {  // the S slot is free once the vector has read it
                t.After(i.fixS.front(), ids_[g - d_.scoreSlots].inS.back(), flag_);
            }
            t.After(i.loadP, i.outP.back(), flag_);
            for (size_t pass = 0; pass < i.mte1O.size(); ++pass) {
                t.After(i.mte1O[pass], i.loadP);
                t.After(i.mte1O[pass], i.loadV);
                t.After(i.mmadO[pass], i.mte1O[pass]);
                t.After(i.fixO[pass], i.mmadO[pass]);
            }
            if (g >= d_.outputSlots) {
                t.After(i.fixO.front(), ids_[g - d_.outputSlots].inO, flag_);
            }
            for (uint32_t s = 0; s < d_.vectorSlices; ++s) {
                t.After(i.inS[s], i.fixS.back(), flag_);
                t.After(i.softmax[s], i.inS[s]);
                t.After(i.outP[s], i.softmax[s]);
                if (g >= d_.probSlots) {
                    t.After(i.outP[s], ids_[g - d_.probSlots].loadP, flag_);
                }
            }
            t.After(i.inO, i.fixO.back(), flag_);
            t.After(i.updateO, i.inO);
            const TileIds& tile = tileIds_[rounds_[g].tile];
            if (rounds_[g].last) {
                t.After(tile.epilogue, i.updateO);
                t.After(tile.out, tile.epilogue);
            }
        }
        // Buffer reuse: L0A/L0B and L0C rings of the cube, UB buffers of the vector.
        std::vector<Id> l0c[2];  // Fixpipes of the results in each L0C ring, in order
        for (size_t m = 0; m < matmuls_.size(); ++m) {
            if (m >= d_.l0Buffers) {
                t.After(matmuls_[m].mte1, matmuls_[m - d_.l0Buffers].mmad);
            }
            const bool own = d_.outputOwnL0c && matmuls_[m].output;
            std::vector<Id>& ring = l0c[own ? 1 : 0];
            const size_t depth = own ? 1 : d_.l0cBuffers;
            if (ring.size() >= depth) {
                t.After(matmuls_[m].mmad, ring[ring.size() - depth]);
            }
            ring.push_back(matmuls_[m].fix);
        }
        const size_t probBuffers = d_.probBufferIsScratch ? 1 : 2;
        for (size_t s = 0; s < slices_.size(); ++s) {
            if (s >= d_.ubScoreBuffers) {
                t.After(slices_[s].in, slices_[s - d_.ubScoreBuffers].softmax);
            }
            if (s >= probBuffers) {
                t.After(slices_[s].softmax, slices_[s - probBuffers].out);
            }
        }
    }

    struct Slice {
        Id in, softmax, out;
    };
    const KernelDesign& d_;
    const std::vector<RoundCosts>& costs_;
    const std::vector<RoundCosts>& leadCosts_;  // a tile's fp32 lead rounds
    double flag_;
    Timeline timeline_;
    std::vector<Round> rounds_;
    std::vector<RoundIds> ids_;
    std::vector<TileIds> tileIds_;
    std::vector<Matmul> matmuls_;
    std::vector<Slice> slices_;
};

struct CoreSchedule {
    double seconds = 0;      // the core's modelled time (schedule or L2 floor)
    double l2Bytes = 0;      // all of its GM/L2 traffic
    EngineSeconds busy{};    // per engine
    bool l2Bound = false;    // the shared-L2 floor set the time
};

struct TileCost {
    double single = 0;   // the tile alone: fill + steady work + drain
    double steady = 0;   // one more such tile in a stream of them
    EngineSeconds busy{};
    double l2Bytes = 0;
};

class TileCostCache {
public:
    TileCostCache(const KernelDesign& d, bool hasMask, const EngineRates& r)
        : d_(d), hasMask_(hasMask), r_(r) {}

    const TileCost& Get(const TileWork& tile)
    {
        auto found = cache_.find(tile);
        if (found != cache_.end()) {
            return found->second;
        }
        const uint32_t exact = std::max(kExactRounds, tile.diagonalRounds + 4);
        TileCost cost;
        if (tile.rounds <= exact + kExtrapolationStep) {
            cost = Simulate(tile);
        } else {
            const TileCost a = Get({tile.rows, exact, tile.diagonalRounds});
            const TileCost b = Get({tile.rows, exact + kExtrapolationStep, tile.diagonalRounds});
            const double f = double(tile.rounds - exact) / kExtrapolationStep;
            auto extend = [f](double x, double y) { return x + (y - x) * f; };
            cost.single = extend(a.single, b.single);
            cost.steady = extend(a.steady, b.steady);
            for (uint32_t e = 0; e < kEngines; ++e) {
                cost.busy[e] = extend(a.busy[e], b.busy[e]);
            }
            cost.l2Bytes = extend(a.l2Bytes, b.l2Bytes);
        }
        return cache_.emplace(tile, cost).first->second;
    }

    // Whether some simulated task graph could not run (a broken design).
    bool Deadlocked() const { return deadlock_; }

private:
    SimResult Run(const std::vector<TileWork>& tiles)
    {
        const std::vector<RoundCosts> costs(tiles.size(), CostRound(d_, tiles[0].rows, hasMask_, r_));
        const std::vector<RoundCosts> lead(tiles.size(), CostRound(LeadDesign(d_), tiles[0].rows, hasMask_, r_));
        return ScheduleBuilder(d_, tiles, costs, lead, r_.crossCoreFlag, ArrivalOf(r_)).Run();
    }

    TileCost Simulate(const TileWork& tile)
    {
        const SimResult one = Run({tile});
        const SimResult three = Run({tile, tile, tile});
        deadlock_ = deadlock_ || one.seconds < 0 || three.seconds < 0;
        TileCost cost;
        cost.single = one.seconds;
        cost.steady = (three.seconds - one.seconds) / 2;
        cost.busy = one.busy;
        const RoundCosts c = CostRound(d_, tile.rows, hasMask_, r_);
        const uint32_t lead = std::min(tile.rounds, d_.fp32LeadRounds);
        cost.l2Bytes = c.l2BytesRound * (tile.rounds - lead) + c.l2BytesTile +
                       CostRound(LeadDesign(d_), tile.rows, hasMask_, r_).l2BytesRound * lead;
        return cost;
    }

    const KernelDesign& d_;
    bool hasMask_;
    const EngineRates& r_;
    std::map<TileWork, TileCost> cache_;
    bool deadlock_ = false;
};

}  // namespace

double FloatRepeats(double elements)
{
    return std::ceil(elements / kFloatsPerRepeat);
}

void AppendVec(VecProgram& program, VecOp op, double repeats, bool barrier, double times)
{
    if (repeats > 0 && times > 0) {
        program.push_back({op, repeats, barrier, times});
    }
}

void AppendTile(CoreWorkList& work, const TileWork& tile)
{
    if (!work.empty() && !(work.back().tile < tile) && !(tile < work.back().tile)) {
        ++work.back().count;
    } else {
        work.push_back({tile, 1});
    }
}

double VecSeconds(const VecProgram& program, const EngineRates& r)
{
    double cycles = 0;
    double issue = 0;  // seconds: each instruction's issue, on top of its repeats
    for (const VecInstr& i : program) {
        const VecOpCost& c = r.Cost(i.op);
        // msopmodeling's rule: repeats x cost, or with a barrier after it head + the rest.
        cycles += i.times * (i.barrier ? c.headCycles + (i.repeats - 1) * c.cyclesPerRepeat
                                       : i.repeats * c.cyclesPerRepeat);
        issue += i.times * r.vectorIssue;
    }
    return cycles / r.clockHz + issue;
}

VecProgram SoftmaxProgram(double rows, double keys, bool b)
{
    const double tile = FloatRepeats(rows * keys);
    const double row = FloatRepeats(rows);
    // Rows of more than 512 keys fold their block results past the 64th (one repeat per row).
    const double fold = keys > 512 ? rows : 0;
    VecProgram p;
    AppendVec(p, VecOp::kScalarArith, tile, b);       // S * scale
    AppendVec(p, VecOp::kBlockReduce, tile, b);       // row max: per 32-byte block
    AppendVec(p, VecOp::kBinary, fold, b);            //   fold
    AppendVec(p, VecOp::kWholeReduce, rows, b);       //   then per row
    AppendVec(p, VecOp::kBinary, row, b);             // m' = max(m, block max)
    AppendVec(p, VecOp::kScalarArith, row, b);        // clamp
    AppendVec(p, VecOp::kBinary, row, b);             // m - m'
    AppendVec(p, VecOp::kExp, row, false);            // alpha
    AppendVec(p, VecOp::kScalarArith, row, false);    // m = m'
    AppendVec(p, VecOp::kBroadcast, std::ceil(rows / 8), b);  // m' to one block per row
    AppendVec(p, VecOp::kBinary, tile, b);            // S - m'
    AppendVec(p, VecOp::kExp, tile, b);               // exp
    AppendVec(p, VecOp::kBlockReduce, tile, b);       // row sum
    AppendVec(p, VecOp::kBinary, fold, b);
    AppendVec(p, VecOp::kWholeReduce, rows, b);
    AppendVec(p, VecOp::kBinary, row, b);             // l * alpha
    AppendVec(p, VecOp::kBinary, row, false);         // + block sum
    AppendVec(p, VecOp::kCast, tile, false);          // P in the input dtype
    return p;
}

VecProgram ScoreWidenProgram(double rows, double keys)
{
    const double tile = FloatRepeats(rows * keys);
    const double halfTile = std::ceil(tile / 2);    // 128 fp16 elements per repeat
    VecProgram p;
    AppendVec(p, VecOp::kScalarArith, halfTile, true);  // Mins 65504, on fp16
    AppendVec(p, VecOp::kScalarArith, halfTile, true);  // Maxs -65504, on fp16
    AppendVec(p, VecOp::kCast, tile, true);             // fp16 S -> fp32
    return p;
}

VecProgram FeatureProgram(double rows, double keys, bool softcap, bool alibi)
{
    const double tile = FloatRepeats(rows * keys);
    VecProgram p;
    if (softcap) {  // softcap - 2 softcap / (exp(2x) + 1): the 2 / softcap rides on the scale
        AppendVec(p, VecOp::kExp, tile, true);
        AppendVec(p, VecOp::kScalarArith, tile, true);  // + 1
        AppendVec(p, VecOp::kDiv, tile, true);          // Reciprocal (costed as a division)
        AppendVec(p, VecOp::kScalarArith, tile, true);  // * -2 softcap
        AppendVec(p, VecOp::kScalarArith, tile, true);  // + softcap
    }
    if (alibi) {  // -slope |c - r - d| from the c - r template
        AppendVec(p, VecOp::kScalarArith, tile, true);  // - d
        AppendVec(p, VecOp::kScalarArith, tile, true);  // Abs (a one-source op, as Muls)
        AppendVec(p, VecOp::kBinary, tile, true);       // Axpy onto S
    }
    return p;
}

VecProgram OutputUpdateProgram(double rows, double headDim, bool b)
{
    const double tile = FloatRepeats(rows * headDim);
    VecProgram p;
    AppendVec(p, VecOp::kBroadcast, std::ceil(rows / 8), b);  // alpha per row
    AppendVec(p, VecOp::kBinary, tile, b);            // O * alpha
    AppendVec(p, VecOp::kBinary, tile, b);            // + P.V
    return p;
}

VecProgram EpilogueProgram(double rows, double headDim)
{
    const double tile = FloatRepeats(rows * headDim);
    const double row = FloatRepeats(rows);
    VecProgram p;
    AppendVec(p, VecOp::kScalarArith, row, false);    // clamp l
    AppendVec(p, VecOp::kDuplicate, row, true);
    AppendVec(p, VecOp::kDiv, row, true);             // 1 / l
    AppendVec(p, VecOp::kBroadcast, std::ceil(rows / 8), true);
    AppendVec(p, VecOp::kBinary, tile, true);         // O / l
    AppendVec(p, VecOp::kCast, tile, false);
    AppendVec(p, VecOp::kLn, row, true);              // lse = m + ln l
    AppendVec(p, VecOp::kBinary, row, false);
    AppendVec(p, VecOp::kDuplicate, row, false);      // next tile's m, l, O
    AppendVec(p, VecOp::kDuplicate, row, false);
    AppendVec(p, VecOp::kDuplicate, tile, true);
    return p;
}

VecProgram CausalMaskProgram(double rows, double keys, bool perRow)
{
    VecProgram p;
    if (perRow) {  // one Compares + Select per row, each followed by a barrier
        AppendVec(p, VecOp::kCompare, FloatRepeats(keys), true, rows);
        AppendVec(p, VecOp::kSelect, FloatRepeats(keys), true, rows);
    } else {       // one 2-D select against a precomputed diagonal mask
        AppendVec(p, VecOp::kSelect, FloatRepeats(rows * keys), true);
    }
    return p;
}

VecProgram KeyMaskProgram(double rows, double keys)
{
    VecProgram p;
    const double key = FloatRepeats(keys);
    AppendVec(p, VecOp::kDuplicate, key, true);       // bias row
    AppendVec(p, VecOp::kCast, key, true);            // mask bytes -> half -> float
    AppendVec(p, VecOp::kCast, key, true);
    AppendVec(p, VecOp::kCompare, key, true);
    AppendVec(p, VecOp::kSelect, key, true);
    AppendVec(p, VecOp::kBinary, FloatRepeats(rows * keys), true);  // S + bias
    return p;
}

namespace {

// One step of the generator: independent instructions of `repeats` repeats each, the last
// followed by a PipeBarrier<PIPE_V> (its head latency exposed).
void AppendStep(VecProgram& p, std::initializer_list<std::pair<VecOp, double>> ops, double repeats)
{
    double left = 0;
    for (const auto& op : ops) {
        left += op.second;
    }
    for (const auto& op : ops) {
        for (double i = 0; i < op.second; ++i) {
            AppendVec(p, op.first, repeats, --left == 0);
        }
    }
}

// One Philox round on `repeats` repeats of 32-bit words (flash_attention_philox.h,
// PhiloxDropout::Round): `chains` multiplications (2; 1 in the last round when only the
// first output is needed), `low`: their low words too.
void AppendPhiloxRound(VecProgram& p, double repeats, double chains, bool low)
{
    constexpr VecOp kShift = VecOp::kScalarArith, kMuls = VecOp::kScalarArith;
    const double c = chains;
    AppendVec(p, VecOp::kDuplicate, 1, false, 2);                        // the round's keys
    AppendStep(p, {{kShift, 2 * c}}, repeats);                           // xH, xL << 16
    AppendStep(p, {{kShift, c}, {kMuls, low ? c : 0}}, repeats);         // xL; lo = M x
    AppendStep(p, {{kMuls, 2 * c}}, repeats);                            // xL ML, xH ML
    AppendStep(p, {{kMuls, 2 * c}, {kShift, c}}, repeats);               // xL MH, xH MH, >> 16
    AppendStep(p, {{VecOp::kBinary, c}}, repeats);                       // s
    AppendStep(p, {{kShift, 2 * c}}, repeats);                           // s >> 16, s << 16
    AppendStep(p, {{kShift, c}, {VecOp::kBinary, c}}, repeats);          // s & 0xFFFF; hi +=
    AppendStep(p, {{VecOp::kBinary, c}}, repeats);                       // s2
    AppendStep(p, {{kShift, c}}, repeats);                               // s2 >> 16
    AppendStep(p, {{VecOp::kBinary, c}}, repeats);                       // hi += s2 >> 16
    for (int x = 0; x < 2; ++x) {                                        // ^ c1 / c3, ^ key
        AppendStep(p, {{VecOp::kBinary, 2 * c}}, repeats);               //   a & b, a | b
        AppendStep(p, {{VecOp::kBinary, c}}, repeats);                   //   (a | b) - (a & b)
    }
}

}  // namespace

VecProgram DropoutMaskProgram(double rows, double keys, double passElements, const DropoutDraw& draw)
{
    VecProgram p;
    const double passRows = std::max(1.0, std::floor(passElements / keys));
    const double passes = std::ceil(rows / passRows);
    for (double pass = 0; pass < passes; ++pass) {
        const double n = std::min(passRows, rows - pass * passRows) * keys;   // this pass's elements
        const double calls = std::ceil(n / draw.drawsPerCall);
        const double words = FloatRepeats(calls);
        AppendVec(p, VecOp::kDuplicate, words, false, 3);              // counter: j ramp, i, h
        AppendVec(p, VecOp::kDuplicate, words, true);                  //   b + offset
        for (uint32_t round = 0; round + 1 < draw.rounds; ++round) {
            AppendPhiloxRound(p, words, 2, true);
        }
        const bool firstOnly = draw.drawsPerCall == 1;
        AppendPhiloxRound(p, words, firstOnly ? 1 : 2, !firstOnly);
        const double all = FloatRepeats(n);
        if (draw.drawsPerCall <= 4) {  // draw >= threshold from the draw's 16-bit halves
            AppendStep(p, {{VecOp::kScalarArith, 2}}, all);
            AppendStep(p, {{VecOp::kScalarArith, 1}, {VecOp::kCast, 1}}, all);
            AppendStep(p, {{VecOp::kCast, 1}, {VecOp::kScalarArith, 1}}, all);
            AppendStep(p, {{VecOp::kScalarArith, 2}}, all);
            AppendStep(p, {{VecOp::kBinary, 1}}, all);
            AppendStep(p, {{VecOp::kCompare, 1}}, all);
        } else {                       // bytes -> half, compared with the 8-bit threshold
            AppendStep(p, {{VecOp::kCast, 1}}, std::ceil(n / 128));
            AppendStep(p, {{VecOp::kCompare, 1}}, std::ceil(n / 128));
        }
    }
    return p;
}

SchedulePrediction PredictSchedule(const KernelDesign& design,
                                   const std::vector<CoreWorkList>& cores,
                                   double hbmBytes, bool hasMask, const EngineRates& rates)
{
    TileCostCache cache(design, hasMask, rates);
    SchedulePrediction p;
    p.launchSeconds = rates.launch;
    p.hbmSeconds = hbmBytes / rates.hbm;
    const double l2Share = rates.l2Aggregate / std::max<size_t>(1, cores.size());
    double total = 0;
    CoreSchedule slowest;
    for (const CoreWorkList& runs : cores) {
        CoreSchedule core;
        for (size_t i = 0; i < runs.size(); ++i) {
            const TileCost& c = cache.Get(runs[i].tile);
            const double n = static_cast<double>(runs[i].count);
            // The first tile pays the pipeline's fill and drain (every tile, when each
            // is a block of its own).
            core.seconds += design.blockPerTile ? n * c.single
                                                : n * c.steady + (i == 0 ? c.single - c.steady : 0);
            core.l2Bytes += n * c.l2Bytes;
            for (uint32_t e = 0; e < kEngines; ++e) {
                core.busy[e] += n * c.busy[e];
            }
        }
        // No engine can be busier than the core's time: the steady-state estimate of a
        // short tile can be (its fill overlaps the next tile's in the three-tile run).
        core.seconds = std::max(core.seconds, *std::max_element(core.busy.begin(), core.busy.end()));
        if (core.l2Bytes / l2Share > core.seconds) {
            core.seconds = core.l2Bytes / l2Share;
            core.l2Bound = true;
        }
        total += core.seconds;
        if (core.seconds >= slowest.seconds) {
            slowest = core;
        }
    }
    p.meanCoreSeconds = cores.empty() ? 0 : total / cores.size();
    p.coreSeconds = slowest.seconds;
    p.busy = slowest.busy;
    p.seconds = std::max(p.launchSeconds + slowest.seconds, p.hbmSeconds);
    uint32_t busiest = 0;
    for (uint32_t e = 1; e < kEngines; ++e) {
        if (slowest.busy[e] > slowest.busy[busiest]) {
            busiest = e;
        }
    }
    const double share = slowest.seconds > 0 ? slowest.busy[busiest] / slowest.seconds : 0;
    char text[160];
    if (cache.Deadlocked()) {  // a broken design: no time rather than a wrong one
        p.seconds = 0;
        p.bound = "deadlock in the design's task graph";
    } else if (p.hbmSeconds > p.launchSeconds + slowest.seconds) {
        p.bound = "HBM bandwidth";
    } else if (slowest.l2Bound) {
        p.bound = "shared L2 bandwidth (workspace and K/V traffic)";
    } else if (share >= 0.85) {
        std::snprintf(text, sizeof(text), "%s, busy %.0f%%", EngineName(Engine(busiest)), 100 * share);
        p.bound = text;
    } else {
        std::snprintf(text, sizeof(text), "dependency chain (busiest: %s, %.0f%%)",
                      EngineName(Engine(busiest)), 100 * share);
        p.bound = text;
    }
    return p;
}

}  // namespace flash_cann
