// The vector unit of the twin (namespace AscendC): the operations the kernels use, in
// their count ("level 2") and mask/repeat ("level 0") forms, with the rules of 910B:
// operands in UB, 32-byte aligned starts, at most 255 repeats of 256 bytes, masks of at
// most one repeat's elements, Compares counts of whole 256-byte repeats, and the UB
// scratch that Compares and Select use above 184 KB. Every operation is one instruction on
// PIPE_V (PipeBarrier docs: "vector compute"), whose UB reads and writes the race
// detector checks (twin/race.h).
#ifndef FLASH_CANN_TWIN_VECTOR_H
#define FLASH_CANN_TWIN_VECTOR_H

#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>

#include "cube.h"

namespace AscendC {

struct BinaryRepeatParams {
    BinaryRepeatParams() = default;
    BinaryRepeatParams(uint8_t dstBlkStrideIn, uint8_t src0BlkStrideIn, uint8_t src1BlkStrideIn,
                       uint8_t dstRepStrideIn, uint8_t src0RepStrideIn, uint8_t src1RepStrideIn)
        : dstBlkStride(dstBlkStrideIn), src0BlkStride(src0BlkStrideIn),
          src1BlkStride(src1BlkStrideIn), dstRepStride(dstRepStrideIn),
          src0RepStride(src0RepStrideIn), src1RepStride(src1RepStrideIn) {}
    uint32_t blockNumber = 8;
    uint8_t dstBlkStride = 1, src0BlkStride = 1, src1BlkStride = 1;
    uint8_t dstRepStride = 8, src0RepStride = 8, src1RepStride = 8;
};

struct BrcbRepeatParams {
    BrcbRepeatParams() = default;
    BrcbRepeatParams(uint16_t dstBlkStrideIn, uint16_t dstRepStrideIn)
        : dstRepStride(dstRepStrideIn), dstBlkStride(dstBlkStrideIn) {}
    uint32_t blockNumber = 8;
    uint16_t dstRepStride = 8;
    uint16_t dstBlkStride = 1;
};

enum class RoundMode : uint8_t { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND,
                                 CAST_TRUNC, CAST_ODD, UNKNOWN = 0xFF };
enum class CMPMODE : uint8_t { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE : uint8_t { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
enum class ReduceOrder : uint8_t { ORDER_VALUE_INDEX = 0, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE,
                                   ORDER_ONLY_INDEX };

namespace twin_detail {

// An element-wise operation on `count` elements of UB tensors.
template <typename T>
void RequireVector(const LocalTensor<T>& t, uint64_t count, const twin::Site& site, const char* what)
{
    RequireCore(twin::CoreType::AIV, site, what);
    RequireMemory(t.Memory(), {twin::Memory::UB}, site, what);
    RequireAligned(t.ByteOffset(), twin::kBlockBytes, site, what);
    t.CheckElements(0, count, site, what);
}

// Compares and Select use the top 8 KB of UB as scratch on 910B.
void RequireUbScratchFree(const twin::Site& site, const char* what);

template <typename T>
constexpr uint32_t PerRepeat()
{
    return twin::kRepeatBytes / sizeof(T);
}

template <typename T>
constexpr uint32_t PerBlock()
{
    return twin::kBlockBytes / sizeof(T);
}

// Level 0: for each repeat r and block b, the first `mask` elements of the repeat; element
// e of block b of repeat r is at (r * repStride + b * blkStride) blocks + e.
template <typename T, typename F>
void Repeat(const LocalTensor<T>& dst, const LocalTensor<T>* src0, const LocalTensor<T>* src1,
            uint64_t mask, uint8_t repeatTime, const BinaryRepeatParams& p, const twin::Site& site,
            const char* what, twin::VecClass cost, F op)
{
    RequireCore(twin::CoreType::AIV, site, what);
    twin::Require(mask >= 1 && mask <= PerRepeat<T>(), site, "[R19] ", what, ": mask ", mask,
                  " must be in [1, ", PerRepeat<T>(), "] for a ", sizeof(T), "-byte type");
    twin::Require(p.dstBlkStride != 0, site, "[R20] ", what, ": the destination block stride must not be 0");
    const LocalTensor<T>* operands[3] = {&dst, src0, src1};
    const uint32_t blk[3] = {p.dstBlkStride, p.src0BlkStride, p.src1BlkStride};
    const uint32_t rep[3] = {p.dstRepStride, p.src0RepStride, p.src1RepStride};
    for (int o = 0; o < 3; ++o) {
        if (operands[o] == nullptr) {
            continue;
        }
        RequireMemory(operands[o]->Memory(), {twin::Memory::UB}, site, what);
        RequireAligned(operands[o]->ByteOffset(), twin::kBlockBytes, site, what);
    }
    const uint32_t lastBlock = (static_cast<uint32_t>(mask) - 1) / PerBlock<T>();
    // A repeat costs a whole repeat whatever its mask.
    const twin::Instruction instruction(twin::kPipeV, site, twin::Work::Vector(cost, repeatTime));
    for (int write = 0; write < 2; ++write) {  // what each repeat's blocks read, then write
        for (uint32_t r = 0; r < repeatTime; ++r) {
            for (int o = write ? 0 : 1; o < (write ? 1 : 3); ++o) {
                if (operands[o] == nullptr) {
                    continue;
                }
                const uint64_t first = uint64_t{r} * rep[o] * PerBlock<T>();
                // the repeat's first and last element bound it
                operands[o]->CheckElements(first, 1, site, what);
                operands[o]->CheckElements(first + uint64_t{lastBlock} * blk[o] * PerBlock<T>() +
                                               (mask - 1) % PerBlock<T>(), 1, site, what);
                if (blk[o] <= 1) {  // contiguous blocks, or one block read over and over
                    instruction.Rows(twin::Memory::UB, operands[o]->Data() + first, 1,
                                     (blk[o] == 1 ? lastBlock + 1 : 1) * twin::kBlockBytes, 0, write);
                    continue;
                }
                for (uint32_t b = 0; b <= lastBlock; ++b) {
                    instruction.Rows(twin::Memory::UB,
                                     operands[o]->Data() + first + uint64_t{b} * blk[o] * PerBlock<T>(), 1,
                                     twin::kBlockBytes, 0, write);
                }
            }
        }
    }
    for (uint32_t r = 0; r < repeatTime && twin::Computing(); ++r) {
        uint64_t base[3];
        for (int o = 0; o < 3; ++o) {
            base[o] = uint64_t{r} * rep[o] * PerBlock<T>();
        }
        for (uint32_t e = 0; e < mask; ++e) {
            const uint64_t b = e / PerBlock<T>(), i = e % PerBlock<T>();
            const T a = src0 ? src0->Data()[base[1] + b * blk[1] * PerBlock<T>() + i] : T();
            const T c = src1 ? src1->Data()[base[2] + b * blk[2] * PerBlock<T>() + i] : T();
            dst.Data()[base[0] + b * blk[0] * PerBlock<T>() + i] = op(a, c);
        }
    }
}

template <typename T, typename F>
void Elementwise(const LocalTensor<T>& dst, const LocalTensor<T>* src0, const LocalTensor<T>* src1,
                 int32_t count, const twin::Site& site, const char* what, twin::VecClass cost, F op)
{
    twin::Require(count >= 0, site, "[R21] ", what, ": negative count ", count);
    RequireVector(dst, count, site, what);
    if (src0) RequireVector(*src0, count, site, what);
    if (src1) RequireVector(*src1, count, site, what);
    const twin::Instruction instruction(twin::kPipeV, site,
                                        twin::Work::Vector(cost, twin::RepeatsOf(uint64_t(count) * sizeof(T))));
    for (const LocalTensor<T>* src : {src0, src1}) {
        if (src != nullptr) {
            instruction.Read(twin::Memory::UB, src->Bytes(), uint64_t(count) * sizeof(T));
        }
    }
    instruction.Write(twin::Memory::UB, dst.Bytes(), uint64_t(count) * sizeof(T));
    for (int32_t i = 0; i < count && twin::Computing(); ++i) {
        dst.Data()[i] = op(src0 ? src0->Data()[i] : T(), src1 ? src1->Data()[i] : T());
    }
}

template <typename T>
float F(T v) { return static_cast<float>(v); }

// A compared value: integers exactly, floating types through float.
template <typename T>
double ToDouble(T v)
{
    if constexpr (std::is_integral<T>::value) {
        return static_cast<double>(v);
    } else {
        return static_cast<double>(static_cast<float>(v));
    }
}

// Integer vector arithmetic (int16/int32 Add, Sub, Mul, Adds, Muls): the exact result, then
// CTRL bit 53 (SetSaturationFlag<SaturationMode::INT>) decides: 0 truncates to the type's
// bits (two's complement wrap), 1 saturates. Its reset value is not documented, so a
// result that does not fit while the kernel never set the mode is a violation.
template <typename T>
T IntegerResult(int64_t exact, const twin::Site& site, const char* what)
{
    const int64_t lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
    if (exact >= lo && exact <= hi) {
        return static_cast<T>(exact);
    }
    const int8_t mode = twin::Core().intSaturation;
    twin::Require(mode >= 0, site, "[R91] ", what, ": the integer result ", exact,
                  " overflows its type while the integer saturation mode was never set "
                  "(SetSaturationFlag<SaturationMode::INT>: CTRL bit 53 has no documented "
                  "reset value)");
    if (mode == 1) {
        return static_cast<T>(exact < lo ? lo : hi);
    }
    using U = typename std::make_unsigned<T>::type;
    return static_cast<T>(static_cast<U>(static_cast<uint64_t>(exact)));
}

// The element types an arithmetic instruction takes on 910B (asc-devkit dav_c220
// kernel_operator_vec_binary_impl.h / _binary_scalar_impl.h: half, float, int16, int32).
template <typename T>
void RequireArithmeticType(const twin::Site& site, const char* what)
{
    constexpr bool ok = std::is_same<T, half>::value || std::is_same<T, float>::value ||
                        std::is_same<T, int16_t>::value || std::is_same<T, int32_t>::value;
    twin::Require(ok, site, "[R90] ", what, " takes half, float, int16_t or int32_t on 910B, not a ",
                  sizeof(T), "-byte ", std::is_signed<T>::value ? "signed" : "unsigned", " type");
}

// a (op) b in the element type: floats through float, integers exactly, then
// IntegerResult.
template <typename T, typename FloatOp, typename IntOp>
T Arith(T a, T b, const twin::Site& site, const char* what, FloatOp floatOp, IntOp intOp)
{
    if constexpr (std::is_integral<T>::value) {
        return IntegerResult<T>(intOp(int64_t{a}, int64_t{b}), site, what);
    } else {
        return static_cast<T>(floatOp(F(a), F(b)));
    }
}

}  // namespace twin_detail

#define TWIN_BINARY(Name, floatExpr, intExpr)                                                  \
    template <typename T>                                                                      \
    void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
              const int32_t& count, TWIN_SITE)                                                 \
    {                                                                                          \
        twin_detail::RequireArithmeticType<T>(TWIN_HERE, #Name);                               \
        twin_detail::Elementwise(dst, &src0, &src1, count, TWIN_HERE, #Name, twin::VecClass::kBinary, \
                                 [&](T a, T b) {                                               \
            return twin_detail::Arith(a, b, TWIN_HERE, #Name, [](float x, float y) { return floatExpr; }, \
                                      [](int64_t x, int64_t y) { return intExpr; });           \
        });                                                                                    \
    }                                                                                          \
    template <typename T, bool isSetMask = true>                                               \
    void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
              uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& params, TWIN_SITE) \
    {                                                                                          \
        twin_detail::RequireArithmeticType<T>(TWIN_HERE, #Name);                               \
        twin_detail::Repeat(dst, &src0, &src1, mask, repeatTime, params, TWIN_HERE, #Name,     \
                            twin::VecClass::kBinary, [&](T a, T b) {                           \
            return twin_detail::Arith(a, b, TWIN_HERE, #Name, [](float x, float y) { return floatExpr; }, \
                                      [](int64_t x, int64_t y) { return intExpr; });           \
        });                                                                                    \
    }

TWIN_BINARY(Add, x + y, x + y)
TWIN_BINARY(Sub, x - y, x - y)
TWIN_BINARY(Mul, x * y, x * y)
TWIN_BINARY(Max, std::max(x, y), std::max(x, y))
#undef TWIN_BINARY

template <typename T>
void Div(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
         const int32_t& count, TWIN_SITE)
{
    static_assert(!std::is_integral<T>::value, "Div takes half or float");
    twin_detail::Elementwise(dst, &src0, &src1, count, TWIN_HERE, "Div", twin::VecClass::kDiv, [](T a, T b) {
        return static_cast<T>(twin_detail::F(a) / twin_detail::F(b));
    });
}

// Bitwise And/Or (vand/vor) take 16-bit integers on 910B: 32-bit words are processed as
// pairs of halves (ReinterpretCast<uint16_t>, twice the count).
#define TWIN_BITWISE(Name, expr)                                                               \
    template <typename T>                                                                      \
    void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
              const int32_t& count, TWIN_SITE)                                                 \
    {                                                                                          \
        static_assert(std::is_same<T, uint16_t>::value || std::is_same<T, int16_t>::value,      \
                      #Name " takes 16-bit integers");                                          \
        twin_detail::RequireUbScratchFree(TWIN_HERE, #Name);                                   \
        twin_detail::Elementwise(dst, &src0, &src1, count, TWIN_HERE, #Name, twin::VecClass::kBinary, \
                                 [](T a, T b) { return static_cast<T>(expr); });               \
    }                                                                                          \
    template <typename T, bool isSetMask = true>                                               \
    void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
              uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& params, TWIN_SITE) \
    {                                                                                          \
        static_assert(std::is_same<T, uint16_t>::value || std::is_same<T, int16_t>::value,      \
                      #Name " takes 16-bit integers");                                          \
        twin_detail::Repeat(dst, &src0, &src1, mask, repeatTime, params, TWIN_HERE, #Name,     \
                            twin::VecClass::kBinary, [](T a, T b) { return static_cast<T>(expr); }); \
    }

TWIN_BITWISE(And, a & b)
TWIN_BITWISE(Or, a | b)
#undef TWIN_BITWISE

// ShiftLeft / ShiftRight by a scalar (vshl/vshr): 16- and 32-bit integers, the shift in
// [0, bits] (the header's CheckValueRange). Right shifts of unsigned types are logical, of
// signed types arithmetic (roundEn, the rounding right shift, is not modelled: false only).
namespace twin_detail {
template <typename T>
void RequireShift(const T& shift, const twin::Site& site, const char* what)
{
    constexpr bool ok = std::is_same<T, uint16_t>::value || std::is_same<T, int16_t>::value ||
                        std::is_same<T, uint32_t>::value || std::is_same<T, int32_t>::value;
    twin::Require(ok, site, "[R92] ", what, " takes int16_t, uint16_t, int32_t or uint32_t on 910B, not a ",
                  sizeof(T), "-byte type");
    twin::Require(int64_t(shift) >= 0 && int64_t(shift) <= int64_t(sizeof(T) * 8), site, "[R93] ", what,
                  ": shift ", int64_t(shift), " outside [0, ", sizeof(T) * 8, "]");
}
}  // namespace twin_detail

template <typename T>
void ShiftLeft(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
               const int32_t& count, TWIN_SITE)
{
    twin_detail::RequireShift(scalarValue, TWIN_HERE, "ShiftLeft");
    if constexpr (std::is_integral<T>::value) {
        using U = typename std::make_unsigned<T>::type;
        const uint32_t shift = static_cast<uint32_t>(scalarValue);
        twin_detail::Elementwise(dst, &src, static_cast<const LocalTensor<T>*>(nullptr), count, TWIN_HERE,
                                 "ShiftLeft", twin::VecClass::kScalarArith, [shift](T a, T) {
            return static_cast<T>(shift >= sizeof(T) * 8 ? U{0} : static_cast<U>(static_cast<U>(a) << shift));
        });
    }
}

template <typename T>
void ShiftRight(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,
                const int32_t& count, TWIN_SITE)
{
    twin_detail::RequireShift(scalarValue, TWIN_HERE, "ShiftRight");
    if constexpr (std::is_integral<T>::value) {
        const uint32_t shift = static_cast<uint32_t>(scalarValue);
        twin_detail::Elementwise(dst, &src, static_cast<const LocalTensor<T>*>(nullptr), count, TWIN_HERE,
                                 "ShiftRight", twin::VecClass::kScalarArith, [shift](T a, T) {
            if (shift >= sizeof(T) * 8) {
                return static_cast<T>(std::is_signed<T>::value && a < 0 ? -1 : 0);
            }
            return static_cast<T>(a >> shift);
        });
    }
}

enum class SaturationMode : uint8_t { FLOAT, FLOAT8, INT, CAST };

// CTRL's saturation bits (asc-devkit kernel_operator_common_intf_impl.h); the twin models
// the integer one (bit 53), which its integer arithmetic obeys.
template <SaturationMode mode>
void SetSaturationFlag(bool enableSat, TWIN_SITE)
{
    if constexpr (mode == SaturationMode::INT) {
        twin::Core().intSaturation = enableSat ? 1 : 0;
        twin::Core().intSaturationSite = TWIN_HERE;
    }
}

// The integer bit as set, or as the kernel found it (twin::kIntSaturationAtEntry); the
// other modes are not modelled (false).
template <SaturationMode mode>
bool GetSaturationFlag()
{
    if constexpr (mode == SaturationMode::INT) {
        const int8_t bit = twin::Core().intSaturation;
        return (bit < 0 ? twin::kIntSaturationAtEntry : bit) == 1;
    }
    return false;
}

#define TWIN_SCALAR(Name, floatExpr, intExpr)                                                  \
    template <typename T>                                                                      \
    void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,      \
              const int32_t& count, TWIN_SITE)                                                 \
    {                                                                                          \
        twin_detail::RequireArithmeticType<T>(TWIN_HERE, #Name);                               \
        const T scalar = scalarValue;                                                          \
        twin_detail::Elementwise(dst, &src, static_cast<const LocalTensor<T>*>(nullptr), count, \
                                 TWIN_HERE, #Name, twin::VecClass::kScalarArith, [&](T a, T) { \
            return twin_detail::Arith(a, scalar, TWIN_HERE, #Name,                             \
                                      [](float x, float y) { return floatExpr; },              \
                                      [](int64_t x, int64_t y) { return intExpr; });           \
        });                                                                                    \
    }

TWIN_SCALAR(Adds, x + y, x + y)
TWIN_SCALAR(Muls, x * y, x * y)
TWIN_SCALAR(Maxs, std::max(x, y), std::max(x, y))
TWIN_SCALAR(Mins, std::min(x, y), std::min(x, y))
#undef TWIN_SCALAR

#define TWIN_UNARY(Name, cost, expr)                                                           \
    template <typename T>                                                                      \
    void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count, TWIN_SITE) \
    {                                                                                          \
        static_assert(std::is_floating_point<T>::value || sizeof(T) == 2, #Name " takes floats"); \
        twin_detail::Elementwise(dst, &src, static_cast<const LocalTensor<T>*>(nullptr), count, \
                                 TWIN_HERE, #Name, twin::VecClass::cost,                       \
                                 [](T a, T) { return static_cast<T>(expr); });                 \
    }

TWIN_UNARY(Exp, kExp, std::exp(twin_detail::F(a)))
TWIN_UNARY(Ln, kLn, std::log(twin_detail::F(a)))
TWIN_UNARY(Abs, kScalarArith, std::fabs(twin_detail::F(a)))
TWIN_UNARY(Reciprocal, kDiv, 1.0f / twin_detail::F(a))
#undef TWIN_UNARY

// dst = src * scalar + dst (level 2). The twin implements the same-type form (float or
// half, computed in float); 910B's mixed half -> float form is not used by the kernels.
template <typename T, typename U>
void Axpy(const LocalTensor<T>& dst, const LocalTensor<U>& src, const U& scalarValue,
          const int32_t& count, TWIN_SITE)
{
    static_assert(std::is_same<T, U>::value, "twin Axpy: the same-type form only");
    const float s = static_cast<float>(scalarValue);
    twin_detail::Elementwise(dst, &src, &dst, count, TWIN_HERE, "Axpy", twin::VecClass::kBinary,
                             [s](T a, T d) { return static_cast<T>(twin_detail::F(a) * s + twin_detail::F(d)); });
}

template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count, TWIN_SITE)
{
    twin_detail::Elementwise(dst, static_cast<const LocalTensor<T>*>(nullptr),
                             static_cast<const LocalTensor<T>*>(nullptr), count, TWIN_HERE,
                             "Duplicate", twin::VecClass::kDuplicate, [&](T, T) { return scalarValue; });
}

template <typename T>
void CreateVecIndex(LocalTensor<T> dst, const T& firstValue, uint32_t count, TWIN_SITE)
{
    twin_detail::RequireVector(dst, count, TWIN_HERE, "CreateVecIndex");
    twin::Instruction(twin::kPipeV, TWIN_HERE,
                      twin::Work::Vector(twin::VecClass::kDuplicate, twin::RepeatsOf(uint64_t{count} * sizeof(T))))
        .Write(twin::Memory::UB, dst.Bytes(), uint64_t{count} * sizeof(T));
    for (uint32_t i = 0; i < count && twin::Computing(); ++i) {
        if constexpr (std::is_integral<T>::value) {  // integer ramps are exact
            dst.Data()[i] = static_cast<T>(static_cast<int64_t>(firstValue) + i);
        } else {
            dst.Data()[i] = static_cast<T>(static_cast<float>(firstValue) + static_cast<float>(i));
        }
    }
}

// dst (type T) = src (type U); supported pairs of 910B with their rounding modes.
template <typename T, typename U>
void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& roundMode,
          const uint32_t count, TWIN_SITE)
{
    constexpr bool widen = std::is_same<T, float>::value &&
                           (std::is_same<U, half>::value || std::is_same<U, bfloat16_t>::value);
    constexpr bool narrow = std::is_same<U, float>::value &&
                            (std::is_same<T, half>::value || std::is_same<T, bfloat16_t>::value);
    constexpr bool byteToHalf = std::is_same<T, half>::value && std::is_same<U, uint8_t>::value;
    constexpr bool intToFloat = std::is_same<T, float>::value && std::is_same<U, int32_t>::value;
    static_assert(widen || narrow || byteToHalf || intToFloat,
                  "twin Cast: half/bf16 <-> float, uint8 -> half, int32 -> float");
    if constexpr (intToFloat) {  // vconv_s322f32 (CAST_NONE) or its RINT form: both round to nearest
        twin::Require(roundMode == RoundMode::CAST_NONE || roundMode == RoundMode::CAST_RINT, TWIN_HERE,
                      "[R94] ", "twin Cast int32 -> float implements CAST_NONE and CAST_RINT");
    } else if constexpr (widen || byteToHalf) {
        twin::Require(roundMode == RoundMode::CAST_NONE, TWIN_HERE, "[R22] ",
                      "Cast to a wider type takes CAST_NONE on 910B");
    } else {
        twin::Require(roundMode == RoundMode::CAST_RINT, TWIN_HERE, "[R23] ",
                      "twin Cast float -> half/bfloat16 implements CAST_RINT");
    }
    twin_detail::RequireVector(dst, count, TWIN_HERE, "Cast destination");
    twin_detail::RequireVector(src, count, TWIN_HERE, "Cast source");
    twin::Require(sizeof(T) == sizeof(U) || dst.Bytes() + uint64_t{count} * sizeof(T) <= src.Bytes() ||
                      src.Bytes() + uint64_t{count} * sizeof(U) <= dst.Bytes(),
                  TWIN_HERE, "[R24] ", "Cast between different widths must not overlap");
    // A conversion repeat takes 64 elements (the cost table's CONV_* rows).
    const twin::Instruction op(twin::kPipeV, TWIN_HERE,
                               twin::Work::Vector(twin::VecClass::kCast, (uint64_t{count} + 63) / 64));
    op.Read(twin::Memory::UB, src.Bytes(), uint64_t{count} * sizeof(U));
    op.Write(twin::Memory::UB, dst.Bytes(), uint64_t{count} * sizeof(T));
    for (uint32_t i = 0; i < count && twin::Computing(); ++i) {
        dst.Data()[i] = static_cast<T>(static_cast<float>(src.Data()[i]));
    }
}

// Bit i of dst (uint8 bytes, little-endian bits) = src[i] <cmp> scalar.
template <typename T, typename U>
void Compares(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
              CMPMODE cmpMode, uint32_t count, TWIN_SITE)
{
    static_assert(std::is_same<U, uint8_t>::value, "twin Compares writes uint8 bit masks");
    // dav_c220 CheckVcmpvsDtype: half and float in every mode, int32 only with EQ.
    twin::Require(std::is_same<T, float>::value || std::is_same<T, half>::value ||
                      (std::is_same<T, int32_t>::value && cmpMode == CMPMODE::EQ),
                  TWIN_HERE, "[R95] ", "Compares takes half or float (int32 only with CMPMODE::EQ) on 910B");
    twin::Require(uint64_t{count} * sizeof(T) % twin::kRepeatBytes == 0, TWIN_HERE, "[R25] ",
                  "Compares of ", count, " elements is not whole 256-byte repeats: the hardware "
                  "would drop the partial repeat");
    twin_detail::RequireUbScratchFree(TWIN_HERE, "Compares");
    twin_detail::RequireVector(src0, count, TWIN_HERE, "Compares source");
    twin_detail::RequireVector(dst, (count + 7) / 8, TWIN_HERE, "Compares destination");
    const twin::Instruction op(twin::kPipeV, TWIN_HERE,
                               twin::Work::Vector(twin::VecClass::kCompare, twin::RepeatsOf(uint64_t{count} * sizeof(T))));
    op.Read(twin::Memory::UB, src0.Bytes(), uint64_t{count} * sizeof(T));
    op.Write(twin::Memory::UB, dst.Bytes(), (count + 7) / 8);
    const double s = twin_detail::ToDouble(src1Scalar);
    for (uint32_t i = 0; i < count && twin::Computing(); i += 8) {
        uint8_t bits = 0;
        for (uint32_t j = 0; j < 8 && i + j < count; ++j) {
            const double v = twin_detail::ToDouble(src0.Data()[i + j]);
            bool r = false;
            switch (cmpMode) {
                case CMPMODE::LT: r = v < s; break;
                case CMPMODE::GT: r = v > s; break;
                case CMPMODE::EQ: r = v == s; break;
                case CMPMODE::LE: r = v <= s; break;
                case CMPMODE::GE: r = v >= s; break;
                case CMPMODE::NE: r = v != s; break;
            }
            bits |= static_cast<uint8_t>(r) << j;
        }
        dst.Data()[i / 8] = bits;
    }
}

// Mode 1: dst[i] = bit i of selMask ? src0[i] : scalar src1.
template <typename T, typename U>
void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
            T src1, SELMODE selMode, uint32_t count, TWIN_SITE)
{
    twin::Require(selMode == SELMODE::VSEL_TENSOR_SCALAR_MODE, TWIN_HERE, "[R26] ",
                  "Select with a scalar takes VSEL_TENSOR_SCALAR_MODE");
    twin_detail::RequireUbScratchFree(TWIN_HERE, "Select");
    twin_detail::RequireVector(dst, count, TWIN_HERE, "Select destination");
    twin_detail::RequireVector(src0, count, TWIN_HERE, "Select source");
    twin_detail::RequireVector(selMask, (count + 8 * sizeof(U) - 1) / (8 * sizeof(U)), TWIN_HERE,
                               "Select mask");
    const twin::Instruction op(twin::kPipeV, TWIN_HERE,
                               twin::Work::Vector(twin::VecClass::kSelect, twin::RepeatsOf(uint64_t{count} * sizeof(T))));
    op.Read(twin::Memory::UB, selMask.Bytes(), (count + 7) / 8);
    op.Read(twin::Memory::UB, src0.Bytes(), uint64_t{count} * sizeof(T));
    op.Write(twin::Memory::UB, dst.Bytes(), uint64_t{count} * sizeof(T));
    const uint8_t* bits = reinterpret_cast<const uint8_t*>(selMask.Data());
    for (uint32_t i = 0; i < count && twin::Computing(); ++i) {
        dst.Data()[i] = (bits[i / 8] >> (i % 8)) & 1 ? src0.Data()[i] : src1;
    }
}

namespace twin_detail {

// Reduce each repeat (whole: one result; block-wise: 8 results) of a level-0 operand.
template <typename T, typename Reduce>
void ReduceRepeats(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t mask,
                   int32_t repeatTime, uint32_t dstStrideElements, int32_t srcBlkStride,
                   int32_t srcRepStride, bool perBlock, const twin::Site& site, const char* what,
                   Reduce reduce)
{
    RequireCore(twin::CoreType::AIV, site, what);
    twin::Require(repeatTime >= 0 && repeatTime <= static_cast<int32_t>(twin::kMaxRepeat), site, "[R27] ",
                  what, ": repeatTime ", repeatTime, " outside [0, 255]");
    twin::Require(mask >= 1 && mask <= static_cast<int32_t>(PerRepeat<T>()), site, "[R28] ", what, ": mask ",
                  mask, " outside [1, ", PerRepeat<T>(), "]");
    RequireMemory(src.Memory(), {twin::Memory::UB}, site, what);
    RequireMemory(dst.Memory(), {twin::Memory::UB}, site, what);
    RequireAligned(src.ByteOffset(), twin::kBlockBytes, site, what);
    RequireAligned(dst.ByteOffset(), perBlock ? twin::kBlockBytes : sizeof(T), site, what);
    const twin::Instruction op(twin::kPipeV, site,
                               twin::Work::Vector(perBlock ? twin::VecClass::kBlockReduce : twin::VecClass::kWholeReduce,
                                                  static_cast<uint64_t>(repeatTime)));
    const uint32_t lastBlock = (static_cast<uint32_t>(mask) - 1) / PerBlock<T>();
    for (int32_t r = 0; r < repeatTime; ++r) {
        for (uint32_t b = 0; b <= lastBlock; ++b) {
            const uint64_t at = (uint64_t(r) * srcRepStride + uint64_t(b) * srcBlkStride) * PerBlock<T>();
            src.CheckElements(at, 1, site, what);
            op.Read(twin::Memory::UB, src.Data() + at, twin::kBlockBytes);
        }
    }
    for (int32_t r = 0; r < repeatTime; ++r) {
        const uint32_t outputs = perBlock ? 8 : 1;
        dst.CheckElements(uint64_t(r) * dstStrideElements, perBlock ? lastBlock + 1 : 1, site, what);
        op.Write(twin::Memory::UB, dst.Data() + uint64_t(r) * dstStrideElements,
                 (perBlock ? lastBlock + 1 : 1) * sizeof(T));
        for (uint32_t o = 0; o < outputs && twin::Computing(); ++o) {
            float acc = 0;
            bool first = true;
            for (uint32_t e = 0; e < static_cast<uint32_t>(mask); ++e) {
                const uint32_t b = e / PerBlock<T>();
                if (perBlock && b != o) {
                    continue;
                }
                const uint64_t at = (uint64_t(r) * srcRepStride + uint64_t(b) * srcBlkStride) *
                                        PerBlock<T>() + e % PerBlock<T>();
                src.CheckElements(at, 1, site, what);
                const float v = static_cast<float>(src.Data()[at]);
                acc = first ? v : reduce(acc, v);
                first = false;
            }
            if (!first) {
                const uint64_t at = uint64_t(r) * dstStrideElements + o;
                dst.CheckElements(at, 1, site, what);
                dst.Data()[at] = static_cast<T>(acc);
            }
        }
    }
}

inline float MaxOf(float a, float b) { return std::max(a, b); }
inline float SumOf(float a, float b) { return a + b; }

}  // namespace twin_detail

// One result per repeat (the maximum / sum of its `mask` elements), dstRepStride
// results apart.
template <typename T, bool isSetMask = true>
void WholeReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                    const int32_t repeatTime, const int32_t dstRepStride, const int32_t srcBlkStride,
                    const int32_t srcRepStride, ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX,
                    TWIN_SITE)
{
    twin::Require(order == ReduceOrder::ORDER_ONLY_VALUE, TWIN_HERE, "[R29] ",
                  "twin WholeReduceMax implements ORDER_ONLY_VALUE (the default writes value/index "
                  "pairs)");
    twin_detail::ReduceRepeats(dst, src, mask, repeatTime, dstRepStride, srcBlkStride, srcRepStride,
                               false, TWIN_HERE, "WholeReduceMax", twin_detail::MaxOf);
}

template <typename T, bool isSetMask = true>
void WholeReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                    const int32_t repeatTime, const int32_t dstRepStride, const int32_t srcBlkStride,
                    const int32_t srcRepStride, TWIN_SITE)
{
    twin_detail::ReduceRepeats(dst, src, mask, repeatTime, dstRepStride, srcBlkStride, srcRepStride,
                               false, TWIN_HERE, "WholeReduceSum", twin_detail::SumOf);
}

// Eight results per repeat (one per 32-byte block); dstRepStride in units of 8 results.
template <typename T, bool isSetMask = true>
void BlockReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t repeatTime,
                    const int32_t mask, const int32_t dstRepStride, const int32_t srcBlkStride,
                    const int32_t srcRepStride, TWIN_SITE)
{
    twin_detail::ReduceRepeats(dst, src, mask, repeatTime, uint32_t(dstRepStride) * 8, srcBlkStride,
                               srcRepStride, true, TWIN_HERE, "BlockReduceMax", twin_detail::MaxOf);
}

template <typename T, bool isSetMask = true>
void BlockReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t repeatTime,
                    const int32_t mask, const int32_t dstRepStride, const int32_t srcBlkStride,
                    const int32_t srcRepStride, TWIN_SITE)
{
    twin_detail::ReduceRepeats(dst, src, mask, repeatTime, uint32_t(dstRepStride) * 8, srcBlkStride,
                               srcRepStride, true, TWIN_HERE, "BlockReduceSum", twin_detail::SumOf);
}

// Repeat i reads src[8i .. 8i+8) and writes each element over a whole 32-byte block:
// block (i * dstRepStride + j * dstBlkStride) of dst holds src[8i + j].
template <typename T>
void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint8_t repeatTime,
          const BrcbRepeatParams& p, TWIN_SITE)
{
    twin_detail::RequireCore(twin::CoreType::AIV, TWIN_HERE, "Brcb");
    twin_detail::RequireMemory(dst.Memory(), {twin::Memory::UB}, TWIN_HERE, "Brcb");
    twin_detail::RequireAligned(dst.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "Brcb destination");
    twin_detail::RequireAligned(src.ByteOffset(), twin::kBlockBytes, TWIN_HERE, "Brcb source");
    src.CheckElements(0, uint64_t{repeatTime} * 8, TWIN_HERE, "Brcb source");
    twin::Require(src.Bytes() + uint64_t{repeatTime} * 8 * sizeof(T) <= dst.Bytes() ||
                      dst.Bytes() + uint64_t{repeatTime} * 8 * twin::kBlockBytes <= src.Bytes(),
                  TWIN_HERE, "[R30] ", "Brcb must not work in place");
    constexpr uint32_t perBlock = twin::kBlockBytes / sizeof(T);
    const twin::Instruction op(twin::kPipeV, TWIN_HERE, twin::Work::Vector(twin::VecClass::kBroadcast, repeatTime));
    op.Read(twin::Memory::UB, src.Bytes(), uint64_t{repeatTime} * 8 * sizeof(T));
    for (uint32_t i = 0; i < repeatTime; ++i) {
        for (uint32_t j = 0; j < 8; ++j) {
            const uint64_t at = (uint64_t{i} * p.dstRepStride + uint64_t{j} * p.dstBlkStride) * perBlock;
            dst.CheckElements(at, perBlock, TWIN_HERE, "Brcb destination");
            op.Write(twin::Memory::UB, dst.Data() + at, twin::kBlockBytes);
            if (twin::Computing()) {
                std::fill_n(dst.Data() + at, perBlock, src.Data()[i * 8 + j]);
            }
        }
    }
}

}  // namespace AscendC

#endif
