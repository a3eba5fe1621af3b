// What the planner's test programs share: the EXPECT macro and its failure count, a
// printable description of a request, platforms with a given core count, and random
// problems.
#ifndef FLASH_CANN_PLANNER_TEST_SUPPORT_H
#define FLASH_CANN_PLANNER_TEST_SUPPORT_H

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "planner.h"

namespace flash_cann_test {

inline int g_failures = 0;

#define EXPECT(cond, ...)                                                        \
    do {                                                                         \
        if (!(cond)) {                                                           \
            ++flash_cann_test::g_failures;                                       \
            std::fprintf(stderr, "%s:%d: EXPECT(%s) failed: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                   \
            std::fprintf(stderr, "\n");                                          \
        }                                                                        \
    } while (0)

inline std::string Describe(const flash_cann::PlanRequest& r, uint32_t cores)
{
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld dtype=%u layout=%u causal=%d "
                  "mask=%d cores=%u",
                  static_cast<long long>(r.batch), static_cast<long long>(r.headsQ),
                  static_cast<long long>(r.headsKv), static_cast<long long>(r.seqlenQ),
                  static_cast<long long>(r.seqlenK), static_cast<long long>(r.headDim),
                  static_cast<unsigned>(r.dtype), static_cast<unsigned>(r.layout), r.causal,
                  r.hasMask, cores);
    return buf;
}

inline flash_cann::Platform WithCores(uint32_t cores)
{
    return flash_cann::WithAiCores(*flash_cann::FindPlatform("Ascend910B2"), cores);
}

inline int64_t LogUniform(std::mt19937_64& rng, int64_t lo, int64_t hi)
{
    std::uniform_real_distribution<double> u(std::log(double(lo)), std::log(double(hi) + 1));
    return std::min<int64_t>(hi, static_cast<int64_t>(std::exp(u(rng))));
}

// A random supported problem: GQA ratios 1-8, sequences 1-128k, head_dim 1-256, both
// dtypes, layouts, causal and mask; batch kept so that batch x heads_q x seqlen_q stays
// under `maxQueryRows` (the exhaustive walks stay affordable).
inline flash_cann::PlanRequest RandomProblem(std::mt19937_64& rng, int64_t maxQueryRows)
{
    flash_cann::PlanRequest r;
    r.headsKv = LogUniform(rng, 1, 16);
    r.headsQ = r.headsKv * LogUniform(rng, 1, 8);
    r.seqlenQ = LogUniform(rng, 1, 128 * 1024);
    r.seqlenK = LogUniform(rng, 1, 128 * 1024);
    const int64_t maxBatch = std::max<int64_t>(1, maxQueryRows / (r.headsQ * r.seqlenQ));
    r.batch = LogUniform(rng, 1, std::min<int64_t>(64, maxBatch));
    r.headDim = 1 + static_cast<int64_t>(rng() % 256);
    r.dtype = (rng() & 1) ? flash_cann::DType::BFloat16 : flash_cann::DType::Float16;
    r.layout = (rng() & 1) ? flash_cann::Layout::BSND : flash_cann::Layout::BNSD;
    r.causal = rng() & 1;
    r.hasMask = rng() & 1;
    r.scale = 1.0 / std::sqrt(double(r.headDim));
    return r;
}

// The core counts the random tests draw: mostly the 910B's 20 and 24, any of 1-48 in one
// draw out of four.
inline uint32_t RandomCores(std::mt19937_64& rng)
{
    return (rng() % 4 == 0) ? 1 + rng() % flash_cann::kMaxCores : (rng() & 1 ? 20 : 24);
}

}  // namespace flash_cann_test

#endif
