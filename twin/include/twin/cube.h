// Data movement and the cube path of the twin (namespace AscendC).
//
// Layouts follow the 910B fractal formats: L1 holds Nz (what ND->NZ copies produce),
// L0A holds Zz (left matrix), L0B holds Zn (right matrix), L0C holds Nz fp32 fractals;
// a fractal is 16 rows x 32 bytes (16 x 16 for 16-bit types). Units are those of the
// API: DataCopyParams in 32-byte blocks, DataCopyExtParams in bytes on the GM side and
// blocks on the UB side, LoadData in 512-byte fractals, Nd2NzParams in elements and
// C0 (32-byte) units, Fixpipe ND strides in elements.
//
// The pipe of each call (PipeBarrier docs, "instruction pipes": MTE2 moves GM -> L1/UB,
// MTE3 UB -> GM, MTE1 L1 -> L0A/L0B, M is the cube, FIX moves L0C -> GM) is the first
// argument of its twin::Instruction, which tells the race detector what it reads and
// writes.
#ifndef FLASH_CANN_TWIN_CUBE_H
#define FLASH_CANN_TWIN_CUBE_H

#include <algorithm>
#include <type_traits>
#include <vector>

#include "tensor.h"

namespace AscendC {

struct DataCopyParams {
    DataCopyParams() = default;
    DataCopyParams(uint16_t count, uint16_t len, uint16_t srcStrideIn, uint16_t dstStrideIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
    uint16_t blockCount = 1;
    uint16_t blockLen = 0;
    uint16_t srcStride = 0;
    uint16_t dstStride = 0;
};

struct DataCopyExtParams {
    DataCopyExtParams() = default;
    DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcStrideIn, uint32_t dstStrideIn,
                      uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn),
          rsv(rsvIn) {}
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;
    uint32_t srcStride = 0;
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
    DataCopyPadExtParams() = default;
    DataCopyPadExtParams(bool isPadValue, uint8_t leftPadValue, uint8_t rightPadValue, T padValue)
        : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue),
          paddingValue(padValue) {}
    bool isPad = false;
    uint8_t leftPadding = 0;
    uint8_t rightPadding = 0;
    T paddingValue = 0;
};

struct Nd2NzParams {
    Nd2NzParams() = default;
    Nd2NzParams(uint16_t ndNumIn, uint16_t nValueIn, uint16_t dValueIn,
                uint16_t srcNdMatrixStrideIn, uint16_t srcDValueIn, uint16_t dstNzC0StrideIn,
                uint16_t dstNzNStrideIn, uint16_t dstNzMatrixStrideIn)
        : ndNum(ndNumIn), nValue(nValueIn), dValue(dValueIn),
          srcNdMatrixStride(srcNdMatrixStrideIn), srcDValue(srcDValueIn),
          dstNzC0Stride(dstNzC0StrideIn), dstNzNStride(dstNzNStrideIn),
          dstNzMatrixStride(dstNzMatrixStrideIn) {}
    uint16_t ndNum = 0, nValue = 0, dValue = 0, srcNdMatrixStride = 0, srcDValue = 0;
    uint16_t dstNzC0Stride = 0, dstNzNStride = 0, dstNzMatrixStride = 0;
};

template <typename T>
struct InitConstValueParams {
    InitConstValueParams() = default;
    InitConstValueParams(uint16_t repeatTimesIn, uint16_t blockNumIn, uint16_t dstGapIn,
                         const T initValueIn)
        : repeatTimes(repeatTimesIn), blockNum(blockNumIn), dstGap(dstGapIn),
          initValue(initValueIn) {}
    uint16_t repeatTimes = 0;
    uint16_t blockNum = 0;
    uint16_t dstGap = 0;
    T initValue = 0;
};

struct LoadData2DParams {
    LoadData2DParams() = default;
    LoadData2DParams(uint16_t startIndexIn, uint8_t repeatTimesIn, uint16_t srcStrideIn,
                     uint8_t sidIn, uint16_t dstGapIn, bool ifTransposeIn, uint8_t addrModeIn)
        : startIndex(startIndexIn), dstGap(dstGapIn), srcStride(srcStrideIn),
          ifTranspose(ifTransposeIn), repeatTimes(repeatTimesIn), sid(sidIn),
          addrMode(addrModeIn) {}
    uint16_t startIndex = 0;
    uint16_t dstGap = 0;
    uint16_t srcStride = 0;
    bool ifTranspose = false;
    uint8_t repeatTimes = 0;
    uint8_t sid = 0;
    uint8_t addrMode = 0;
};

struct MmadParams {
    MmadParams() = default;
    MmadParams(uint16_t mIn, uint16_t nIn, uint16_t kIn, uint8_t unitFlagIn,
               bool cmatrixSourceIn, bool cmatrixInitValIn)
        : m(mIn), n(nIn), k(kIn), unitFlag(unitFlagIn), cmatrixSource(cmatrixSourceIn),
          cmatrixInitVal(cmatrixInitValIn) {}
    uint16_t m = 0, n = 0, k = 0;
    bool isBias = false;
    uint8_t unitFlag = 0;
    bool cmatrixSource = false;
    bool cmatrixInitVal = true;
};

enum class CO2Layout : uint8_t { NZ = 0, ROW_MAJOR, COLUMN_MAJOR };
struct FixpipeConfig {
    CO2Layout format;
};
constexpr FixpipeConfig CFG_NZ = {CO2Layout::NZ};
constexpr FixpipeConfig CFG_ROW_MAJOR = {CO2Layout::ROW_MAJOR};

}  // namespace AscendC

enum class QuantMode_t : uint8_t { NoQuant = 0, F322F16, F322BF16 };

namespace AscendC {

struct FixpipeParamsV220 {
    FixpipeParamsV220() = default;
    FixpipeParamsV220(uint16_t nSizeIn, uint16_t mSizeIn, uint16_t srcStrideIn,
                      uint32_t dstStrideIn, bool reluEnIn)
        : nSize(nSizeIn), mSize(mSizeIn), srcStride(srcStrideIn), dstStride(dstStrideIn),
          reluEn(reluEnIn) {}
    uint16_t nSize = 0;
    uint16_t mSize = 0;
    uint16_t srcStride = 0;
    uint32_t dstStride = 0;
    QuantMode_t quantPre = QuantMode_t::NoQuant;
    bool reluEn = false;
};

namespace twin_detail {

void RequireCore(twin::CoreType type, const twin::Site& site, const char* what);
void RequireMemory(twin::Memory actual, std::initializer_list<twin::Memory> allowed,
                   const twin::Site& site, const char* what);
void RequireAligned(uint32_t byteOffset, uint32_t alignment, const twin::Site& site,
                    const char* what);

// Stores `count` elements to GM: plainly, or, while SetAtomicAdd<float>() is in force on
// this core, added to what GM holds (asc-devkit docs, SetAtomicAdd: "subsequent
// transfers whose destination is GM" from UB, L0C or L1; the atomic type must be the
// data's type).
template <typename T>
void StoreGm(T* to, const T* from, uint64_t count, const twin::Site& site, const char* what)
{
    if (!twin::Core().atomicAddFloat) {
        std::memcpy(to, from, count * sizeof(T));
        return;
    }
    if constexpr (std::is_same<T, float>::value) {
        for (uint64_t i = 0; i < count; ++i) {
            twin::AtomicAddFloat(to + i, from[i]);
        }
    } else {
        twin::Fail(site, "[R01] ", what, ": SetAtomicAdd<float> is in force, but the copy moves ",
                   sizeof(T), "-byte elements: the hardware would add them as float");
    }
}

}  // namespace twin_detail

// Atomic add for the following copies to GM of this core (UB -> GM DataCopy/DataCopyPad,
// L0C -> GM Fixpipe), until SetAtomicNone. 910B also adds half, bfloat16_t and int8/16/32
// (asc-devkit docs, SetAtomicAdd); the twin implements float, what the kernels use.
template <typename T>
void SetAtomicAdd()
{
    static_assert(std::is_same<T, float>::value, "the twin implements SetAtomicAdd<float> only");
    twin::Core().atomicAddFloat = true;
}

inline void SetAtomicNone()
{
    twin::Core().atomicAddFloat = false;
}

// GM -> UB, count form: count * sizeof(T) must be whole 32-byte blocks (the hardware
// silently drops a partial tail block).
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count, TWIN_SITE)
{
    const uint64_t bytes = uint64_t{count} * sizeof(T);
    twin::Require(bytes % twin::kBlockBytes == 0, TWIN_HERE, "[R02] ", "DataCopy of ", bytes,
                  " bytes is not a multiple of 32: the hardware would drop the last ",
                  bytes % twin::kBlockBytes, " bytes");
    twin_detail::RequireMemory(dst.Memory(), {twin::Memory::UB, twin::Memory::L1}, TWIN_HERE,
                               "DataCopy GM->local destination");
    twin_detail::RequireAligned(dst.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "DataCopy destination");
    dst.CheckElements(0, count, TWIN_HERE, "DataCopy destination");
    twin::CheckGm(src.Data(), bytes, TWIN_HERE, "DataCopy source");
    const twin::Route route = dst.Memory() == twin::Memory::L1 ? twin::Route::kGmToL1 : twin::Route::kGmToUb;
    const twin::Instruction op(twin::kPipeMte2, TWIN_HERE, twin::Work::Transfer(route, bytes));
    op.Read(twin::Memory::GM, src.Data(), bytes);
    op.Write(dst.Memory(), dst.Bytes(), bytes);
    std::memcpy(dst.Data(), src.Data(), bytes);
}

// UB -> GM, count form.
template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count, TWIN_SITE)
{
    const uint64_t bytes = uint64_t{count} * sizeof(T);
    twin::Require(bytes % twin::kBlockBytes == 0, TWIN_HERE, "[R03] ", "DataCopy of ", bytes,
                  " bytes is not a multiple of 32: the hardware would drop the last ",
                  bytes % twin::kBlockBytes, " bytes");
    twin_detail::RequireMemory(src.Memory(), {twin::Memory::UB}, TWIN_HERE, "DataCopy UB->GM source");
    twin_detail::RequireAligned(src.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "DataCopy source");
    src.CheckElements(0, count, TWIN_HERE, "DataCopy source");
    twin::CheckGm(dst.Data(), bytes, TWIN_HERE, "DataCopy destination");
    const twin::Instruction op(twin::kPipeMte3, TWIN_HERE, twin::Work::Transfer(twin::Route::kUbToGm, bytes));
    op.Read(twin::Memory::UB, src.Bytes(), bytes);
    op.Write(twin::Memory::GM, dst.Data(), bytes);
    twin_detail::StoreGm(dst.Data(), src.Data(), count, TWIN_HERE, "DataCopy UB->GM");
}

// GM -> L1, ND to Nz: element (r, c) of ND matrix i lands at
// (c / C0) * dstNzC0Stride * C0 + r * dstNzNStride * C0 + c % C0 (+ i * dstNzMatrixStride);
// a partial last C0 column block is zero-padded.
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p, TWIN_SITE)
{
    twin_detail::RequireCore(twin::CoreType::AIC, TWIN_HERE, "DataCopy with Nd2NzParams");
    twin_detail::RequireMemory(dst.Memory(), {twin::Memory::L1}, TWIN_HERE, "ND2NZ destination");
    twin_detail::RequireAligned(dst.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "ND2NZ destination");
    twin::Require(p.ndNum >= 1 && p.dstNzC0Stride >= 1 && p.dstNzNStride >= 1 && p.nValue <= 16384,
                  TWIN_HERE, "[R04] ", "Nd2NzParams out of range (ndNum ", p.ndNum, ", nValue ", p.nValue,
                  ", dstNzC0Stride ", p.dstNzC0Stride, ", dstNzNStride ", p.dstNzNStride, ")");
    twin::Require(p.dValue <= p.srcDValue || p.nValue <= 1, TWIN_HERE, "[R05] ", "Nd2NzParams: dValue ",
                  p.dValue, " exceeds the source row pitch srcDValue ", p.srcDValue);
    constexpr uint32_t c0 = twin::kBlockBytes / sizeof(T);
    const uint32_t blocks = (p.dValue + c0 - 1) / c0;
    // The hardware moves whole 32-byte C0 blocks of every row.
    const twin::Instruction op(twin::kPipeMte2, TWIN_HERE,
                               twin::Work::Transfer(twin::Route::kGmToL1, uint64_t{p.ndNum} * p.nValue *
                                                                              blocks * twin::kBlockBytes));
    for (uint32_t m = 0; m < p.ndNum; ++m) {
        const T* matrix = src.Data() + uint64_t{m} * p.srcNdMatrixStride;
        if (p.nValue > 0) {
            twin::CheckGm(matrix, ((uint64_t{p.nValue} - 1) * p.srcDValue + p.dValue) * sizeof(T),
                          TWIN_HERE, "ND2NZ source");
            op.Rows(twin::Memory::GM, matrix, p.nValue, p.dValue * sizeof(T), p.srcDValue * sizeof(T),
                    false);
            for (uint32_t b = 0; b < blocks; ++b) {
                const uint64_t at = uint64_t{m} * p.dstNzMatrixStride + uint64_t{b} * p.dstNzC0Stride * c0;
                dst.CheckElements(at + (uint64_t{p.nValue} - 1) * p.dstNzNStride * c0, c0, TWIN_HERE,
                                  "ND2NZ destination");
                op.Rows(dst.Memory(), dst.Data() + at, p.nValue, twin::kBlockBytes,
                        uint64_t{p.dstNzNStride} * twin::kBlockBytes, true);
            }
        }
        for (uint32_t r = 0; r < p.nValue && twin::Computing(); ++r) {
            for (uint32_t b = 0; b < blocks; ++b) {
                const uint64_t at = uint64_t{m} * p.dstNzMatrixStride +
                                    uint64_t{b} * p.dstNzC0Stride * c0 +
                                    uint64_t{r} * p.dstNzNStride * c0;
                dst.CheckElements(at, c0, TWIN_HERE, "ND2NZ destination");
                for (uint32_t c = 0; c < c0; ++c) {
                    const uint32_t col = b * c0 + c;
                    dst.Data()[at + c] = col < p.dValue ? matrix[uint64_t{r} * p.srcDValue + col] : T(0.0f);
                }
            }
        }
    }
}

// GM -> UB with byte lengths: each block occupies ceil(blockLen / 32) blocks in UB.
template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad, TWIN_SITE)
{
    twin_detail::RequireMemory(dst.Memory(), {twin::Memory::UB}, TWIN_HERE, "DataCopyPad destination");
    twin_detail::RequireAligned(dst.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "DataCopyPad destination");
    twin::Require(p.blockLen % sizeof(T) == 0 && p.blockLen <= 2097151, TWIN_HERE, "[R06] ",
                  "DataCopyPad: blockLen ", p.blockLen, " bytes is not a whole number of elements");
    const uint32_t ubBlock = (p.blockLen + twin::kBlockBytes - 1) / twin::kBlockBytes * twin::kBlockBytes;
    const uint8_t* from = reinterpret_cast<const uint8_t*>(src.Data());
    const twin::Instruction op(twin::kPipeMte2, TWIN_HERE,
                               twin::Work::Transfer(twin::Route::kGmToUb, uint64_t{p.blockCount} * p.blockLen));
    for (uint32_t b = 0; b < p.blockCount; ++b) {
        const uint8_t* s = from + uint64_t{b} * (p.blockLen + p.srcStride);
        const uint64_t d = uint64_t{b} * (ubBlock + uint64_t{p.dstStride} * twin::kBlockBytes);
        twin::CheckGm(s, p.blockLen, TWIN_HERE, "DataCopyPad source");
        dst.CheckElements(d / sizeof(T), ubBlock / sizeof(T), TWIN_HERE, "DataCopyPad destination");
        op.Read(twin::Memory::GM, s, p.blockLen);
        op.Write(twin::Memory::UB, dst.Bytes() + d, ubBlock);
        std::memcpy(dst.Bytes() + d, s, p.blockLen);
        if (pad.isPad) {
            const uint32_t tail = (ubBlock - p.blockLen) / sizeof(T);
            for (uint32_t i = 0; i < tail; ++i) {
                reinterpret_cast<T*>(dst.Bytes() + d + p.blockLen)[i] = pad.paddingValue;
            }
        }
    }
}

// UB -> GM with byte lengths; the UB blocks' padding is dropped.
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p,
                 TWIN_SITE)
{
    twin_detail::RequireMemory(src.Memory(), {twin::Memory::UB}, TWIN_HERE, "DataCopyPad source");
    twin_detail::RequireAligned(src.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "DataCopyPad source");
    twin::Require(p.blockLen % sizeof(T) == 0, TWIN_HERE, "[R07] ", "DataCopyPad: blockLen ", p.blockLen,
                  " bytes is not a whole number of elements");
    const uint32_t ubBlock = (p.blockLen + twin::kBlockBytes - 1) / twin::kBlockBytes * twin::kBlockBytes;
    uint8_t* to = reinterpret_cast<uint8_t*>(dst.Data());
    const twin::Instruction op(twin::kPipeMte3, TWIN_HERE,
                               twin::Work::Transfer(twin::Route::kUbToGm, uint64_t{p.blockCount} * p.blockLen));
    for (uint32_t b = 0; b < p.blockCount; ++b) {
        const uint64_t s = uint64_t{b} * (ubBlock + uint64_t{p.srcStride} * twin::kBlockBytes);
        uint8_t* d = to + uint64_t{b} * (p.blockLen + p.dstStride);
        src.CheckElements(s / sizeof(T), p.blockLen / sizeof(T), TWIN_HERE, "DataCopyPad source");
        twin::CheckGm(d, p.blockLen, TWIN_HERE, "DataCopyPad destination");
        op.Read(twin::Memory::UB, src.Bytes() + s, p.blockLen);
        op.Write(twin::Memory::GM, d, p.blockLen);
        twin_detail::StoreGm(reinterpret_cast<T*>(d), reinterpret_cast<const T*>(src.Bytes() + s),
                             p.blockLen / sizeof(T), TWIN_HERE, "DataCopyPad UB->GM");
    }
}

// L1 fill (MTE2): repeatTimes x blockNum 32-byte blocks, dstGap blocks apart.
template <typename T, typename U = T>
void InitConstValue(const LocalTensor<T>& dst, const InitConstValueParams<U>& p, TWIN_SITE)
{
    static_assert(std::is_same<T, U>::value, "InitConstValue: value type must be the tensor's");
    twin_detail::RequireCore(twin::CoreType::AIC, TWIN_HERE, "InitConstValue");
    twin_detail::RequireMemory(dst.Memory(), {twin::Memory::L1}, TWIN_HERE, "InitConstValue destination");
    twin_detail::RequireAligned(dst.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "InitConstValue destination");
    constexpr uint32_t perBlock = twin::kBlockBytes / sizeof(T);
    const twin::Instruction op(twin::kPipeMte2, TWIN_HERE,  // an L1 fill runs on MTE2
                               twin::Work::Transfer(twin::Route::kL1Fill, uint64_t{p.repeatTimes} *
                                                                              p.blockNum * twin::kBlockBytes));
    for (uint32_t r = 0; r < p.repeatTimes; ++r) {
        const uint64_t first = uint64_t{r} * (p.blockNum + p.dstGap) * perBlock;
        dst.CheckElements(first, uint64_t{p.blockNum} * perBlock, TWIN_HERE, "InitConstValue");
        op.Write(dst.Memory(), dst.Data() + first, uint64_t{p.blockNum} * twin::kBlockBytes);
        std::fill_n(dst.Data() + first, uint64_t{p.blockNum} * perBlock, p.initValue);
    }
}

// L1 -> L0A/L0B: repeatTimes 512-byte fractals; source fractal startIndex + i * srcStride
// (start to start), destination fractal i * (dstGap + 1); ifTranspose transposes each
// 16 x 16 fractal (16-bit types only).
template <typename T>
void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p, TWIN_SITE)
{
    twin_detail::RequireCore(twin::CoreType::AIC, TWIN_HERE, "LoadData");
    twin_detail::RequireMemory(src.Memory(), {twin::Memory::L1}, TWIN_HERE, "LoadData source");
    twin_detail::RequireMemory(dst.Memory(), {twin::Memory::L0A, twin::Memory::L0B}, TWIN_HERE,
                               "LoadData destination");
    twin_detail::RequireAligned(dst.ByteOffset(), twin::kFractalBytes, TWIN_HERE, "LoadData destination");
    twin_detail::RequireAligned(src.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "LoadData source");
    twin::Require(!p.ifTranspose || sizeof(T) == 2, TWIN_HERE, "[R08] ",
                  "LoadData ifTranspose is only for 16-bit types");
    constexpr uint32_t perFractal = twin::kFractalBytes / sizeof(T);
    const twin::Route route = dst.Memory() == twin::Memory::L0A ? twin::Route::kL1ToL0a : twin::Route::kL1ToL0b;
    const twin::Instruction op(twin::kPipeMte1, TWIN_HERE,
                               twin::Work::Transfer(route, uint64_t{p.repeatTimes} * twin::kFractalBytes));
    for (uint32_t i = 0; i < p.repeatTimes; ++i) {
        const uint64_t from = (uint64_t{p.startIndex} + uint64_t{i} * p.srcStride) * perFractal;
        const uint64_t to = uint64_t{i} * (p.dstGap + 1) * perFractal;
        src.CheckElements(from, perFractal, TWIN_HERE, "LoadData source");
        dst.CheckElements(to, perFractal, TWIN_HERE, "LoadData destination");
        op.Read(src.Memory(), src.Data() + from, twin::kFractalBytes);
        op.Write(dst.Memory(), dst.Data() + to, twin::kFractalBytes);
        for (uint32_t r = 0; r < 16 && twin::Computing(); ++r) {
            for (uint32_t c = 0; c < perFractal / 16; ++c) {
                const uint32_t d = p.ifTranspose ? c * 16 + r : r * (perFractal / 16) + c;
                dst.Data()[to + d] = src.Data()[from + r * (perFractal / 16) + c];
            }
        }
    }
}

// C (L0C, Nz fp32) = A (L0A, Zz) x B (L0B, Zn) [+ C], over whole 16 x 16 fractals.
template <typename T, typename U, typename S>
void Mmad(const LocalTensor<T>& dst, const LocalTensor<U>& a, const LocalTensor<S>& b,
          const MmadParams& p, TWIN_SITE)
{
    static_assert(std::is_same<T, float>::value && std::is_same<U, S>::value && sizeof(U) == 2,
                  "twin Mmad: float <- half/bfloat16 x half/bfloat16");
    twin_detail::RequireCore(twin::CoreType::AIC, TWIN_HERE, "Mmad");
    twin_detail::RequireMemory(dst.Memory(), {twin::Memory::L0C}, TWIN_HERE, "Mmad result");
    twin_detail::RequireMemory(a.Memory(), {twin::Memory::L0A}, TWIN_HERE, "Mmad left matrix");
    twin_detail::RequireMemory(b.Memory(), {twin::Memory::L0B}, TWIN_HERE, "Mmad right matrix");
    twin_detail::RequireAligned(a.ByteOffset(), twin::kFractalBytes, TWIN_HERE, "Mmad left matrix");
    twin_detail::RequireAligned(b.ByteOffset(), twin::kFractalBytes, TWIN_HERE, "Mmad right matrix");
    twin_detail::RequireAligned(dst.ByteOffset(), 1024, TWIN_HERE, "Mmad result");
    twin::Require(p.m != 1, TWIN_HERE, "[R09] ", "Mmad with m == 1 runs in GEMV mode on 910B: pad m to 16");
    twin::Require(p.m <= 4095 && p.n <= 4095 && p.k <= 4095, TWIN_HERE, "[R10] ", "Mmad m/n/k above 4095");
    const uint32_t m1 = (p.m + 15) / 16, n1 = (p.n + 15) / 16, k1 = (p.k + 15) / 16;
    a.CheckElements(0, uint64_t{m1} * k1 * 256, TWIN_HERE, "Mmad left matrix");
    b.CheckElements(0, uint64_t{k1} * n1 * 256, TWIN_HERE, "Mmad right matrix");
    dst.CheckElements(0, uint64_t{n1} * m1 * 256, TWIN_HERE, "Mmad result");
    const bool init = p.cmatrixInitVal && !p.isBias;
    if (!init && m1 * n1 >= 10) {
        twin::InterlockM();  // Mmad docs: the hardware orders such accumulations itself
    }
    const twin::Instruction op(twin::kPipeM, TWIN_HERE, twin::Work::Cube(uint64_t{m1} * n1 * k1));
    op.Read(twin::Memory::L0A, a.Bytes(), uint64_t{m1} * k1 * twin::kFractalBytes);
    op.Read(twin::Memory::L0B, b.Bytes(), uint64_t{k1} * n1 * twin::kFractalBytes);
    if (!init) {
        op.Read(twin::Memory::L0C, dst.Bytes(), uint64_t{n1} * m1 * 256 * sizeof(float));
    }
    op.Write(twin::Memory::L0C, dst.Bytes(), uint64_t{n1} * m1 * 256 * sizeof(float));
    if (!twin::Computing()) {
        return;
    }
    const uint32_t rows = m1 * 16, cols = n1 * 16, depth = k1 * 16;
    // Unpack Zz (A) and Zn (B) into dense row-major matrices, multiply, pack into Nz.
    std::vector<float> left(size_t{rows} * depth), right(size_t{depth} * cols), product(size_t{rows} * cols, 0.0f);
    for (uint32_t mi = 0; mi < rows; ++mi) {
        for (uint32_t ki = 0; ki < depth; ++ki) {
            left[size_t{mi} * depth + ki] = a.Data()[((mi / 16) * k1 + ki / 16) * 256 + (mi % 16) * 16 + ki % 16];
        }
    }
    for (uint32_t ki = 0; ki < depth; ++ki) {
        for (uint32_t ni = 0; ni < cols; ++ni) {
            right[size_t{ki} * cols + ni] = b.Data()[((ki / 16) * n1 + ni / 16) * 256 + (ni % 16) * 16 + ki % 16];
        }
    }
    for (uint32_t mi = 0; mi < rows; ++mi) {
        float* out = &product[size_t{mi} * cols];
        for (uint32_t ki = 0; ki < depth; ++ki) {
            const float av = left[size_t{mi} * depth + ki];
            const float* in = &right[size_t{ki} * cols];
            for (uint32_t ni = 0; ni < cols; ++ni) {
                out[ni] += av * in[ni];
            }
        }
    }
    for (uint32_t mi = 0; mi < rows; ++mi) {
        for (uint32_t ni = 0; ni < cols; ++ni) {
            float& c = dst.Data()[((ni / 16) * m1 + mi / 16) * 256 + (mi % 16) * 16 + ni % 16];
            const float v = product[size_t{mi} * cols + ni];
            c = init ? v : c + v;
        }
    }
}

// L0C (Nz fp32) -> GM. Row-major output: element (m, n) goes to m * dstStride + n;
// srcStride is the L0C distance between column blocks, in 16-element rows.
// float -> float takes quantPre NoQuant (CheckFixpipeL0C2GMParam of dav_c220); float ->
// half takes F322F16, which the twin converts as IEEE round-to-nearest-even with overflow
// to +-inf (the kernel must survive an inf: it clamps; no saturation is assumed).
template <typename T, typename U, const FixpipeConfig& config = CFG_ROW_MAJOR>
void Fixpipe(const GlobalTensor<T>& dst, const LocalTensor<U>& src, const FixpipeParamsV220& p, TWIN_SITE)
{
    constexpr bool toHalf = std::is_same<T, half>::value;
    static_assert(std::is_same<U, float>::value && (std::is_same<T, float>::value || toHalf),
                  "twin Fixpipe: float -> float (NoQuant) or float -> half (F322F16) only");
    static_assert(config.format == CO2Layout::ROW_MAJOR, "twin Fixpipe: row-major output only");
    twin_detail::RequireCore(twin::CoreType::AIC, TWIN_HERE, "Fixpipe");
    twin_detail::RequireMemory(src.Memory(), {twin::Memory::L0C}, TWIN_HERE, "Fixpipe source");
    twin_detail::RequireAligned(src.ByteOffset(), 64, TWIN_HERE, "Fixpipe source");
    if constexpr (toHalf) {
        twin::Require(p.quantPre == QuantMode_t::F322F16, TWIN_HERE, "[R96] ",
                      "Fixpipe float -> half needs quantPre F322F16 (the conversion is the "
                      "quant mode's; NoQuant would store fp32 bits as half)");
    } else {
        twin::Require(p.quantPre == QuantMode_t::NoQuant, TWIN_HERE, "[R11] ",
                      "Fixpipe float -> float needs quantPre NoQuant");
    }
    twin::Require(p.srcStride >= p.mSize && p.srcStride % 16 == 0, TWIN_HERE, "[R12] ",
                  "Fixpipe srcStride ", p.srcStride, " must be a multiple of 16 and >= mSize ",
                  p.mSize);
    twin::Require(p.dstStride >= p.nSize, TWIN_HERE, "[R13] ", "Fixpipe dstStride ", p.dstStride,
                  " is smaller than nSize ", p.nSize);
    const uint32_t n1 = (p.nSize + 15) / 16;
    src.CheckElements(0, uint64_t{n1} * p.srcStride * 16, TWIN_HERE, "Fixpipe source");
    if (p.mSize > 0 && p.nSize > 0) {
        twin::CheckGm(dst.Data(), ((uint64_t{p.mSize} - 1) * p.dstStride + p.nSize) * sizeof(T),
                      TWIN_HERE, "Fixpipe destination");
    }
    const twin::Instruction op(twin::kPipeFix, TWIN_HERE,
                               twin::Work::Transfer(twin::Route::kL0cToGm,
                                                    uint64_t{p.mSize} * p.nSize * sizeof(T)));
    op.Rows(twin::Memory::L0C, src.Bytes(), n1, uint64_t{p.mSize} * 16 * sizeof(float),
            uint64_t{p.srcStride} * 16 * sizeof(float), false);
    op.Rows(twin::Memory::GM, dst.Data(), p.mSize, uint64_t{p.nSize} * sizeof(T),
            uint64_t{p.dstStride} * sizeof(T), true);
    std::vector<T> row(p.nSize);
    for (uint32_t m = 0; m < p.mSize && twin::Computing(); ++m) {
        for (uint32_t n = 0; n < p.nSize; ++n) {
            const float v = src.Data()[(uint64_t{n / 16} * p.srcStride + m) * 16 + n % 16];
            row[n] = static_cast<T>(p.reluEn && v < 0 ? 0.0f : v);
        }
        twin_detail::StoreGm(dst.Data() + uint64_t{m} * p.dstStride, row.data(), p.nSize, TWIN_HERE,
                             "Fixpipe");
    }
}

}  // namespace AscendC

#endif
