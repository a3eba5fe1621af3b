// The cube (AIC) half of the FlashAttention forward kernel: both matrix products.
//
// Per query tile (up to blockQ rows of one batch/head), for every key block it visits:
//   IterateBmm1  S = Q K^T         Q (L1, loaded once per tile) -> L0A, K -> L1 -> L0B,
//                                  Mmad -> L0C, Fixpipe -> workspace S slot -> flag AIVs
//   IterateBmm2  O_partial = P V   wait for the AIVs' P, P -> L1 -> L0A, V -> L1 -> L0B
//                                  (transposed fractals), Mmad -> L0C, Fixpipe -> workspace
//                                  O slot -> flag AIVs
// S of the next block is computed before P.V of the current one, so the vector cores
// always have a block to work on. Queues (TQue) order the MTE2 -> MTE1 -> M -> FIX pipes.
#ifndef FLASH_CANN_FLASH_ATTENTION_CUBE_H
#define FLASH_CANN_FLASH_ATTENTION_CUBE_H

#include "flash_attention_common.h"

namespace flash_cann {

template <typename T, bool CAUSAL, bool MASK>
class FlashAttentionCube {
public:
    __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR keyPaddingMask,
                                GM_ADDR userWorkspace, const TilingData& tiling,
                                AscendC::TPipe* pipe)
    {
        t_ = tiling;
        core_ = static_cast<uint32_t>(AscendC::GetBlockIdx());
        q_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(query));
        k_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(key));
        v_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(value));
        if (MASK) {
            mask_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(keyPaddingMask));
        }
        exchange_.Init(userWorkspace, core_, t_);

        const BufferBytes bytes = ComputeBufferBytes(t_, sizeof(T));
        pipe->InitBuffer(qQue_, 1, bytes.qL1);
        pipe->InitBuffer(kQue_, t_.kvL1Buffers, bytes.kL1);
        pipe->InitBuffer(vQue_, t_.kvL1Buffers, bytes.vL1);
        pipe->InitBuffer(pQue_, t_.pL1Buffers, bytes.pL1);
        pipe->InitBuffer(aQue_, t_.l0aBuffers, bytes.l0a);
        pipe->InitBuffer(bQue_, t_.l0bBuffers, bytes.l0b);
        pipe->InitBuffer(cQue_, t_.l0cBuffers, bytes.l0c);
    }

    __aicore__ inline void Process()
    {
        if (core_ >= t_.usedCores) {
            return;
        }
        uint64_t cursor = t_.rowStart[core_];
        QueryTile tile;
        while (NextTile(t_, cursor, t_.rowStart[core_ + 1], tile)) {
            const uint32_t keyEnd = KeyEnd<CAUSAL>(t_, tile);
            const uint32_t blocks = (keyEnd + t_.blockK - 1) / t_.blockK;
            uint32_t current = NextVisibleBlock<MASK>(t_, mask_, tile.batch, keyEnd, 0);
            if (current == blocks) {
                continue;  // no key to attend to: the vector cores write 0 and -inf
            }
            LoadQuery(tile);
            IterateBmm1(tile, keyEnd, current);
            uint32_t next = NextVisibleBlock<MASK>(t_, mask_, tile.batch, keyEnd, current + 1);
            if (next < blocks) {
                IterateBmm1(tile, keyEnd, next);
            }
            while (current < blocks) {
                IterateBmm2(tile, keyEnd, current);
                const uint32_t after =
                    next < blocks ? NextVisibleBlock<MASK>(t_, mask_, tile.batch, keyEnd, next + 1)
                                  : blocks;
                if (after < blocks) {
                    IterateBmm1(tile, keyEnd, after);
                }
                current = next;
                next = after;
            }
            qQue_.FreeTensor(qL1_);
        }
    }

private:
    // Rows of Q (or K, V) ND in GM -> Nz in L1 with `padRows` rows. Key/value rows past
    // `rows` are the reduction dimension of P.V and the columns of S: zero them first, so
    // no stale L1 data enters a product. (A partial last 32-byte column block, when
    // head_dim is not a multiple of 16, is zero-padded by the ND->NZ copy itself.)
    __aicore__ inline void LoadRows(const AscendC::LocalTensor<T>& l1, const AscendC::GlobalTensor<T>& src,
                                    uint32_t rows, uint32_t padRows, uint64_t pitch, bool zeroTail)
    {
        if (zeroTail && rows < padRows) {
            const uint16_t blocks = static_cast<uint16_t>(padRows * t_.headDimPad * sizeof(T) / kByteBlock);
            AscendC::InitConstValue(l1, AscendC::InitConstValueParams<T>(1, blocks, 0, T(0.0f)));
            AscendC::PipeBarrier<PIPE_MTE2>();
        }
        AscendC::DataCopy(l1, src,
                          AscendC::Nd2NzParams(1, static_cast<uint16_t>(rows),
                                               static_cast<uint16_t>(t_.headDim), 0,
                                               static_cast<uint16_t>(pitch),
                                               static_cast<uint16_t>(padRows), 1, 0));
    }

    // Nz (L1, `rows` padded rows) -> Zz (L0A): one LoadData per 16-row block.
    __aicore__ inline void LoadLeft(const AscendC::LocalTensor<T>& a, const AscendC::LocalTensor<T>& l1,
                                    uint32_t rows, uint32_t cols)
    {
        for (uint32_t block = 0; block < rows / kCubeBlock; ++block) {
            AscendC::LoadData(a[block * kCubeBlock * cols], l1[block * kCubeBlock * kCubeBlock],
                              AscendC::LoadData2DParams(0, static_cast<uint8_t>(cols / kCubeBlock),
                                                        static_cast<uint16_t>(rows / kCubeBlock), 0,
                                                        0, false, 0));
        }
    }

    __aicore__ inline void LoadQuery(const QueryTile& tile)
    {
        rows16_ = AlignUp(tile.rows, kCubeBlock);
        const uint64_t offset = uint64_t{tile.batch} * t_.qStrideBatch +
                                uint64_t{tile.headQ} * t_.qStrideHead + uint64_t{tile.row0} * t_.qStrideRow;
        qL1_ = qQue_.template AllocTensor<T>();
        LoadRows(qL1_, q_[offset], tile.rows, rows16_, t_.qStrideRow, false);
        qQue_.EnQue(qL1_);
        qL1_ = qQue_.template DeQue<T>();
    }

    __aicore__ inline uint64_t KeyOffset(const QueryTile& tile, uint32_t block) const
    {
        return uint64_t{tile.batch} * t_.kvStrideBatch + uint64_t{tile.headKv} * t_.kvStrideHead +
               uint64_t{block} * t_.blockK * t_.kvStrideRow;
    }

    __aicore__ inline uint32_t Columns(uint32_t keyEnd, uint32_t block) const
    {
        return MinU32(t_.blockK, keyEnd - block * t_.blockK);
    }

    // S = Q K^T for one key block, into S slot (block sequence % 2).
    __aicore__ inline void IterateBmm1(const QueryTile& tile, uint32_t keyEnd, uint32_t block)
    {
        const uint32_t bk = t_.blockK;
        const uint32_t d = t_.headDimPad;
        AscendC::LocalTensor<T> kL1 = kQue_.template AllocTensor<T>();
        LoadRows(kL1, k_[KeyOffset(tile, block)], Columns(keyEnd, block), bk, t_.kvStrideRow, true);
        kQue_.EnQue(kL1);
        kL1 = kQue_.template DeQue<T>();

        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, qL1_, rows16_, d);
        aQue_.EnQue(a);
        a = aQue_.template DeQue<T>();
        // K in Nz is already the Zn layout of K^T: copy fractals straight, per column block.
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        for (uint32_t col = 0; col < d / kCubeBlock; ++col) {
            AscendC::LoadData(b[col * bk * kCubeBlock], kL1[col * bk * kCubeBlock],
                              AscendC::LoadData2DParams(0, static_cast<uint8_t>(bk / kCubeBlock), 1,
                                                        0, 0, false, 0));
        }
        bQue_.EnQue(b);
        b = bQue_.template DeQue<T>();
        kQue_.FreeTensor(kL1);

        AscendC::LocalTensor<float> c = cQue_.template AllocTensor<float>();
        AscendC::Mmad(c, a, b, AscendC::MmadParams(static_cast<uint16_t>(rows16_),
                                                   static_cast<uint16_t>(bk),
                                                   static_cast<uint16_t>(d), 0, false, true));
        aQue_.FreeTensor(a);
        bQue_.FreeTensor(b);
        cQue_.EnQue(c);
        c = cQue_.template DeQue<float>();
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(
            exchange_.Scores(scoreSeq_++ % 2, 0), c,
            AscendC::FixpipeParamsV220(static_cast<uint16_t>(bk), static_cast<uint16_t>(rows16_),
                                       static_cast<uint16_t>(rows16_), bk, false));
        cQue_.FreeTensor(c);
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagScores);
    }

    // O_partial = P V for one key block, into O slot (block sequence % 2).
    __aicore__ inline void IterateBmm2(const QueryTile& tile, uint32_t keyEnd, uint32_t block)
    {
        const uint32_t bk = t_.blockK;
        const uint32_t d = t_.headDimPad;
        const uint32_t slot = outputSeq_++ % 2;
        AscendC::CrossCoreWaitFlag(kFlagProbs);
        AscendC::LocalTensor<T> pL1 = pQue_.template AllocTensor<T>();
        AscendC::DataCopy(pL1, exchange_.Probs(slot, 0),
                          AscendC::Nd2NzParams(1, static_cast<uint16_t>(rows16_),
                                               static_cast<uint16_t>(bk), 0,
                                               static_cast<uint16_t>(bk),
                                               static_cast<uint16_t>(rows16_), 1, 0));
        pQue_.EnQue(pL1);
        pL1 = pQue_.template DeQue<T>();
        AscendC::LocalTensor<T> vL1 = vQue_.template AllocTensor<T>();
        LoadRows(vL1, v_[KeyOffset(tile, block)], Columns(keyEnd, block), bk, t_.kvStrideRow, true);
        vQue_.EnQue(vL1);
        vL1 = vQue_.template DeQue<T>();

        AscendC::LocalTensor<T> a = aQue_.template AllocTensor<T>();
        LoadLeft(a, pL1, rows16_, bk);
        aQue_.EnQue(a);
        a = aQue_.template DeQue<T>();
        pQue_.FreeTensor(pL1);
        // V (keys x head_dim) is the right matrix: Zn wants each fractal transposed.
        AscendC::LocalTensor<T> b = bQue_.template AllocTensor<T>();
        for (uint32_t row = 0; row < bk / kCubeBlock; ++row) {
            AscendC::LoadData(b[row * kCubeBlock * d], vL1[row * kCubeBlock * kCubeBlock],
                              AscendC::LoadData2DParams(0, static_cast<uint8_t>(d / kCubeBlock),
                                                        static_cast<uint16_t>(bk / kCubeBlock), 0,
                                                        0, true, 0));
        }
        bQue_.EnQue(b);
        b = bQue_.template DeQue<T>();
        vQue_.FreeTensor(vL1);

        AscendC::LocalTensor<float> c = cQue_.template AllocTensor<float>();
        AscendC::Mmad(c, a, b, AscendC::MmadParams(static_cast<uint16_t>(rows16_),
                                                   static_cast<uint16_t>(d),
                                                   static_cast<uint16_t>(bk), 0, false, true));
        aQue_.FreeTensor(a);
        bQue_.FreeTensor(b);
        cQue_.EnQue(c);
        c = cQue_.template DeQue<float>();
        AscendC::Fixpipe<float, float, AscendC::CFG_ROW_MAJOR>(
            exchange_.Output(slot, 0), c,
            AscendC::FixpipeParamsV220(static_cast<uint16_t>(d), static_cast<uint16_t>(rows16_),
                                       static_cast<uint16_t>(rows16_), d, false));
        cQue_.FreeTensor(c);
        AscendC::CrossCoreSetFlag<2, PIPE_FIX>(kFlagOutput);
    }

    TilingData t_;
    uint32_t core_ = 0;
    uint32_t rows16_ = 0;
    uint32_t scoreSeq_ = 0;
    uint32_t outputSeq_ = 0;
    ExchangeBuffers<T> exchange_;
    AscendC::GlobalTensor<T> q_, k_, v_;
    AscendC::GlobalTensor<uint8_t> mask_;
    AscendC::TQue<AscendC::TPosition::A1, 1> qQue_;
    AscendC::TQue<AscendC::TPosition::A1, 1> pQue_;
    AscendC::TQue<AscendC::TPosition::B1, 1> kQue_;
    AscendC::TQue<AscendC::TPosition::B1, 1> vQue_;
    AscendC::TQue<AscendC::TPosition::A2, 1> aQue_;
    AscendC::TQue<AscendC::TPosition::B2, 1> bQue_;
    AscendC::TQue<AscendC::TPosition::CO1, 1> cQue_;
    AscendC::LocalTensor<T> qL1_;
};

}  // namespace flash_cann

#endif
