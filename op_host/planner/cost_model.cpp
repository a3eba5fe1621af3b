#include "cost_model.h"

#include <algorithm>

namespace flash_cann {

double VisiblePairs(int64_t seqlenQ, int64_t seqlenK, bool causal)
{
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

Prediction Predict(const Plan& plan, const PlanRequest& r, const Platform& p)
{
    const TilingData& t = plan.tiling;
    const double e = ElementBytes(r.dtype);
    const double clock = p.cubeClockGhz * 1e9;
    double maxMacs = 0;
    double maxVectorPasses = 0;
    double scoreElements = 0;
    double keyColumns = 0;
    for (const CoreWork& c : plan.cores) {
        const double score = static_cast<double>(c.scoreElements);
        // Output rows x key blocks ~ score elements / blockK (both per padded row).
        const double outputs = score / t.blockK * t.headDimPad;
        maxMacs = std::max(maxMacs, c.macs);
        maxVectorPasses = std::max(maxVectorPasses, score * kScorePasses + outputs * kOutputPasses);
        scoreElements += score;
        keyColumns += static_cast<double>(c.keyColumns);
    }
    Prediction pr;
    pr.cubeSeconds = maxMacs / (16.0 * 16.0 * 16.0 * clock);
    pr.vectorSeconds = maxVectorPasses / 2 / (kVectorElementsPerCycle * clock);
    const double qo = 2.0 * r.batch * r.headsQ * r.seqlenQ * r.headDim * e;
    const double kv = 2.0 * r.batch * r.headsKv * r.seqlenK * r.headDim * e;
    const double lse = 4.0 * r.batch * r.headsQ * r.seqlenQ;
    const double mask = r.hasMask ? static_cast<double>(r.batch) * r.seqlenK : 0.0;
    pr.hbmSeconds = (qo + kv + lse + mask) / p.hbmBytesPerSecond;
    const double workspace = scoreElements * (8.0 + 2.0 * e) +
                             scoreElements / t.blockK * t.headDimPad * 8.0;
    const double kvReloads = keyColumns * r.headDim * 2.0 * e;
    pr.l2Seconds = (workspace + kvReloads) / p.l2BytesPerSecond;
    pr.seconds = std::max({pr.cubeSeconds, pr.vectorSeconds, pr.hbmSeconds, pr.l2Seconds});
    pr.bound = pr.seconds == pr.cubeSeconds   ? "cube"
               : pr.seconds == pr.vectorSeconds ? "vector"
               : pr.seconds == pr.hbmSeconds    ? "HBM"
                                                : "L2 (workspace traffic)";
    pr.usefulFlops = 4.0 * r.headDim * r.batch * r.headsQ *
                     VisiblePairs(r.seqlenQ, r.seqlenK, r.causal);
    pr.cubeUtilization = pr.seconds > 0 ? pr.usefulFlops / (pr.seconds * CubePeakFlops(p)) : 0;
    return pr;
}

}  // namespace flash_cann
