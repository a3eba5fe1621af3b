// The twin's rule checks must be able to fail: each test breaks one hardware rule and
// expects a violation naming the rule and the file:line of the offending call. The
// last tests run the real forward kernel: with a valid plan it passes; with a corrupted
// tiling or a truncated input tensor the twin stops it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "planner.h"
#include "twin/launch.h"

extern "C" void flash_cann_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                     GM_ADDR keyPaddingMask, GM_ADDR out, GM_ADDR softmaxLse,
                                     GM_ADDR workspace, GM_ADDR tiling);

namespace {

using namespace AscendC;
int g_failures = 0;
int g_tests = 0;

// Runs `body` on one AI core (AIC + 2 AIVs); `role` picks which core type runs it.
std::string RunOn(twin::CoreType role, std::vector<float>& gm, const std::function<void()>& body)
{
    twin::LaunchConfig config;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    return twin::Launch(config, [&] {
        if (twin::Core().type == role && twin::Core().subBlockIdx == 0) {
            body();
        }
    });
}

void Expect(const char* name, const std::string& violation, const std::string& fragment, int line)
{
    ++g_tests;
    const std::string site = "twin_rule_tests.cpp:" + std::to_string(line) + ":";
    if (violation.find(fragment) == std::string::npos || violation.find(site) == std::string::npos) {
        ++g_failures;
        std::fprintf(stderr, "FAIL %s: expected '%s' at %s, got: %s\n", name, fragment.c_str(),
                     site.c_str(), violation.empty() ? "(no violation)" : violation.c_str());
    } else {
        std::printf("ok   %-28s %s\n", name, violation.c_str());
    }
}

#define AT __LINE__ + 1  // the line of the next statement

void MisalignedCopy()
{
    std::vector<float> gm(64, 1.0f);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> que;
        pipe.InitBuffer(que, 1, 256);
        LocalTensor<float> t = que.AllocTensor<float>();
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), gm.size());
        line = AT;
        DataCopy(t[3], g, 8);
    });
    Expect("misaligned copy", v, "is not 32-byte aligned", line);
}

void TruncatingCopy()
{
    std::vector<float> gm(64, 1.0f);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> que;
        pipe.InitBuffer(que, 1, 256);
        LocalTensor<float> t = que.AllocTensor<float>();
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), gm.size());
        line = AT;
        DataCopy(t, g, 5);
    });
    Expect("copy of a partial block", v, "DataCopy of 20 bytes is not a multiple of 32", line);
}

void OverCapacity()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> a, b;
        pipe.InitBuffer(a, 2, 64 * 1024);
        line = AT;
        pipe.InitBuffer(b, 1, 96 * 1024);
    });
    Expect("UB over capacity", v, "UB over capacity: 131072 bytes in use + 1 x 98304", line);
}

void L0OverCapacity()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        TPipe pipe;
        TQue<TPosition::A2, 1> a;
        line = AT;
        pipe.InitBuffer(a, 2, 40 * 1024);
    });
    Expect("L0A over capacity", v, "L0A over capacity", line);
}

void UnbalancedQueue()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECOUT, 1> que;
        line = AT;
        pipe.InitBuffer(que, 2, 256);
        LocalTensor<float> t = que.AllocTensor<float>();
        que.EnQue(t);
    });
    Expect("unbalanced queue", v, "unbalanced: buffer 0 of this queue is still enqueued", line);
}

void AllocWithoutFree()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> que;
        pipe.InitBuffer(que, 1, 256);
        que.AllocTensor<float>();
        line = AT;
        que.AllocTensor<float>();
    });
    Expect("alloc without free", v, "are in use (a FreeTensor is missing)", line);
}

void DequeueEmpty()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> que;
        pipe.InitBuffer(que, 1, 256);
        line = AT;
        que.DeQue<float>();
    });
    Expect("DeQue without EnQue", v, "DeQue on an empty queue", line);
}

void OutOfBoundsGm()
{
    std::vector<float> gm(64, 1.0f);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECIN, 1> que;
        pipe.InitBuffer(que, 1, 256);
        LocalTensor<float> t = que.AllocTensor<float>();
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), gm.size());
        line = AT;
        DataCopy(t, g[60], 8);
    });
    Expect("GM out of bounds", v, "outside every tensor handed to the kernel", line);
}

void OutOfBoundsLocal()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 256);
        LocalTensor<float> t = buf.Get<float>();
        line = AT;
        Adds(t, t, 1.0f, 128);
    });
    Expect("UB tensor out of bounds", v, "exceed the UB tensor of 64 elements", line);
}

void WaitWithoutSet()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        line = AT;
        WaitFlag<HardEvent::MTE2_V>(0);
    });
    Expect("WaitFlag without SetFlag", v, "with no matching SetFlag", line);
}

void SetTwice()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        SetFlag<HardEvent::V_MTE3>(1);
        line = AT;
        SetFlag<HardEvent::V_MTE3>(1);
    });
    Expect("SetFlag twice", v, "already set and not yet waited on", line);
}

void ComparePartialRepeat()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> src, bits;
        pipe.InitBuffer(src, 512);
        pipe.InitBuffer(bits, 32);
        line = AT;
        Compares(bits.Get<uint8_t>(), src.Get<float>(), 0.0f, CMPMODE::LT, 100);
    });
    Expect("Compares partial repeat", v, "is not whole 256-byte repeats", line);
}

void VectorOnCube()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 256);
        line = AT;
        Muls(buf.Get<float>(), buf.Get<float>(), 2.0f, 64);
    });
    Expect("vector op on the cube core", v, "runs on the vector (AIV) core only", line);
}

void GemvMode()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        TPipe pipe;
        TQue<TPosition::A2, 1> a;
        TQue<TPosition::B2, 1> b;
        TQue<TPosition::CO1, 1> c;
        pipe.InitBuffer(a, 1, 512);
        pipe.InitBuffer(b, 1, 512);
        pipe.InitBuffer(c, 1, 1024);
        LocalTensor<half> la = a.AllocTensor<half>();
        LocalTensor<half> lb = b.AllocTensor<half>();
        LocalTensor<float> lc = c.AllocTensor<float>();
        line = AT;
        Mmad(lc, la, lb, MmadParams(1, 16, 16, 0, false, true));
    });
    Expect("Mmad with m == 1", v, "GEMV mode", line);
}

void ScratchOverlap()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> big, bits;
        pipe.InitBuffer(big, 188 * 1024);
        pipe.InitBuffer(bits, 32);
        line = AT;
        Select(big.Get<float>(64), bits.Get<uint8_t>(), big.Get<float>(64), 0.0f,
               SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);
    });
    Expect("Select over the UB scratch", v, "uses the top 8 KB of UB as scratch", line);
}

void CrossCoreDeadlock()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        line = AT;
        CrossCoreWaitFlag(5);
    });
    Expect("cross-core wait, no set", v, "deadlock: every core of the launch that has not "
           "finished is waiting", line);
}

void CrossCoreReservedFlag()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        line = AT;
        CrossCoreSetFlag<2, PIPE_FIX>(11);
    });
    Expect("cross-core flag id 11", v, "outside [0, 10] (11-14 belong to SyncAll)", line);
}

// Every AIC and AIV of a two-core launch; each core adds its index + 1 into gm[0] with
// an atomic DataCopy or Fixpipe after a SyncAll, then reads the sum after another.
void SyncAllAndAtomicAdd()
{
    std::vector<float> gm(16, 0.0f);
    std::vector<float> seen(6, -1.0f);
    twin::LaunchConfig config;
    config.blockDim = 2;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    const std::string v = twin::Launch(config, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        TPipe pipe;
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm.data(), gm.size());
        const float mine = static_cast<float>(twin::Core().blockIdx + 1);
        SyncAll<false>();
        SetAtomicAdd<float>();
        if (twin::Core().type == twin::CoreType::AIV) {
            TQue<TPosition::VECOUT, 1> que;
            pipe.InitBuffer(que, 1, 32);
            LocalTensor<float> t = que.AllocTensor<float>();
            Duplicate(t, mine, 8);
            que.EnQue(t);
            t = que.DeQue<float>();
            DataCopy(g, t, 8);
            que.FreeTensor(t);
        } else {
            TQue<TPosition::CO1, 1> que;
            pipe.InitBuffer(que, 1, 1024);
            LocalTensor<float> c = que.AllocTensor<float>();
            for (uint32_t i = 0; i < 256; ++i) {
                c.SetValue(i, 10 * mine);
            }
            PipeBarrier<PIPE_ALL>();  // the scalar stores before the FIX pipe reads L0C
            Fixpipe<float, float, CFG_ROW_MAJOR>(g, c, FixpipeParamsV220(8, 1, 16, 8, false));
            que.FreeTensor(c);
        }
        SetAtomicNone();
        SyncAll<false>();
        const int64_t who = twin::Core().type == twin::CoreType::AIC ? 4 + twin::Core().blockIdx
                                                                     : twin::Core().blockIdx;
        seen[static_cast<size_t>(who)] = g.GetValue(0);
    });
    // AIVs add 1 + 2 + 3 + 4, AICs 10 * (1 + 2).
    const bool ok = v.empty() && std::all_of(seen.begin(), seen.end(), [](float s) { return s == 40.0f; });
    ++g_tests;
    if (!ok) {
        ++g_failures;
        std::fprintf(stderr, "FAIL SyncAll + atomic add: %s, core 0 saw %g\n", v.c_str(), seen[0]);
    } else {
        std::printf("ok   %-28s every core read 40 after the SyncAll\n", "SyncAll + SetAtomicAdd");
    }
}

void SyncAllMissed()
{
    std::vector<float> gm(8);
    int line = 0;
    twin::LaunchConfig config;
    config.blockDim = 2;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    const std::string v = twin::Launch(config, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        if (twin::Core().blockIdx != 3 || twin::Core().type != twin::CoreType::AIV) {
            line = AT;
            SyncAll<false>();
        }
    });
    Expect("SyncAll skipped by a core", v, "SyncAll<false> at", line);
}

void SyncAllAivOnlyOnCube()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        line = AT;
        SyncAll();
    });
    Expect("SyncAll<true> on the cube", v, "SyncAll<true> synchronises the vector cores only", line);
}

void AtomicTypeMismatch()
{
    std::vector<float> gm(64, 1.0f);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECOUT, 1> que;
        pipe.InitBuffer(que, 1, 64);
        LocalTensor<half> t = que.AllocTensor<half>();
        GlobalTensor<half> g;
        g.SetGlobalBuffer(reinterpret_cast<half*>(gm.data()), 2 * gm.size());
        SetAtomicAdd<float>();
        line = AT;
        DataCopy(g, t, 16);
    });
    Expect("atomic float, half data", v, "SetAtomicAdd<float> is in force, but the copy moves 2-byte", line);
}

void CrossCoreNeedsMix()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        line = AT;
        CrossCoreSetFlag<2, PIPE_FIX>(1);
    });
    Expect("cross-core flag, no MIX", v, "needs a MIX kernel", line);
}

// --- races: each tiny kernel misses one edge and must be stopped at the racing access;
// its correctly synchronised twin (synced = true) must pass. ---

// Runs `body(synced)` on every unit of `cores` AI cores (MIX declared).
using RaceBody = std::function<void(bool synced, float* gm)>;

std::string RunRace(uint32_t cores, std::vector<float>& gm, const RaceBody& body, bool synced)
{
    twin::LaunchConfig config;
    config.blockDim = cores;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    return twin::Launch(config, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        body(synced, gm.data());
    });
}

void ExpectRace(const char* name, uint32_t cores, const RaceBody& body, const int& line)
{
    std::vector<float> gm(4096, 1.0f);
    const std::string racy = RunRace(cores, gm, body, false);
    Expect(name, racy, " race: ", line);
    std::vector<float> gm2(4096, 1.0f);
    const std::string clean = RunRace(cores, gm2, body, true);
    ++g_tests;
    if (!clean.empty()) {
        ++g_failures;
        std::fprintf(stderr, "FAIL %s, synchronised: %s\n", name, clean.c_str());
    } else {
        std::printf("ok   %-28s synchronised: no race\n", name);
    }
}

bool OnAiv0() { return twin::Core().type == twin::CoreType::AIV && twin::Core().subBlockIdx == 0; }
bool OnAic() { return twin::Core().type == twin::CoreType::AIC; }

void RaceMissingVectorBarrier()
{
    int line = 0;
    ExpectRace("race: no PipeBarrier<V>", 1, [&](bool synced, [[maybe_unused]] float* gm) {
        if (!OnAiv0()) return;
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.Get<float>(), b = a[64], c = a[128];
        Duplicate(a, 1.0f, 64);
        if (synced) PipeBarrier<PIPE_V>();
        line = AT;
        Add(b, a, a, 64);  // reads what Duplicate writes
        if (synced) PipeBarrier<PIPE_V>();
        Mul(c, b, b, 64);
    }, line);
}

void RaceMissingMte2ToV()
{
    int line = 0;
    ExpectRace("race: no MTE2->V flag", 1, [&](bool synced, [[maybe_unused]] float* gm) {
        if (!OnAiv0()) return;
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 512);
        LocalTensor<float> t = buf.Get<float>();
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm, 256);
        DataCopy(t, g, 64);
        if (synced) {
            SetFlag<HardEvent::MTE2_V>(EVENT_ID0);
            WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);
        }
        line = AT;
        Muls(t, t, 2.0f, 64);
    }, line);
}

// The cube writes GM with Fixpipe; a vector core reads it: a cross-core flag must order it.
void RaceMissingCrossCoreFlag()
{
    int line = 0;
    ExpectRace("race: no cross-core flag", 1, [&](bool synced, [[maybe_unused]] float* gm) {
        TPipe pipe;
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm, 256);
        if (OnAic()) {
            TQue<TPosition::CO1, 1> que;
            pipe.InitBuffer(que, 1, 1024);
            LocalTensor<float> c = que.AllocTensor<float>();
            que.EnQue(c);
            c = que.DeQue<float>();
            Fixpipe<float, float, CFG_ROW_MAJOR>(g, c, FixpipeParamsV220(16, 16, 16, 16, false));
            que.FreeTensor(c);
            if (synced) CrossCoreSetFlag<2, PIPE_FIX>(1);
        } else {
            if (synced) CrossCoreWaitFlag(1);
            TQue<TPosition::VECIN, 1> que;
            pipe.InitBuffer(que, 1, 1024);
            LocalTensor<float> t = que.AllocTensor<float>();
            if (OnAiv0()) line = AT;
            DataCopy(t, g, 256);
            que.FreeTensor(t);
        }
    }, line);
}

// L0C reused by the next Mmad while Fixpipe may still read it: FIX -> M is missing.
void RaceMissingFixToM()
{
    int line = 0;
    ExpectRace("race: no FIX->M reuse edge", 1, [&](bool synced, [[maybe_unused]] float* gm) {
        if (!OnAic()) return;
        TPipe pipe;
        TBuf<TPosition::A2> a;
        TBuf<TPosition::B2> b;
        TBuf<TPosition::CO1> c;
        pipe.InitBuffer(a, 512);
        pipe.InitBuffer(b, 512);
        pipe.InitBuffer(c, 1024);
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm, 256);
        for (int round = 0; round < 2; ++round) {
            if (round == 1) line = AT;
            Mmad(c.Get<float>(), a.Get<half>(), b.Get<half>(), MmadParams(16, 16, 16, 0, false, true));
            SetFlag<HardEvent::M_FIX>(EVENT_ID0);
            WaitFlag<HardEvent::M_FIX>(EVENT_ID0);
            Fixpipe<float, float, CFG_ROW_MAJOR>(g, c.Get<float>(), FixpipeParamsV220(16, 16, 16, 16, false));
            if (synced) {
                SetFlag<HardEvent::FIX_M>(EVENT_ID0);
                WaitFlag<HardEvent::FIX_M>(EVENT_ID0);
            }
        }
    }, line);
}

// Two AI cores: atomic adds into one GM range never race with each other, but a plain
// store there does, unless SyncAll orders it.
void RaceAtomicVersusPlain()
{
    int line = 0;
    ExpectRace("race: atomic vs plain store", 2, [&](bool synced, [[maybe_unused]] float* gm) {
        TPipe pipe;
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm, 256);
        if (OnAic()) {
            if (synced) SyncAll<false>();
            return;
        }
        TQue<TPosition::VECOUT, 1> que;
        pipe.InitBuffer(que, 1, 256);
        LocalTensor<float> t = que.AllocTensor<float>();
        Duplicate(t, 1.0f, 64);
        que.EnQue(t);
        t = que.DeQue<float>();
        SetAtomicAdd<float>();
        DataCopy(g, t, 64);  // every vector core adds: no race among them
        SetAtomicNone();
        if (synced) SyncAll<false>();
        if (twin::Core().blockIdx == 0) {
            line = AT;
            DataCopy(g, t, 64);  // a plain store over the sums
        }
        que.FreeTensor(t);
    }, line);
}

// A scalar store into UB read by a vector instruction needs S -> V.
void RaceScalarThenVector()
{
    int line = 0;
    ExpectRace("race: no S->V flag", 1, [&](bool synced, [[maybe_unused]] float* gm) {
        if (!OnAiv0()) return;
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 512);
        LocalTensor<float> t = buf.Get<float>();
        t.SetValue(0, 5.0f);
        if (synced) {
            SetFlag<HardEvent::S_V>(EVENT_ID1);
            WaitFlag<HardEvent::S_V>(EVENT_ID1);
        }
        line = AT;
        Adds(t[64], t, 1.0f, 64);
    }, line);
}

// Accumulating Mmads into one L0C: a small one ((m/16)*(n/16) < 10) needs PipeBarrier<M>
// (Mmad docs); a large one is ordered by the hardware (checked by the synced variant).
void RaceSmallMmadAccumulation()
{
    int line = 0;
    ExpectRace("race: small Mmad accumulation", 1, [&](bool synced, [[maybe_unused]] float* gm) {
        if (!OnAic()) return;
        TPipe pipe;
        TBuf<TPosition::A2> a;
        TBuf<TPosition::B2> b;
        TBuf<TPosition::CO1> c;
        pipe.InitBuffer(a, 16 * 1024);
        pipe.InitBuffer(b, 16 * 1024);
        pipe.InitBuffer(c, 64 * 1024);
        const uint16_t n = synced ? 160 : 16;  // 10 fractals of 16 x 16, or one
        Mmad(c.Get<float>(), a.Get<half>(), b.Get<half>(), MmadParams(16, n, 16, 0, false, true));
        line = AT;
        Mmad(c.Get<float>(), a.Get<half>(), b.Get<half>(), MmadParams(16, n, 16, 0, false, false));
    }, line);
}

// The real kernel on a small problem: valid, then with a corrupted plan and a
// truncated input.
struct Problem {
    flash_cann::Plan plan;
    std::vector<half> q, k, v, out;
    std::vector<float> lse;
    std::vector<uint8_t> workspace, tiling;

    Problem()
    {
        flash_cann::PlanRequest r;
        r.batch = 1;
        r.headsQ = r.headsKv = 2;
        r.seqlenQ = r.seqlenK = 96;
        r.headDim = 64;
        r.causal = true;
        r.scale = 0.125;
        plan = flash_cann::MakePlan(r, *flash_cann::FindPlatform("Ascend910B2")).plan;
        const size_t n = 2 * 96 * 64;
        for (auto* t : {&q, &k, &v}) {
            t->resize(n);
            for (size_t i = 0; i < n; ++i) {
                (*t)[i] = half(std::sin(0.37f * i + t->size()));
            }
        }
        out.resize(n);
        lse.resize(2 * 96);
    }

    std::string Run(size_t queryBytes)
    {
        workspace.assign(kSystemWorkspaceBytes + plan.userWorkspaceBytes, 0xFF);
        tiling.resize(sizeof(flash_cann::TilingData));
        std::memcpy(tiling.data(), &plan.tiling, sizeof(plan.tiling));
        twin::LaunchConfig config;
        config.blockDim = plan.blockDim;
        config.tilingKey = plan.tilingKey;
        config.gm = {{q.data(), queryBytes, "query"}, {k.data(), k.size() * 2, "key"},
                     {v.data(), v.size() * 2, "value"}, {out.data(), out.size() * 2, "out"},
                     {lse.data(), lse.size() * 4, "lse"},
                     {workspace.data(), workspace.size(), "workspace"},
                     {tiling.data(), tiling.size(), "tiling"}};
        return twin::Launch(config, [&] {
            flash_cann_attention(reinterpret_cast<GM_ADDR>(q.data()), reinterpret_cast<GM_ADDR>(k.data()),
                                 reinterpret_cast<GM_ADDR>(v.data()), nullptr,
                                 reinterpret_cast<GM_ADDR>(out.data()),
                                 reinterpret_cast<GM_ADDR>(lse.data()), workspace.data(), tiling.data());
        });
    }
};

void KernelValid()
{
    Problem p;
    const std::string v = p.Run(p.q.size() * 2);
    ++g_tests;
    if (!v.empty()) {
        ++g_failures;
        std::fprintf(stderr, "FAIL the kernel with a valid plan: %s\n", v.c_str());
    } else {
        std::printf("ok   %-28s (no violation)\n", "kernel, valid plan");
    }
}

void KernelCorruptTiling()
{
    Problem p;
    p.plan.tiling.blockK = 1024;  // neither the cube's nor the vector cores' buffers fit
    const std::string v = p.Run(p.q.size() * 2);
    ++g_tests;
    if (v.find("op_kernel/flash_attention_") == std::string::npos ||
        v.find("over capacity") == std::string::npos) {
        ++g_failures;
        std::fprintf(stderr, "FAIL kernel with blockK 1024: %s\n", v.empty() ? "(no violation)" : v.c_str());
    } else {
        std::printf("ok   %-28s %s\n", "kernel, corrupted tiling", v.c_str());
    }
}

void KernelTruncatedInput()
{
    Problem p;
    const std::string v = p.Run(p.q.size() * 2 - 64);  // the last query row is not the kernel's
    ++g_tests;
    if (v.find("flash_attention_cube.h") == std::string::npos ||
        v.find("outside every tensor handed to the kernel") == std::string::npos) {
        ++g_failures;
        std::fprintf(stderr, "FAIL kernel with a truncated query: %s\n", v.empty() ? "(no violation)" : v.c_str());
    } else {
        std::printf("ok   %-28s %s\n", "kernel, truncated query", v.c_str());
    }
}

}  // namespace

int main()
{
    for (auto test : {MisalignedCopy, TruncatingCopy, OverCapacity, L0OverCapacity, UnbalancedQueue,
                      AllocWithoutFree, DequeueEmpty, OutOfBoundsGm, OutOfBoundsLocal,
                      WaitWithoutSet, SetTwice, ComparePartialRepeat, VectorOnCube, GemvMode,
                      ScratchOverlap, CrossCoreDeadlock, CrossCoreNeedsMix, CrossCoreReservedFlag,
                      SyncAllAndAtomicAdd, SyncAllMissed, SyncAllAivOnlyOnCube, AtomicTypeMismatch,
                      RaceMissingVectorBarrier, RaceMissingMte2ToV, RaceMissingCrossCoreFlag,
                      RaceMissingFixToM, RaceAtomicVersusPlain, RaceScalarThenVector,
                      RaceSmallMmadAccumulation, KernelValid,
                      KernelCorruptTiling, KernelTruncatedInput}) {
        test();
    }
    std::printf("%d of %d twin rule tests passed\n", g_tests - g_failures, g_tests);
    return g_failures == 0 ? 0 : 1;
}
