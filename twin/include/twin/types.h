// half and bfloat16_t as the Ascend C compiler provides them, in software: 16-bit
// storage, arithmetic in float, round-to-nearest-even conversion from float.
#ifndef FLASH_CANN_TWIN_TYPES_H
#define FLASH_CANN_TWIN_TYPES_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace twin {

inline uint32_t FloatBits(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return u;
}

inline float BitsFloat(uint32_t u)
{
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

inline uint16_t FloatToHalfBits(float f)
{
    const uint32_t u = FloatBits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t exponent = (u >> 23) & 0xffu;
    uint32_t mantissa = u & 0x7fffffu;
    if (exponent == 0xff) {  // inf / nan
        return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
    }
    const int e = static_cast<int>(exponent) - 127 + 15;
    if (e >= 31) {
        return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
    }
    if (e <= 0) {  // subnormal half (or zero)
        if (e < -10) {
            return static_cast<uint16_t>(sign);
        }
        mantissa |= 0x800000u;
        const int shift = 14 - e;
        uint32_t half = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1);
        const uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (half & 1u))) {
            ++half;
        }
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) {
        ++half;  // may carry into the exponent, which is the correct rounding
    }
    return static_cast<uint16_t>(sign | half);
}

inline float HalfBitsToFloat(uint16_t h)
{
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0) {
        return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(mantissa), -24);
    }
    if (exponent == 31) {
        return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
    }
    return BitsFloat(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

inline uint16_t FloatToBf16Bits(float f)
{
    const uint32_t u = FloatBits(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) {
        return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet nan
    }
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float Bf16BitsToFloat(uint16_t b)
{
    return BitsFloat(static_cast<uint32_t>(b) << 16);
}

}  // namespace twin

struct half {
    uint16_t bits = 0;
    half() = default;
    half(float f) : bits(twin::FloatToHalfBits(f)) {}  // NOLINT: implicit as on the NPU
    operator float() const { return twin::HalfBitsToFloat(bits); }
};

struct bfloat16_t {
    uint16_t bits = 0;
    bfloat16_t() = default;
    bfloat16_t(float f) : bits(twin::FloatToBf16Bits(f)) {}  // NOLINT
    operator float() const { return twin::Bf16BitsToFloat(bits); }
};

#endif
