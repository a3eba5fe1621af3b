// The cube (AIC) half of the FlashAttention forward kernel: both matrix products, as a
// pipeline over the AIC's four pipes (MTE2 GM->L1, MTE1 L1->L0A/L0B, M the cube, FIX
// L0C->GM) handed over with explicit events.
//
// Per query tile: Q is loaded into L1 and then into L0A once, and stays in L0A for
// every S product of the tile. The tile's keys are walked in rounds of keyStack
// sub-blocks of blockK keys (flash_cann_tiling.h, MakeRound). The rounds of all the
// core's tiles form one stream, numbered g, and the order is
//   ComputeScores(0), ComputeScores(1), then per round g: ComputeScores(g + 2), ComputeOutput(g)
// so S of the next two rounds goes to the workspace before the cube blocks on P of this one:
// the vector cores always have S to work on, and the Fixpipe has S to write while the cube waits.
// The stream crosses tile boundaries: S of the next tile's first rounds is computed
// before the P.V of this tile's last ones, so a tile's end does not drain the pipeline
// (short causal tiles gain most). The vector cores need no change for it: they count
// rounds over all their tiles, and the workspace rings and flags are indexed by g.
//   ComputeScores  per sub-block: K -> L1 -> L0B, S = Q K^T (L0C), Fixpipe -> S slot;
//                  one cross-core flag per round
//   ComputeOutput  V and the next K loads are issued, then the wait for P; per
//                  sub-block: P -> L1 -> L0A, V -> L0B, O += P V in L0C (accumulated over
//                  the whole stack); one Fixpipe of O and one flag per round
// K, V and P stream through double-buffered L1 rings, loaded as far ahead as their ring
// allows, so MTE2 runs ahead of MTE1 and M (docs/kernel.md has the timeline).
#ifndef FLASH_CANN_FLASH_ATTENTION_CUBE_H
#define FLASH_CANN_FLASH_ATTENTION_CUBE_H

#include "flash_attention_common.h"
#include "flash_attention_fractal.h"

namespace flash_cann {

// A ring of `copies` equal buffers that a producer pipe fills and a consumer pipe uses,
// in order. FILLED (producer -> consumer) says a buffer holds its data, FREED (consumer
// -> producer) says it may be overwritten. Every buffer starts freed, and Drain waits for
// all of them at the end, so each event is set and waited on equally often.
//
// Event ids: each buffer holds one FILLED and one FREED id for the whole kernel, taken
// from TPipe's event pool (AllocEventID) and given back by Drain (ReleaseEventID). The
// SetFlag/WaitFlag docs require this next to TPipe: the pool is where TPipe's queues take
// their ids (an EnQue or FreeTensor takes the lowest free id of its HardEvent and sets
// it), and on the cube core TPipe itself holds and sets M_MTE1 ids 0-2 from its
// constructor to its destruction (asc-devkit kernel_tpipe_impl.h, TPipe::Init), so a
// hand-picked id can be one that is already set: a second SetFlag before the WaitFlag is
// undefined behaviour. Ids from the pool cannot collide with either. With the forward's
// rings (no queues on the cube core) and every ring double-buffered, the pool hands out
// MTE2_MTE1/MTE1_MTE2 Q 0, K 1-2, V 3-4, P 5-6; MTE1_M Q 0, P 1-2, Kt/V 3-4; M_MTE1 Q 3,
// P 4-5, Kt/V 6-7; M_FIX/FIX_M O 0, S 1-2. (Ids 6 and 7, which the docs keep from
// hand-managed ids, are the pool's to give; its own queues use them too.)
constexpr uint32_t kRingMaxCopies = 8;  // ids per HardEvent: the pool refuses a ninth

template <typename U, AscendC::HardEvent FILLED, AscendC::HardEvent FREED>
class EventRing {
public:
    __aicore__ inline void Init(AscendC::TPipe* pipe, const AscendC::LocalTensor<U>& base,
                                uint32_t slotElements, uint32_t copies)
    {
        pipe_ = pipe;
        base_ = base;
        slotElements_ = slotElements;
        copies_ = copies;
        for (uint32_t i = 0; i < copies_; ++i) {
            filledId_[i] = pipe_->AllocEventID<FILLED>();
            freedId_[i] = pipe_->AllocEventID<FREED>();
            AscendC::SetFlag<FREED>(freedId_[i]);
        }
    }
    // Producer side: the next buffer, once its previous contents are consumed.
    __aicore__ inline AscendC::LocalTensor<U> BeginFill()
    {
        const uint32_t slot = filled_ % copies_;
        AscendC::WaitFlag<FREED>(freedId_[slot]);
        return base_[slot * slotElements_];
    }
    __aicore__ inline void EndFill()
    {
        AscendC::SetFlag<FILLED>(filledId_[filled_++ % copies_]);
    }
    // Consumer side: the oldest filled buffer, once its data is there.
    __aicore__ inline AscendC::LocalTensor<U> BeginUse()
    {
        const uint32_t slot = used_ % copies_;
        AscendC::WaitFlag<FILLED>(filledId_[slot]);
        return base_[slot * slotElements_];
    }
    __aicore__ inline void EndUse()
    {
        AscendC::SetFlag<FREED>(freedId_[used_++ % copies_]);
    }
    // Buffers filled (or being filled) and not yet used.
    __aicore__ inline uint32_t InFlight() const { return filled_ - used_; }
    __aicore__ inline uint32_t Copies() const { return copies_; }
    __aicore__ inline void Drain()
    {
        for (uint32_t i = 0; i < copies_; ++i) {
            AscendC::WaitFlag<FREED>(freedId_[i]);
            pipe_->ReleaseEventID<FILLED>(filledId_[i]);
            pipe_->ReleaseEventID<FREED>(freedId_[i]);
        }
    }

private:
    AscendC::TPipe* pipe_ = nullptr;
    AscendC::LocalTensor<U> base_;
    uint32_t slotElements_ = 0;
    uint32_t copies_ = 1;
    AscendC::TEventID filledId_[kRingMaxCopies] = {};
    AscendC::TEventID freedId_[kRingMaxCopies] = {};
    uint32_t filled_ = 0;
    uint32_t used_ = 0;
};

// Row passes (CubeInPasses: cubeRows < blockQ, the 256-row tile at head_dim 128, where Q of
// the tile would fill L0A and O of the tile L0C): the cube works on a tile in passes of
// cubeRows rows. Q of the tile stays in L1 (each pass its own Nz block) and a pass's Q goes
// into L0A per S product, through one double-buffered L0A ring that P uses in P.V; K^T of
// a sub-block stays in L0B for every pass's product; P.V accumulates O of one pass over
// the round's stack, Fixpipes it, then the next pass, so V of the whole round is loaded
// into L1 once (a round-sized V ring) and read by every pass.
//
// The cube needs no FEATURES flag: the features change which key blocks a tile visits
// (TileKeys, the same on both halves) and the vector side's arithmetic, not the products.
template <typename T, bool CAUSAL, bool MASK>
class FlashAttentionCube {
    using L1Ring = EventRing<T, AscendC::HardEvent::MTE2_MTE1, AscendC::HardEvent::MTE1_MTE2>;
    using L0Ring = EventRing<T, AscendC::HardEvent::MTE1_M, AscendC::HardEvent::M_MTE1>;
    using L0cRing = EventRing<float, AscendC::HardEvent::M_FIX, AscendC::HardEvent::FIX_M>;

public:
    __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR cuSeqlensQ,
                                GM_ADDR cuSeqlensK, GM_ADDR userWorkspace, const TilingData& tiling,
                                AscendC::TPipe* pipe)
    {
        t_ = tiling;
        if (t_.layout == static_cast<uint32_t>(Layout::TND)) {
            seqlens_.Init(cuSeqlensQ, cuSeqlensK);
        }
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx());
        q_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(query));
        k_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(key));
        v_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(value));
        exchange_.Init(userWorkspace, core_, t_);

        const BufferBytes bytes = ComputeBufferBytes(t_, sizeof(T));
        pipe->InitBuffer(qL1Buf_, bytes.qL1);
        pipe->InitBuffer(kL1Buf_, bytes.kL1 * t_.kvL1Buffers);
        pipe->InitBuffer(vL1Buf_, bytes.vL1 * t_.kvL1Buffers);
        pipe->InitBuffer(pL1Buf_, bytes.pL1 * t_.pL1Buffers);
        passes_ = CubeInPasses(t_);
        // In passes, Q of a pass and P share the L0A ring (qL0a_): no separate P buffers.
        pipe->InitBuffer(qL0aBuf_, bytes.qL0a * (passes_ ? t_.l0aBuffers : 1));
        if (!passes_) {
            pipe->InitBuffer(pL0aBuf_, bytes.pL0a * t_.l0aBuffers);
        }
        pipe->InitBuffer(l0bBuf_, bytes.l0b * t_.l0bBuffers);
        pipe->InitBuffer(oL0cBuf_, bytes.oL0c);
        pipe->InitBuffer(sL0cBuf_, bytes.sL0c * t_.l0cBuffers);

        qL1_.Init(pipe, qL1Buf_.template Get<T>(), 0, 1);
        kL1_.Init(pipe, kL1Buf_.template Get<T>(), bytes.kL1 / sizeof(T), t_.kvL1Buffers);
        vL1_.Init(pipe, vL1Buf_.template Get<T>(), bytes.vL1 / sizeof(T), t_.kvL1Buffers);
        pL1_.Init(pipe, pL1Buf_.template Get<T>(), bytes.pL1 / sizeof(T), t_.pL1Buffers);
        if (passes_) {
            qL0a_.Init(pipe, qL0aBuf_.template Get<T>(), bytes.qL0a / sizeof(T), t_.l0aBuffers);
        } else {
            qL0a_.Init(pipe, qL0aBuf_.template Get<T>(), 0, 1);
            pL0a_.Init(pipe, pL0aBuf_.template Get<T>(), bytes.pL0a / sizeof(T), t_.l0aBuffers);
        }
        l0b_.Init(pipe, l0bBuf_.template Get<T>(), bytes.l0b / sizeof(T), t_.l0bBuffers);
        oL0c_.Init(pipe, oL0cBuf_.template Get<float>(), 0, 1);
        sL0c_.Init(pipe, sL0cBuf_.template Get<float>(), bytes.sL0c / sizeof(float), t_.l0cBuffers);
    }

    __aicore__ inline void Process()
    {
        coreTiles_.Start(t_, seqlens_, core_);
        for (uint32_t ahead = 0; ahead < kScoresAhead; ++ahead) {
            NextScores();
        }
        while (outputSeq_ < scoreSeq_) {
            NextScores();
            ComputeOutput();
        }
        if (scoreTiles_ > 0) {
            ReleaseQuery();  // the last S product of the core has read Q
        }
        qL1_.Drain();
        kL1_.Drain();
        vL1_.Drain();
        pL1_.Drain();
        qL0a_.Drain();
        if (!passes_) {
            pL0a_.Drain();
        }
        l0b_.Drain();
        oL0c_.Drain();
        sL0c_.Drain();
    }

private:
    // A tile of the round stream: the tiles whose rounds are between the S and the P.V
    // end of the stream. S leads P.V by at most kScoresAhead rounds and every tile in the
    // stream has a round, so at most kScoresAhead + 1 tiles are live at once.
    struct StreamTile {
        QueryTile tile;
        KeyRange keys;
        uint32_t rounds;
        uint32_t blocks;        // key sub-blocks of the tile
        uint32_t passes;        // the cube's row passes (CubePasses)
        uint32_t keysIssued;    // K sub-blocks whose load has been issued
        uint32_t valuesIssued;  // V sub-blocks (in passes: V rounds) whose load has been issued
    };
    static constexpr uint32_t kStreamTiles = kScoresAhead + 1;

    __aicore__ inline StreamTile& ScoreTile() { return stream_[(scoreTiles_ - 1) % kStreamTiles]; }
    __aicore__ inline StreamTile& OutputTile() { return stream_[outputTiles_ % kStreamTiles]; }

    // S of the stream's next round, starting the core's next tile with keys when the
    // current one has no round left; nothing once the core's tiles are done.
    __aicore__ inline void NextScores()
    {
        while (scoreTiles_ == 0 || scoreRound_ == ScoreTile().rounds) {
            QueryTile tile;
            if (tilesDone_ || !coreTiles_.Next(tile)) {
                tilesDone_ = true;  // the walk is not asked again once it has ended
                return;
            }
            const KeyRange keys = TileKeys<CAUSAL>(t_, tile);
            const uint32_t rounds = RoundCount(t_, keys);
            if (rounds == 0) {
                continue;  // no key to attend to: the vector cores write the empty rows
            }
            if (scoreTiles_ > 0) {
                ReleaseQuery();  // the previous tile's last S product has read Q
            }
            ++scoreTiles_;
            BeginTile(tile, keys, rounds);
            scoreRound_ = 0;
        }
        ComputeScores(scoreRound_++);
    }

    // `rows` rows of Q, K or V (ND in GM, row pitch `pitch`) -> Nz in L1 with `padRows`
    // rows per 16-column block. With zeroTail, rows [rows, padRows) of every column
    // block are zeroed (their own addresses, so no ordering against the copy is needed):
    // key/value rows past the last key are the padded columns of S and the padded
    // reduction dimension of P.V, and stale L1 data there would reach the results. (A
    // partial last column block, head_dim % 16 != 0, is zero-padded by ND->NZ itself.)
    __aicore__ inline void LoadRows(const AscendC::LocalTensor<T>& l1, const AscendC::GlobalTensor<T>& src,
                                    uint32_t rows, uint32_t padRows, uint64_t pitch, bool zeroTail)
    {
        if (zeroTail && rows < padRows) {
            AscendC::InitConstValue(
                l1[rows * kCubeBlock],
                AscendC::InitConstValueParams<T>(static_cast<uint16_t>(t_.headDimPad / kCubeBlock),
                                                 static_cast<uint16_t>(padRows - rows),
                                                 static_cast<uint16_t>(rows), T(0.0f)));
        }
        AscendC::DataCopy(l1, src,
                          AscendC::Nd2NzParams(1, static_cast<uint16_t>(rows),
                                               static_cast<uint16_t>(t_.headDim), 0,
                                               static_cast<uint16_t>(pitch),
                                               static_cast<uint16_t>(padRows), 1, 0));
    }

    __aicore__ inline void BeginTile(const QueryTile& tile, const KeyRange& keys, uint32_t rounds)
    {
        StreamTile& st = ScoreTile();
        st.tile = tile;
        st.keys = keys;
        st.rounds = rounds;
        st.blocks = (keys.end - keys.begin + t_.blockK - 1) / t_.blockK;
        st.passes = CubePasses(t_, tile.rows);
        st.keysIssued = st.valuesIssued = 0;
        const uint64_t offset = tile.qBase + uint64_t{tile.row0} * t_.qStrideRow;
        // Q: GM -> L1 (MTE2), each row pass its own Nz block (Rows16 rows). Rows past
        // tile.rows are stale: they only reach S and O rows nobody reads.
        const AscendC::LocalTensor<T> qFill = qL1_.BeginFill();
        for (uint32_t pass = 0; pass < st.passes; ++pass) {
            LoadRows(qFill[pass * t_.cubeRows * t_.headDimPad],
                     q_[offset + uint64_t{pass} * t_.cubeRows * t_.qStrideRow],
                     CubePassRows(t_, tile.rows, pass), Rows16(st, pass), t_.qStrideRow, false);
        }
        qL1_.EndFill();
        qL1Tile_ = qL1_.BeginUse();
        if (passes_) {
            return;  // Q stays in L1 for the tile; each S product loads its pass into L0A
        }
        // -> L0A (MTE1), where it stays until the tile's last S product.
        LoadLeft(qL0a_.BeginFill(), qL1Tile_, Rows16(st, 0), t_.headDimPad);
        qL1_.EndUse();
        qL0a_.EndFill();
        qA_ = qL0a_.BeginUse();
    }

    // The tile's Q is no longer needed: in L0A (resident) or in L1 (in passes).
    __aicore__ inline void ReleaseQuery()
    {
        if (passes_) {
            qL1_.EndUse();
        } else {
            qL0a_.EndUse();
        }
    }

    // Rows of row pass `pass` of a tile, rounded up to the cube block.
    __aicore__ inline uint32_t Rows16(const StreamTile& st, uint32_t pass) const
    {
        return AlignUp(CubePassRows(t_, st.tile.rows, pass), kCubeBlock);
    }

    // The left operand of row pass `pass`'s S product: Q resident in L0A, or (in passes)
    // the pass's Q loaded from L1 into the L0A ring; ReleaseLeft after the product.
    __aicore__ inline AscendC::LocalTensor<T> QueryLeft(const StreamTile& st, uint32_t pass)
    {
        if (!passes_) {
            return qA_;
        }
        LoadLeft(qL0a_.BeginFill(), qL1Tile_[pass * t_.cubeRows * t_.headDimPad], Rows16(st, pass),
                 t_.headDimPad);
        qL0a_.EndFill();
        return qL0a_.BeginUse();
    }

    __aicore__ inline void ReleaseLeft()
    {
        if (passes_) {
            qL0a_.EndUse();
        }
    }

    // Sub-block `block` of a tile holds keys keys.begin + block * blockK onwards.
    __aicore__ inline uint64_t KeyOffset(const StreamTile& st, uint32_t block) const
    {
        return st.tile.kvBase + (uint64_t{st.keys.begin} + uint64_t{block} * t_.blockK) * t_.kvStrideRow;
    }

    __aicore__ inline uint32_t Columns(const StreamTile& st, uint32_t block) const
    {
        return MinU32(t_.blockK, st.keys.end - st.keys.begin - block * t_.blockK);
    }

    // Start the K loads of the S tile's next sub-blocks (or the V loads of the P.V
    // tile's) into every free L1 buffer: MTE2 works on them while the other pipes (and
    // the vector cores) are busy. A ring's loads are for one tile at a time: the S (P.V)
    // tile changes only once all its K (V) sub-blocks have been used.
    __aicore__ inline void IssueKeys()
    {
        StreamTile& st = ScoreTile();
        for (; st.keysIssued < st.blocks && kL1_.InFlight() < kL1_.Copies(); ++st.keysIssued) {
            LoadRows(kL1_.BeginFill(), k_[KeyOffset(st, st.keysIssued)], Columns(st, st.keysIssued),
                     t_.blockK, t_.kvStrideRow, true);
            kL1_.EndFill();
        }
    }

    __aicore__ inline void IssueValues()
    {
        StreamTile& st = OutputTile();
        if (passes_) {
            // In passes, a ring buffer holds V of a whole round, for every pass to read.
            for (; st.valuesIssued < st.rounds && vL1_.InFlight() < vL1_.Copies(); ++st.valuesIssued) {
                const KeyRound round = MakeRound(t_, st.keys, st.valuesIssued);
                const AscendC::LocalTensor<T> v = vL1_.BeginFill();
                for (uint32_t sub = round.firstSub; sub < round.subBlocks; ++sub) {
                    const uint32_t block = (round.key0 + sub * t_.blockK - st.keys.begin) / t_.blockK;
                    LoadRows(v[sub * t_.blockK * t_.headDimPad], v_[KeyOffset(st, block)], Columns(st, block),
                             t_.blockK, t_.kvStrideRow, true);
                }
                vL1_.EndFill();
            }
            return;
        }
        for (; st.valuesIssued < st.blocks && vL1_.InFlight() < vL1_.Copies(); ++st.valuesIssued) {
            LoadRows(vL1_.BeginFill(), v_[KeyOffset(st, st.valuesIssued)], Columns(st, st.valuesIssued),
                     t_.blockK, t_.kvStrideRow, true);
            vL1_.EndFill();
        }
    }

    // P sub-blocks of the round with sequence number `seq` (rows of `width` elements), pass
    // after pass: probsIssued_ counts the round's (pass, sub-block) loads from its firstSub.
    __aicore__ inline void IssueProbs(const StreamTile& st, const KeyRound& round, uint32_t seq)
    {
        const uint32_t subs = round.subBlocks - round.firstSub;
        for (; probsIssued_ < st.passes * subs && pL1_.InFlight() < pL1_.Copies(); ++probsIssued_) {
            const uint32_t pass = probsIssued_ / subs;
            const uint32_t sub = round.firstSub + probsIssued_ % subs;
            AscendC::DataCopy(pL1_.BeginFill(),
                              exchange_.Probs(seq, uint64_t{pass} * t_.cubeRows * round.width + sub * t_.blockK),
                              AscendC::Nd2NzParams(1, static_cast<uint16_t>(CubePassRows(t_, st.tile.rows, pass)),
                                                   static_cast<uint16_t>(t_.blockK), 0,
                                                   static_cast<uint16_t>(round.width),
                                                   static_cast<uint16_t>(Rows16(st, pass)), 1, 0));
            pL1_.EndFill();
        }
    }

    // S = Q K^T for every sub-block of round `index` of the S tile, into the next S slot:
    // per sub-block K^T goes into L0B once and serves every row pass's product.
    __aicore__ inline void ComputeScores(uint32_t index)
    {
        const StreamTile& st = ScoreTile();
        const KeyRound round = MakeRound(t_, st.keys, index);
        const uint32_t seq = scoreSeq_++;
        const uint32_t bk = t_.blockK;
        const uint32_t d = t_.headDimPad;
        for (uint32_t sub = round.firstSub; sub < round.subBlocks; ++sub) {
            IssueKeys();
            // K in Nz is already the Zn layout of K^T.
            const AscendC::LocalTensor<T> kL1 = kL1_.BeginUse();
            LoadRightTransposed(l0b_.BeginFill(), kL1, bk, d);
            kL1_.EndUse();
            l0b_.EndFill();
            IssueKeys();  // the L1 buffer just freed takes a later sub-block's K

            const AscendC::LocalTensor<T> kT = l0b_.BeginUse();
            for (uint32_t pass = 0; pass < st.passes; ++pass) {
                const uint32_t rows16 = Rows16(st, pass);
                const AscendC::LocalTensor<T> q = QueryLeft(st, pass);
                const AscendC::LocalTensor<float> c = sL0c_.BeginFill();
                AscendC::Mmad(c, q, kT,
                              AscendC::MmadParams(static_cast<uint16_t>(rows16), static_cast<uint16_t>(bk),
                                                  static_cast<uint16_t>(d), 0, false, true));
                ReleaseLeft();
                sL0c_.EndFill();
                AscendC::FixpipeParamsV220 scoresOut(static_cast<uint16_t>(bk), static_cast<uint16_t>(rows16),
                                                     static_cast<uint16_t>(rows16), round.width, false);
                AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(
                    exchange_.Scores(seq, uint64_t{pass} * t_.cubeRows * round.width + sub * bk),
                    sL0c_.BeginUse(), scoresOut);
                sL0c_.EndUse();
            }
            l0b_.EndUse();
        }
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagScores);
    }

    // O = P V of the stream's next round (a round of the P.V tile), per row pass
    // accumulated over the round's sub-blocks in L0C, into the next O slot.
    __aicore__ inline void ComputeOutput()
    {
        const StreamTile& st = OutputTile();
        const KeyRound round = MakeRound(t_, st.keys, outputRound_);
        const uint32_t seq = outputSeq_++;
        const uint32_t bk = t_.blockK;
        const uint32_t d = t_.headDimPad;
        // V of this round and K of the next ones do not depend on the vector cores: their
        // loads are in flight while the cube waits for P (in passes: V of this round, and
        // of the next where the V ring has a second buffer, the previous round's freed).
        IssueValues();
        IssueKeys();
        AscendC::CrossCoreWaitFlag(kFlagProbs);
        probsIssued_ = 0;
        IssueProbs(st, round, seq);
        // In passes, V of the round is one L1 buffer, read by every pass.
        AscendC::LocalTensor<T> vRound;
        if (passes_) {
            vRound = vL1_.BeginUse();
        }
        L0Ring& pL0a = passes_ ? qL0a_ : pL0a_;
        for (uint32_t pass = 0; pass < st.passes; ++pass) {
            const uint32_t rows16 = Rows16(st, pass);
            const AscendC::LocalTensor<float> o = oL0c_.BeginFill();
            for (uint32_t sub = round.firstSub; sub < round.subBlocks; ++sub) {
                const AscendC::LocalTensor<T> pL1 = pL1_.BeginUse();
                LoadLeft(pL0a.BeginFill(), pL1, rows16, bk);
                pL1_.EndUse();
                pL0a.EndFill();
                IssueProbs(st, round, seq);

                // V (keys x head_dim) is the right matrix: Zn wants each fractal transposed.
                if (passes_) {
                    LoadRight(l0b_.BeginFill(), vRound[sub * bk * d], bk, d);
                } else {
                    IssueValues();
                    const AscendC::LocalTensor<T> vL1 = vL1_.BeginUse();
                    LoadRight(l0b_.BeginFill(), vL1, bk, d);
                    vL1_.EndUse();
                    IssueValues();
                }
                l0b_.EndFill();

                const AscendC::LocalTensor<T> a = pL0a.BeginUse();
                if (sub > round.firstSub) {
                    AscendC::PipeBarrier<PIPE_M>();  // this product accumulates onto the previous one in L0C
                }
                AscendC::Mmad(o, a, l0b_.BeginUse(),
                              AscendC::MmadParams(static_cast<uint16_t>(rows16), static_cast<uint16_t>(d),
                                                  static_cast<uint16_t>(bk), 0, false, sub == round.firstSub));
                pL0a.EndUse();
                l0b_.EndUse();
            }
            oL0c_.EndFill();
            AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(
                exchange_.Output(seq, uint64_t{pass} * t_.cubeRows * d), oL0c_.BeginUse(),
                AscendC::FixpipeParamsV220(static_cast<uint16_t>(d), static_cast<uint16_t>(rows16),
                                           static_cast<uint16_t>(rows16), d, false));
            oL0c_.EndUse();
        }
        if (passes_) {
            vL1_.EndUse();
        }
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagOutput);
        if (++outputRound_ == st.rounds) {
            outputRound_ = 0;
            ++outputTiles_;
        }
    }

    TilingData t_;
    uint32_t core_ = 0;
    CoreTiles<CAUSAL> coreTiles_;
    StreamTile stream_[kStreamTiles] = {};
    bool tilesDone_ = false;    // the core's tile walk has ended
    uint32_t scoreTiles_ = 0;   // tiles begun (the S tile is the last of them)
    uint32_t scoreRound_ = 0;   // the S tile's rounds whose S was computed
    uint32_t outputTiles_ = 0;  // tiles whose P.V is done (the P.V tile is the next)
    uint32_t outputRound_ = 0;  // the P.V tile's rounds whose P.V was computed
    uint32_t probsIssued_ = 0;  // P loads of the current round (IssueProbs)
    bool passes_ = false;       // CubeInPasses: the cube works on a tile in row passes
    uint32_t scoreSeq_ = 0;     // rounds of the stream whose S was written (Workspace's slots)
    uint32_t outputSeq_ = 0;    // rounds of the stream whose P.V was written
    ExchangeBuffers<T> exchange_;
    DeviceSeqlens seqlens_;  // layout TND only
    AscendC::GlobalTensor<T> q_, k_, v_;
    AscendC::TBuf<AscendC::TPosition::A1> qL1Buf_, pL1Buf_;
    AscendC::TBuf<AscendC::TPosition::B1> kL1Buf_, vL1Buf_;
    AscendC::TBuf<AscendC::TPosition::A2> qL0aBuf_, pL0aBuf_;
    AscendC::TBuf<AscendC::TPosition::B2> l0bBuf_;
    AscendC::TBuf<AscendC::TPosition::CO1> oL0cBuf_, sL0cBuf_;
    L1Ring qL1_, kL1_, vL1_, pL1_;
    L0Ring qL0a_, pL0a_, l0b_;
    L0cRing oL0c_, sL0c_;
    AscendC::LocalTensor<T> qA_;      // Q in L0A for the current tile (not in passes)
    AscendC::LocalTensor<T> qL1Tile_;  // Q in L1 for the current tile
};

}  // namespace flash_cann

#endif
