// Dropout's keep mask on the vector core (AIV): Philox4x32-10, bit for bit what
// python/flash_cann/contract/variant.py's keep_mask gives (and cpu, triton): element
// (batch b, head h, query row i, key column j) is kept iff the FIRST output of Philox4x32-10
// with counter (j, i, h, b + offset) (each mod 2^32) and key = seed (low word first) is
// >= VariantTiling.dropoutThreshold. seed and offset are the int64 rng_state in GM, read
// here on the scalar unit, never on the host.
//
// The 910B vector unit (__NPU_ARCH__ 2201) has no 32x32 -> 64-bit multiply, no
// multiply-high and no Xor, so each Philox round is built from what it has (asc-devkit
// impl/basic_api/dav_c220):
//   lo(M * x)  Muls int32: the low 32 bits (integer saturation off, see Init);
//   hi(M * x)  16-bit limbs x = xH 2^16 + xL, M = MH 2^16 + ML, all four limb products in
//              int32 lanes (each < 2^32), then
//                s  = (xL ML >> 16) + xL MH          (< 2^32: MH < 0xFFFF)
//                s2 = (s & 0xFFFF) + xH ML           (< 2^32: ML < 0xFFFF)
//                hi = xH MH + (s >> 16) + (s2 >> 16);
//              x & 0xFFFF is (x << 16) >> 16 (ShiftLeft/ShiftRight take uint32);
//   a ^ b      (a | b) - (a & b) in 16-bit lanes (And/Or take only int16/uint16; the
//              difference never borrows, since a & b is a subset of a | b);
//   draw >= T  Compares orders only half/float (int32: EQ only): with the draw's halves
//              dH, dL and T's TH, TL, (float(dH) - TH) * 65536 + (float(dL) - TL) is exact
//              up to one rounding that keeps its sign, and >= 0 iff draw >= T.
// Round r's keys (seed words + r times the Weyl increments) are scalars, broadcast over
// one 256-byte repeat and read with repeat stride 0.
//
// The result is a bit mask, as Compares writes it (bit e of byte e / 8, row-major
// [rows][width]): 1 = keep. That is the cheapest form for the kernels: Select(dst, bits,
// src, 0.0f, VSEL_TENSOR_SCALAR_MODE, count) zeroes the dropped probabilities in one
// instruction, and 1 / (1 - p) is a per-tile scalar folded in where it costs least (the
// forward's epilogue, out = acc / l / (1 - p), since the row sum l is not dropped).
//
// Cost: per pass of n elements about 470 vector instructions of n/64 repeats (op_host/
// planner/schedule_model.h, DropoutMaskProgram, counts them with the model's rates).
#ifndef FLASH_CANN_FLASH_ATTENTION_PHILOX_H
#define FLASH_CANN_FLASH_ATTENTION_PHILOX_H

#include "kernel_operator.h"

namespace flash_cann {

constexpr uint32_t kPhiloxRounds = 10;
constexpr uint32_t kPhiloxMulA = 0xD2511F53u;   // Random123's PHILOX_M4x32_0
constexpr uint32_t kPhiloxMulB = 0xCD9E8D57u;   // PHILOX_M4x32_1
constexpr uint32_t kPhiloxKeyA = 0x9E3779B9u;   // the Weyl key increments
constexpr uint32_t kPhiloxKeyB = 0xBB67AE85u;
// Word arrays of a pass: the four counter words, the two products' high words, and four
// temporaries for each of the two multiplications (they run side by side, so one
// PipeBarrier<PIPE_V> follows a pair of independent instructions).
constexpr uint32_t kPhiloxWordArrays = 14;
constexpr uint32_t kPhiloxKeyBytes = 2 * 256;   // k0 and k1 of a round, one repeat each
constexpr uint32_t kPhiloxMaxPass = 255 * 64;   // the keyed And/Or: <= 255 repeats of 128 halves

// UB bytes of PhiloxDropout's scratch for passes of `passElements` elements.
__aicore__ inline constexpr uint32_t PhiloxScratchBytes(uint32_t passElements)
{
    return kPhiloxWordArrays * passElements * sizeof(uint32_t) + kPhiloxKeyBytes;
}

class PhiloxDropout {
public:
    // rngState: int64 (seed, offset) in GM. threshold: VariantTiling.dropoutThreshold.
    // scratch: PhiloxScratchBytes(passElements) bytes of UB, 32-byte aligned (a
    // TBuf<VECCALC>); passElements: a multiple of 64, at most kPhiloxMaxPass.
    __aicore__ inline void Init(GM_ADDR rngState, uint32_t threshold,
                                const AscendC::LocalTensor<uint8_t>& scratch, uint32_t passElements)
    {
        AscendC::GlobalTensor<int64_t> rng;
        rng.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(rngState), 2);
        const uint64_t seed = static_cast<uint64_t>(rng.GetValue(0));
        offset_ = static_cast<uint32_t>(static_cast<uint64_t>(rng.GetValue(1)));
        key0_ = static_cast<uint32_t>(seed);
        key1_ = static_cast<uint32_t>(seed >> 32);
        thresholdHigh_ = static_cast<float>(threshold >> 16);
        thresholdLow_ = static_cast<float>(threshold & 0xFFFFu);
        passElements_ = passElements;
        const AscendC::LocalTensor<uint32_t> words = scratch.ReinterpretCast<uint32_t>();
        for (uint32_t w = 0; w < kPhiloxWordArrays; ++w) {
            word_[w] = words[w * passElements];
        }
        keys_ = words[kPhiloxWordArrays * passElements];
    }

    // keepBits: bit r * width + c = keep(query row row0 + r, key column col0 + c) of
    // sequence `batch`, query head `head` (rows and columns are positions within the
    // sequence). width: a multiple of 8 (32-byte rows of words), at most passElements;
    // the slice runs in passes of passElements / width rows. Every pass's elements (its
    // rows times width) must be a multiple of 64 (whole repeats, for Compares), and of 256
    // when there is more than one pass (each pass's bits start 32-byte aligned): e.g.
    // width 512 or 1024 with any rows; width 96 (the backward's 32 x 96 steps) with an
    // even row count and passElements a multiple of 768. keepBits holds rows * width bits.
    // Barriers: Generate writes keepBits only after PipeBarrier<PIPE_V>s of its own, so
    // earlier vector readers of keepBits need none (the scratch is its own); its last instruction
    // (Compares) writes keepBits, so the caller puts a PipeBarrier<PIPE_V> before reading
    // them on the vector pipe (a queue hand-off before MTE3 reads them).
    __aicore__ inline void Generate(const AscendC::LocalTensor<uint8_t>& keepBits, uint32_t batch,
                                    uint32_t head, uint32_t row0, uint32_t rows, uint32_t col0,
                                    uint32_t width)
    {
        // The wrap of 32-bit products and sums is the arithmetic above: integer results
        // truncate (CTRL bit 53 = 0) instead of saturating, while the draw runs. The mode
        // (SaturationMode::INT, bit 53 in dav_c220's kernel_operator_common_impl.h; not in
        // the A2 SetSaturationFlag table) is put back as found: CTRL outlives the kernel.
        const bool saturating = AscendC::GetSaturationFlag<AscendC::SaturationMode::INT>();
        AscendC::SetSaturationFlag<AscendC::SaturationMode::INT>(false);
        const uint32_t passRows = passElements_ / width;
        for (uint32_t first = 0; first < rows; first += passRows) {
            const uint32_t passRowsHere = rows - first < passRows ? rows - first : passRows;
            Pass(keepBits[first * width / 8], batch, head, row0 + first, passRowsHere, col0, width);
        }
        // No barrier: CTRL, like the vector mask, is taken as read when an instruction issues
        // (in program order with this scalar write), which the documents do not state.
        AscendC::SetSaturationFlag<AscendC::SaturationMode::INT>(saturating);
    }

private:
    // Word arrays by role for the current round (indices into word_).
    struct Roles {
        uint32_t c[4];      // counter words c0..c3
        uint32_t hi[2];     // hi(A * c0), hi(B * c2)
        uint32_t t[2][4];   // temporaries of the A and B multiplications
    };

    __aicore__ inline AscendC::LocalTensor<int32_t> I32(uint32_t w) const
    {
        return word_[w].ReinterpretCast<int32_t>();
    }
    __aicore__ inline AscendC::LocalTensor<uint16_t> U16(uint32_t w) const
    {
        return word_[w].ReinterpretCast<uint16_t>();
    }
    __aicore__ inline AscendC::LocalTensor<int16_t> I16(uint32_t w) const
    {
        return word_[w].ReinterpretCast<int16_t>();
    }
    __aicore__ inline AscendC::LocalTensor<float> F32(uint32_t w) const
    {
        return word_[w].ReinterpretCast<float>();
    }

    __aicore__ inline void Pass(const AscendC::LocalTensor<uint8_t>& bits, uint32_t batch, uint32_t head,
                                uint32_t row0, uint32_t rows, uint32_t col0, uint32_t width)
    {
        const int32_t n = static_cast<int32_t>(rows * width);
        Roles role{{0, 1, 2, 3}, {4, 5}, {{6, 7, 8, 9}, {10, 11, 12, 13}}};
        // Counter (j, i, h, b + offset): one column ramp and one row value per row.
        for (uint32_t r = 0; r < rows; ++r) {
            AscendC::CreateVecIndex(I32(role.c[0])[r * width], static_cast<int32_t>(col0), width);
            AscendC::Duplicate(I32(role.c[1])[r * width], static_cast<int32_t>(row0 + r),
                               static_cast<int32_t>(width));
        }
        AscendC::Duplicate(I32(role.c[2]), static_cast<int32_t>(head), n);
        AscendC::Duplicate(I32(role.c[3]), static_cast<int32_t>(batch + offset_), n);
        AscendC::PipeBarrier<PIPE_V>();
        uint32_t k0 = key0_, k1 = key1_;
        for (uint32_t round = 0; round < kPhiloxRounds; ++round) {
            const bool last = round + 1 == kPhiloxRounds;  // only the first output is needed
            Round(role, n, k0, k1, last);
            // (c0, c1, c2, c3) <- (hi_B ^ c1 ^ k0, lo_B, hi_A ^ c3 ^ k1, lo_A); lo_A and lo_B
            // were computed in place of c0 and c2, so only the roles move.
            const Roles old = role;
            role.c[0] = old.hi[1];
            role.c[1] = old.c[2];
            role.c[2] = old.hi[0];
            role.c[3] = old.c[0];
            role.hi[0] = old.c[1];
            role.hi[1] = old.c[3];
            k0 += kPhiloxKeyA;
            k1 += kPhiloxKeyB;
        }
        KeepBits(bits, role.c[0], role.t[0], n);
    }

    // One Philox round on n elements: hi(A c0), lo(A c0) (in place), hi(B c2), lo(B c2)
    // (in place), then hi_B ^= c1 ^ k0, hi_A ^= c3 ^ k1. `last`: the B half only.
    __aicore__ inline void Round(const Roles& role, int32_t n, uint32_t k0, uint32_t k1, bool last)
    {
        AscendC::Duplicate(keys_.ReinterpretCast<int32_t>(), static_cast<int32_t>(k0), 64);
        AscendC::Duplicate(keys_[64].ReinterpretCast<int32_t>(), static_cast<int32_t>(k1), 64);
        const uint32_t firstChain = last ? 1 : 0;
        const uint32_t x[2] = {role.c[0], role.c[2]};
        const uint32_t mul[2] = {kPhiloxMulA, kPhiloxMulB};
        MulHigh(role, x, mul, firstChain, n, !last);
        // The round's two xors: hi_B ^ c1 ^ k0 into hi_B, hi_A ^ c3 ^ k1 into hi_A.
        const uint32_t other[2] = {role.c[3], role.c[1]};
        for (uint32_t chain = firstChain; chain < 2; ++chain) {
            XorInto(role.hi[chain], other[chain], role.t[chain], n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t chain = firstChain; chain < 2; ++chain) {
            Difference(role.hi[chain], role.t[chain], n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t chain = firstChain; chain < 2; ++chain) {
            XorKeyInto(role.hi[chain], chain == 1 ? 0 : 64, role.t[chain], n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t chain = firstChain; chain < 2; ++chain) {
            Difference(role.hi[chain], role.t[chain], n);
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    // hi[c] = high word of mul[c] * x[c] for the chains c >= firstChain, side by side; with
    // `low`, x[c] becomes the low word (in place).
    __aicore__ inline void MulHigh(const Roles& role, const uint32_t x[2], const uint32_t mul[2],
                                   uint32_t firstChain, int32_t n, bool low)
    {
        using AscendC::LocalTensor;
        for (uint32_t c = firstChain; c < 2; ++c) {  // xH, xL << 16
            const uint32_t* t = role.t[c];
            AscendC::ShiftRight(word_[t[0]], word_[x[c]], 16u, n);
            AscendC::ShiftLeft(word_[t[1]], word_[x[c]], 16u, n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // xL; the low word (x's last read was above)
            const uint32_t* t = role.t[c];
            AscendC::ShiftRight(word_[t[1]], word_[t[1]], 16u, n);
            if (low) {
                AscendC::Muls(I32(x[c]), I32(x[c]), static_cast<int32_t>(mul[c]), n);
            }
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // xL ML, xH ML
            const uint32_t* t = role.t[c];
            const int32_t mulLow = static_cast<int32_t>(mul[c] & 0xFFFFu);
            AscendC::Muls(I32(t[2]), I32(t[1]), mulLow, n);
            AscendC::Muls(I32(t[3]), I32(t[0]), mulLow, n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // xL MH, xH MH, xL ML >> 16
            const uint32_t* t = role.t[c];
            const int32_t mulHigh = static_cast<int32_t>(mul[c] >> 16);
            AscendC::Muls(I32(t[1]), I32(t[1]), mulHigh, n);
            AscendC::Muls(I32(t[0]), I32(t[0]), mulHigh, n);
            AscendC::ShiftRight(word_[t[2]], word_[t[2]], 16u, n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // s = (xL ML >> 16) + xL MH
            const uint32_t* t = role.t[c];
            AscendC::Add(I32(t[2]), I32(t[2]), I32(t[1]), n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // s >> 16, s << 16
            const uint32_t* t = role.t[c];
            AscendC::ShiftRight(word_[role.hi[c]], word_[t[2]], 16u, n);
            AscendC::ShiftLeft(word_[t[1]], word_[t[2]], 16u, n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // s & 0xFFFF; hi = xH MH + (s >> 16)
            const uint32_t* t = role.t[c];
            AscendC::ShiftRight(word_[t[1]], word_[t[1]], 16u, n);
            AscendC::Add(I32(role.hi[c]), I32(role.hi[c]), I32(t[0]), n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // s2 = (s & 0xFFFF) + xH ML
            const uint32_t* t = role.t[c];
            AscendC::Add(I32(t[1]), I32(t[1]), I32(t[3]), n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {
            const uint32_t* t = role.t[c];
            AscendC::ShiftRight(word_[t[1]], word_[t[1]], 16u, n);
        }
        AscendC::PipeBarrier<PIPE_V>();
        for (uint32_t c = firstChain; c < 2; ++c) {  // hi += s2 >> 16
            const uint32_t* t = role.t[c];
            AscendC::Add(I32(role.hi[c]), I32(role.hi[c]), I32(t[1]), n);
        }
        AscendC::PipeBarrier<PIPE_V>();
    }

    // t[0] = a & b, t[1] = a | b (16-bit lanes); Difference then makes a = a ^ b.
    __aicore__ inline void XorInto(uint32_t a, uint32_t b, const uint32_t t[4], int32_t n)
    {
        AscendC::And(U16(t[0]), U16(a), U16(b), 2 * n);
        AscendC::Or(U16(t[1]), U16(a), U16(b), 2 * n);
    }

    // The same with b = the key broadcast at `keyOffset` (words) of keys_, read with
    // repeat stride 0.
    __aicore__ inline void XorKeyInto(uint32_t a, uint32_t keyOffset, const uint32_t t[4], int32_t n)
    {
        const AscendC::LocalTensor<uint16_t> key = keys_[keyOffset].ReinterpretCast<uint16_t>();
        const AscendC::BinaryRepeatParams params(1, 1, 1, 8, 8, 0);
        const uint8_t repeats = static_cast<uint8_t>(2 * n / 128);
        AscendC::And(U16(t[0]), U16(a), key, 128, repeats, params);
        AscendC::Or(U16(t[1]), U16(a), key, 128, repeats, params);
    }

    __aicore__ inline void Difference(uint32_t a, const uint32_t t[4], int32_t n)
    {
        AscendC::Sub(I16(a), I16(t[1]), I16(t[0]), 2 * n);
    }

    // bits = draw >= threshold, from the halves of the draw as exact floats.
    __aicore__ inline void KeepBits(const AscendC::LocalTensor<uint8_t>& bits, uint32_t draw,
                                    const uint32_t t[4], int32_t n)
    {
        AscendC::ShiftRight(word_[t[0]], word_[draw], 16u, n);
        AscendC::ShiftLeft(word_[t[1]], word_[draw], 16u, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::ShiftRight(word_[t[1]], word_[t[1]], 16u, n);
        AscendC::Cast(F32(t[2]), I32(t[0]), AscendC::RoundMode::CAST_NONE, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Cast(F32(t[3]), I32(t[1]), AscendC::RoundMode::CAST_NONE, n);
        AscendC::Adds(F32(t[2]), F32(t[2]), -thresholdHigh_, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(F32(t[3]), F32(t[3]), -thresholdLow_, n);
        AscendC::Muls(F32(t[2]), F32(t[2]), 65536.0f, n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Add(F32(t[2]), F32(t[2]), F32(t[3]), n);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Compares(bits, F32(t[2]), 0.0f, AscendC::CMPMODE::GE, static_cast<uint32_t>(n));
    }

    AscendC::LocalTensor<uint32_t> word_[kPhiloxWordArrays];
    AscendC::LocalTensor<uint32_t> keys_;
    uint32_t passElements_ = 0;
    uint32_t key0_ = 0, key1_ = 0, offset_ = 0;
    float thresholdHigh_ = 0, thresholdLow_ = 0;
};

}  // namespace flash_cann

#endif
