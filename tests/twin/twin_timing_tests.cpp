// The timing mode (twin/timing.h) on hand-built micro-kernels whose schedule is known:
// each case states the cycle count the cost table below gives, worked out by hand, and
// the twin must report exactly that (tests/test_twin_timing.py runs this program).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "twin/launch.h"
#include "twin/timing.h"

namespace {

using namespace AscendC;
int g_failures = 0;
int g_tests = 0;

// Round figures, so that every expected count is easy to derive: no dispatch or issue
// cost, GM -> UB 64 bytes a cycle + 10 cycles of latency, UB -> GM 32 bytes a cycle + 10,
// GM -> L1 64 bytes a cycle + 10, Duplicate 1 cycle a repeat with an 11-cycle head (so a
// result is ready 10 cycles after the pipe is free), Muls 4 cycles a repeat, head 4 (no
// extra latency), flags 250, SyncAll 100, an L2 so wide it never limits.
twin::TimingCosts Table()
{
    twin::TimingCosts c;
    c.clockGhz = 1.0;
    c.bytesPerCycle[static_cast<int>(twin::Route::kGmToUb)] = 64;
    c.latencyCycles[static_cast<int>(twin::Route::kGmToUb)] = 10;
    c.bytesPerCycle[static_cast<int>(twin::Route::kUbToGm)] = 32;
    c.latencyCycles[static_cast<int>(twin::Route::kUbToGm)] = 10;
    c.bytesPerCycle[static_cast<int>(twin::Route::kGmToL1)] = 64;
    c.latencyCycles[static_cast<int>(twin::Route::kGmToL1)] = 10;
    c.vectorCycles[static_cast<int>(twin::VecClass::kDuplicate)] = 1;
    c.vectorHead[static_cast<int>(twin::VecClass::kDuplicate)] = 11;
    c.vectorCycles[static_cast<int>(twin::VecClass::kScalarArith)] = 4;
    c.vectorHead[static_cast<int>(twin::VecClass::kScalarArith)] = 4;
    c.l2BytesPerCycle = 1e9;
    c.crossCoreFlagCycles = 250;
    c.syncAllCycles = 100;
    return c;
}

// The number after "key": in `json`, searching from the first occurrence of `after`.
double Field(const std::string& json, const std::string& key, const std::string& after = "")
{
    const size_t from = after.empty() ? 0 : json.find(after);
    const size_t at = json.find("\"" + key + "\":", from == std::string::npos ? 0 : from);
    if (at == std::string::npos) {
        return NAN;
    }
    return std::strtod(json.c_str() + at + key.size() + 3, nullptr);
}

// Runs `body` timed on `cores` AI cores; returns the timing report ("" on a violation,
// which is printed).
std::string Timed(uint32_t cores, std::vector<float>& gm, const std::function<void()>& body)
{
    const twin::TimingCosts costs = Table();
    twin::SetTiming(&costs, 0, false);
    twin::LaunchConfig config;
    config.blockDim = cores;
    config.scheduleMode = 1;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    twin::LaunchReport report;
    const std::string violation = twin::Launch(config, body, &report);
    twin::SetTiming(nullptr, -1, false);
    if (!violation.empty()) {
        std::fprintf(stderr, "violation: %s\n", violation.c_str());
        return "";
    }
    return report.timing;
}

void Expect(const char* name, double got, double expected)
{
    ++g_tests;
    if (got != expected) {
        ++g_failures;
        std::fprintf(stderr, "FAIL %-40s %g cycles, expected %g\n", name, got, expected);
    } else {
        std::printf("ok   %-40s %g cycles\n", name, got);
    }
}

bool IsAiv0()
{
    return twin::Core().type == twin::CoreType::AIV && twin::Core().subBlockIdx == 0;
}

// GM -> UB (1024 bytes: 16 + 10 cycles), then, after SetFlag/WaitFlag<MTE2_MTE3>, UB -> GM
// of the same bytes (32 + 10): they serialise, 26 + 42 = 68. Without the flag, into
// another buffer, they overlap: max(26, 42) = 42.
void DependentCopiesSerialise(bool flagged)
{
    std::vector<float> gm(1024, 1.0f);
    const std::string report = Timed(1, gm, [&] {
        if (!IsAiv0()) return;
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 2048);
        LocalTensor<float> a = buf.Get<float>(256);
        LocalTensor<float> b = buf.GetWithOffset<float>(256, 1024);
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), gm.size());
        DataCopy(a, g, 256);
        if (flagged) {
            const TEventID id = pipe.FetchEventID<HardEvent::MTE2_MTE3>();
            SetFlag<HardEvent::MTE2_MTE3>(id);
            WaitFlag<HardEvent::MTE2_MTE3>(id);
        }
        DataCopy(g[512], flagged ? a : b, 256);
    });
    Expect(flagged ? "dependent copies serialise" : "independent copies overlap",
           Field(report, "makespan_cycles"), flagged ? 68 : 42);
}

// A copy (MTE2, 26) and a Duplicate (V, 1 repeat: 1 + 10) on other bytes overlap:
// max(26, 11) = 26; a WaitFlag<MTE2_V> before the Duplicate delays V to 26: 26 + 11.
void PipesOverlapUnlessWaited(bool waited)
{
    std::vector<float> gm(1024, 1.0f);
    const std::string report = Timed(1, gm, [&] {
        if (!IsAiv0()) return;
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 2048);
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), gm.size());
        DataCopy(buf.Get<float>(256), g, 256);
        if (waited) {
            const TEventID id = pipe.FetchEventID<HardEvent::MTE2_V>();
            SetFlag<HardEvent::MTE2_V>(id);
            WaitFlag<HardEvent::MTE2_V>(id);
        }
        Duplicate(buf.GetWithOffset<float>(64, 1024), 0.0f, 64);
    });
    Expect(waited ? "WaitFlag delays its pipe" : "two independent pipes overlap",
           Field(report, "makespan_cycles"), waited ? 37 : 26);
}

// Two Duplicates of one repeat: in a row the second starts when V is free (1) and ends at
// 1 + 11 = 12; after PipeBarrier<PIPE_V> it waits for the first's result (11): 22.
void BarrierExposesTheHead(bool barrier)
{
    std::vector<float> gm(64, 1.0f);
    const std::string report = Timed(1, gm, [&] {
        if (!IsAiv0()) return;
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 512);
        Duplicate(buf.Get<float>(64), 1.0f, 64);
        if (barrier) {
            PipeBarrier<PIPE_V>();
        }
        Duplicate(buf.GetWithOffset<float>(64, 256), 2.0f, 64);
    });
    Expect(barrier ? "PipeBarrier waits for the result" : "same-pipe instructions pipeline",
           Field(report, "makespan_cycles"), barrier ? 22 : 12);
}

// AIC: GM -> L1 (1024 bytes, 26), CrossCoreSetFlag<2, PIPE_MTE2>; each AIV waits for it
// and runs a Duplicate: 26 + 250 + 11 = 287 on both vector cores.
void CrossCoreFlagCarriesTheTime()
{
    std::vector<float> gm(1024, 1.0f);
    const std::string report = Timed(1, gm, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        TPipe pipe;
        if (twin::Core().type == twin::CoreType::AIC) {
            TBuf<TPosition::A1> l1;
            pipe.InitBuffer(l1, 1024);
            GlobalTensor<float> g;
            g.SetGlobalBuffer(gm.data(), gm.size());
            DataCopy(l1.Get<float>(256), g, 256);
            CrossCoreSetFlag<2, PIPE_MTE2>(0);
            return;
        }
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 256);
        CrossCoreWaitFlag(0);
        Duplicate(buf.Get<float>(64), 0.0f, 64);
    });
    Expect("cross-core flag: AIV0 after the AIC's copy", Field(report, "end_cycles", "\"unit\":\"AIV0\""), 287);
    Expect("cross-core flag: AIV1 after the AIC's copy", Field(report, "end_cycles", "\"unit\":\"AIV1\""), 287);
}

// Two AI cores: core 0's AIV0 copies 4096 bytes (64 + 10 = 74), then every unit meets in
// SyncAll, released at 74 + 100; then each AIV0 runs a Duplicate: 174 + 11 = 185 on both
// cores, although core 1 had nothing to do before.
void SyncAllAlignsCores()
{
    std::vector<float> gm(1024, 1.0f);
    const std::string report = Timed(2, gm, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        if (IsAiv0()) {
            pipe.InitBuffer(buf, 4096);
        }
        if (IsAiv0() && GetBlockIdx() == 0) {
            GlobalTensor<float> g;
            g.SetGlobalBuffer(gm.data(), gm.size());
            DataCopy(buf.Get<float>(1024), g, 1024);
        }
        SyncAll<false>();
        if (IsAiv0()) {
            Duplicate(buf.Get<float>(64), 0.0f, 64);
        }
    });
    Expect("SyncAll: core 0 AIV0", Field(report, "end_cycles", "\"core\":0,\"unit\":\"AIV0\""), 185);
    Expect("SyncAll: core 1 AIV0", Field(report, "end_cycles", "\"core\":1,\"unit\":\"AIV0\""), 185);
}

// A VECIN queue of `buffers` buffers: 4 rounds of copy in (1024 bytes: 16 + 10), EnQue,
// DeQue, Muls over 4 repeats (16 cycles, its result at 16), FreeTensor. One buffer: the
// next copy waits for the Muls (AllocTensor), so each round is 26 + 16 = 42: 168. Two
// buffers: copy i + 1 runs during Muls i, and a buffer's reuse waits for the Muls of two
// rounds back: the copies end at 26, 42, 68, 84, the Muls at 42, 58, 84, 100.
void DoubleBufferingOverlaps(int buffers)
{
    std::vector<float> gm(256, 1.0f);
    const std::string report = Timed(1, gm, [&] {
        if (!IsAiv0()) return;
        TPipe pipe;
        TQue<TPosition::VECIN, 2> in;
        TBuf<TPosition::VECCALC> out;
        pipe.InitBuffer(in, static_cast<uint8_t>(buffers), 1024);
        pipe.InitBuffer(out, 1024);
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), gm.size());
        for (int round = 0; round < 4; ++round) {
            LocalTensor<float> t = in.AllocTensor<float>();
            DataCopy(t, g, 256);
            in.EnQue(t);
            LocalTensor<float> x = in.DeQue<float>();
            Muls(out.Get<float>(256), x, 2.0f, 256);
            PipeBarrier<PIPE_V>();
            in.FreeTensor(x);
        }
    });
    Expect(buffers == 1 ? "single-buffered queue serialises" : "double-buffered queue overlaps",
           Field(report, "makespan_cycles"), buffers == 1 ? 168 : 100);
}

}  // namespace

int main()
{
    DependentCopiesSerialise(true);
    DependentCopiesSerialise(false);
    PipesOverlapUnlessWaited(false);
    PipesOverlapUnlessWaited(true);
    BarrierExposesTheHead(false);
    BarrierExposesTheHead(true);
    CrossCoreFlagCarriesTheTime();
    SyncAllAlignsCores();
    DoubleBufferingOverlaps(1);
    DoubleBufferingOverlaps(2);
    std::printf("%d of %d twin timing tests passed\n", g_tests - g_failures, g_tests);
    return g_failures == 0 ? 0 : 1;
}
