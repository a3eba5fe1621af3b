// The twin's rule checks must be able to fail: each test breaks one hardware rule and
// expects a violation naming the rule and the file:line of the offending call. The
// last tests run the real forward kernel: with a valid plan it passes; with a corrupted
// tiling or a truncated input tensor the twin stops it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "kernel_operator.h"
#include "planner.h"
#include "twin/launch.h"

extern "C" void flash_cann_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                     GM_ADDR keyPaddingMask, GM_ADDR cuSeqlensQ, GM_ADDR cuSeqlensK,
                                     GM_ADDR alibiSlopes, GM_ADDR rngState,
                                     GM_ADDR sinks, GM_ADDR out, GM_ADDR softmaxLse,
                                     GM_ADDR workspace, GM_ADDR tiling);

namespace {

using namespace AscendC;
int g_failures = 0;
int g_tests = 0;

// Runs `body` on one AI core (AIC + 2 AIVs); `role` picks which core type runs it.
std::string RunOn(twin::CoreType role, std::vector<float>& gm, const std::function<void()>& body)
{
    twin::LaunchConfig config;
    config.scheduleMode = 1;  // batch mode, as a kernel with SyncAll needs
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    return twin::Launch(config, [&] {
        if (twin::Core().type == role && twin::Core().subBlockIdx == 0) {
            body();
        }
    });
}

// `rule`: the id ("R07") the twin's check carries in its message, "" for the checks
// that are not a Require/Fail (deadlocks, unbalanced queues). tests/test_twin.py fails
// when a rule of twin/ has no test here.
// `anySite`: the line may also be the second site a message names ("file:line (...)"),
// as in a race, whose two accesses are reported in the order the threads reached them.
void Expect(const std::string& rule, const char* name, const std::string& violation,
            const std::string& fragment, int line, bool anySite = false)
{
    ++g_tests;
    const std::string site = "twin_rule_tests.cpp:" + std::to_string(line) + ":";
    const std::string secondSite = "twin_rule_tests.cpp:" + std::to_string(line) + " (";
    const bool named = violation.find(site) != std::string::npos ||
                       (anySite && violation.find(secondSite) != std::string::npos);
    const std::string tag = rule.empty() ? "" : "[" + rule + "] ";
    if (violation.find(fragment) == std::string::npos || !named ||
        violation.find(tag) == std::string::npos) {
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
    Expect("R42", "misaligned copy", v, "is not 32-byte aligned", line);
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
    Expect("R02", "copy of a partial block", v, "DataCopy of 20 bytes is not a multiple of 32", line);
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
    Expect("R50", "UB over capacity", v, "UB over capacity: 131072 bytes in use + 1 x 98304", line);
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
    Expect("R50", "L0A over capacity", v, "L0A over capacity", line);
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
    Expect("", "unbalanced queue", v, "unbalanced: buffer 0 of this queue is still enqueued", line);
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
    Expect("R53", "alloc without free", v, "are in use (a FreeTensor is missing)", line);
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
    Expect("R56", "DeQue without EnQue", v, "DeQue on an empty queue", line);
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
    Expect("R33", "GM out of bounds", v, "outside every tensor handed to the kernel", line);
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
    Expect("R15", "UB tensor out of bounds", v, "exceed the UB tensor of 64 elements", line);
}

void WaitWithoutSet()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        line = AT;
        WaitFlag<HardEvent::MTE2_V>(0);
    });
    Expect("R62", "WaitFlag without SetFlag", v, "with no matching SetFlag", line);
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
    Expect("R60", "SetFlag twice", v, "already set and not yet waited on", line);
}

// `body` must run clean: the counterpart of a rule test, showing the rule fires on the
// broken pattern only.
void ExpectClean(const char* name, twin::CoreType role, const std::function<void()>& body)
{
    std::vector<float> gm(8);
    const std::string v = RunOn(role, gm, body);
    ++g_tests;
    if (!v.empty()) {
        ++g_failures;
        std::fprintf(stderr, "FAIL %s: expected no violation, got: %s\n", name, v.c_str());
    } else {
        std::printf("ok   %-28s (no violation)\n", name);
    }
}

// The backward cube's old WriteKeyValueGrad: the dQ product's CO1 queue has just freed its
// L0C buffer, and TPipe's event pool gave that FreeTensor FIX_M id 0 (set until the
// buffer's next AllocTensor). A fixed EVENT_ID0 then sets a set id. An id from
// FetchEventID is a free one.
void FixToCubeAfterCo1Free()
{
    std::vector<float> gm(8);
    int line = 0;
    auto pattern = [&](bool fetch) {
        TPipe pipe;
        TQue<TPosition::CO1, 1> que;
        pipe.InitBuffer(que, 1, 1024);
        LocalTensor<float> c = que.AllocTensor<float>();
        que.EnQue(c);
        c = que.DeQue<float>();
        que.FreeTensor(c);
        const int32_t id = fetch ? int32_t{pipe.FetchEventID<HardEvent::FIX_M>()} : int32_t{EVENT_ID0};
        line = AT;
        SetFlag<HardEvent::FIX_M>(id);
        WaitFlag<HardEvent::FIX_M>(id);
    };
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] { pattern(false); });
    Expect("R65", "FIX_M id 0 after a CO1 free", v,
           "SetFlag<FIX_M>(0): TPipe's event pool holds this id for the queue initialised at", line);
    ExpectClean("FIX_M id from FetchEventID", twin::CoreType::AIC, [&] { pattern(true); });
}

// The forward cube's old event rings on the cube core: TPipe's constructor holds and sets
// M_MTE1 ids 0-2 (TPipe::Init on dav-c220, for the matmul macro) until it is destroyed,
// so the ring's hand-picked "buffer free" SetFlag<M_MTE1>(0) sets a set id.
void MatmulMacroIds()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        TPipe pipe;
        line = AT;
        SetFlag<HardEvent::M_MTE1>(EVENT_ID0);
    });
    Expect("R65", "M_MTE1 id 0 beside TPipe", v, "holds and sets M_MTE1 ids 0-2", line);
    ExpectClean("M_MTE1 id from AllocEventID", twin::CoreType::AIC, [] {
        TPipe pipe;
        const TEventID id = pipe.AllocEventID<HardEvent::M_MTE1>();  // 3: 0-2 are TPipe's
        SetFlag<HardEvent::M_MTE1>(id);
        WaitFlag<HardEvent::M_MTE1>(id);
        pipe.ReleaseEventID<HardEvent::M_MTE1>(id);
    });
}

// The other way round: the kernel sets a hand-picked MTE3_V id 0, then a VECOUT queue's
// FreeTensor takes id 0 from the pool (nobody holds it there) and sets it again.
void QueueAfterKernelFlag()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TQue<TPosition::VECOUT, 1> que;
        pipe.InitBuffer(que, 1, 256);
        LocalTensor<float> t = que.AllocTensor<float>();
        SetFlag<HardEvent::MTE3_V>(EVENT_ID0);
        que.EnQue(t);
        t = que.DeQue<float>();
        line = AT;
        que.FreeTensor(t);
    });
    Expect("R66", "queue free after kernel flag", v, "sets MTE3_V id 0 from TPipe's event pool, but the kernel",
           line);
}

// Ids 6 and 7 are not the kernel's to pick (SetFlag/WaitFlag docs); one the pool hands out
// is (AllocEventID gives 6 once 0-5 are held).
void ReservedEventIds()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        line = AT;
        SetFlag<HardEvent::V_MTE3>(EVENT_ID6);
    });
    Expect("R64", "hand-picked event id 6", v, "SetFlag<V_MTE3>(6): event ids 6 and 7 are reserved", line);
    ExpectClean("event id 6 from AllocEventID", twin::CoreType::AIV, [] {
        TPipe pipe;
        TEventID ids[7];
        for (TEventID& id : ids) id = pipe.AllocEventID<HardEvent::V_MTE3>();
        SetFlag<HardEvent::V_MTE3>(ids[6]);
        WaitFlag<HardEvent::V_MTE3>(ids[6]);
        for (TEventID id : ids) pipe.ReleaseEventID<HardEvent::V_MTE3>(id);
        if (ids[6] != 6) twin::Fail({__FILE__, __LINE__}, "[test] AllocEventID gave ", int{ids[6]});
        // A released id goes back to the pool: more alloc/release pairs than the pool has
        // ids, each handed the lowest, id 0 (a pool that kept released ids runs out: R67).
        for (int round = 0; round < 10; ++round) {
            const TEventID id = pipe.AllocEventID<HardEvent::V_MTE3>();
            if (id != 0) twin::Fail({__FILE__, __LINE__}, "[test] AllocEventID after a release gave ", int{id});
            pipe.ReleaseEventID<HardEvent::V_MTE3>(id);
        }
    });
}

// The backward cube's old L1 queues: A1 and B1 queues take their FreeTensor ids from one
// MTE1_MTE2 pool of eight, and a freed buffer keeps its id until its next AllocTensor, so
// ten freed L1 buffers need ten ids.
void EventPoolExhausted()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        TPipe pipe;
        TQue<TPosition::A1, 1> a;
        TQue<TPosition::B1, 1> b;
        pipe.InitBuffer(a, 5, 512);
        pipe.InitBuffer(b, 5, 512);
        LocalTensor<half> tensors[10];
        for (int i = 0; i < 10; ++i) tensors[i] = i < 5 ? a.AllocTensor<half>() : b.AllocTensor<half>();
        for (int i = 0; i < 8; ++i) {
            if (i < 5) a.FreeTensor(tensors[i]); else b.FreeTensor(tensors[i]);
        }
        line = AT;
        b.FreeTensor(tensors[8]);
    });
    Expect("R67", "ninth pending MTE1_MTE2 id", v, "all 8 ids of HardEvent MTE1_MTE2 are held", line);
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
    Expect("R25", "Compares partial repeat", v, "is not whole 256-byte repeats", line);
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
    Expect("R40", "vector op on the cube core", v, "runs on the vector (AIV) core only", line);
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
    Expect("R09", "Mmad with m == 1", v, "GEMV mode", line);
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
    Expect("R43", "Select over the UB scratch", v, "uses the top 8 KB of UB as scratch", line);
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
    Expect("", "cross-core wait, no set", v, "deadlock: every core of the launch that has not "
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
    Expect("R34", "cross-core flag id 11", v, "outside [0, 10] (11-14 belong to SyncAll)", line);
}

// Every AIC and AIV of a two-core launch; each core adds its index + 1 into gm[0] with
// an atomic DataCopy or Fixpipe after a SyncAll, then reads the sum after another.
void SyncAllAndAtomicAdd()
{
    std::vector<float> gm(16, 0.0f);
    std::vector<float> seen(6, -1.0f);
    twin::LaunchConfig config;
    config.blockDim = 2;
    config.scheduleMode = 1;
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
    config.scheduleMode = 1;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    const std::string v = twin::Launch(config, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        if (twin::Core().blockIdx != 3 || twin::Core().type != twin::CoreType::AIV) {
            line = AT;
            SyncAll<false>();
        }
    });
    Expect("", "SyncAll skipped by a core", v, "SyncAll<false> at", line);
}

// A SyncAll kernel launched without batch schedule mode (its TilingFunc never called
// SetScheduleMode(1)).
void SyncAllWithoutBatchMode()
{
    std::vector<float> gm(8);
    int line = 0;
    twin::LaunchConfig config;
    config.blockDim = 2;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    const std::string v = twin::Launch(config, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        line = AT;
        SyncAll<false>();
    });
    Expect("R97", "SyncAll, normal schedule", v, "did not set batch schedule mode", line);
}

// A SyncAll kernel launched on more blocks than the device has AI cores; the same
// launch on enough cores passes.
void SyncAllMoreBlocksThanCores()
{
    std::vector<float> gm(8);
    int line = 0;
    twin::LaunchConfig config;
    config.blockDim = 3;
    config.aiCores = 2;
    config.scheduleMode = 1;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    auto kernel = [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        line = AT;
        SyncAll<false>();
    };
    const std::string v = twin::Launch(config, kernel);
    Expect("R98", "SyncAll, 3 blocks on 2 cores", v, "3 blocks on 2 AI cores", line);
    config.aiCores = 3;
    const std::string fits = twin::Launch(config, kernel);
    ++g_tests;
    if (!fits.empty()) {
        ++g_failures;
        std::fprintf(stderr, "FAIL SyncAll, 3 blocks on 3 cores: %s\n", fits.c_str());
    } else {
        std::printf("ok   %-28s (no violation)\n", "SyncAll, 3 blocks on 3 cores");
    }
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
    Expect("R38", "SyncAll<true> on the cube", v, "SyncAll<true> synchronises the vector cores only", line);
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
    Expect("R01", "atomic float, half data", v, "SetAtomicAdd<float> is in force, but the copy moves 2-byte", line);
}

void CrossCoreNeedsMix()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIC, gm, [&] {
        line = AT;
        CrossCoreSetFlag<2, PIPE_FIX>(1);
    });
    Expect("R31", "cross-core flag, no MIX", v, "needs a MIX kernel", line);
}

// --- races: each tiny kernel misses one edge and must be stopped at the racing access;
// its correctly synchronised twin (synced = true) must pass. ---

// Runs `body(synced)` on every unit of `cores` AI cores (MIX declared).
using RaceBody = std::function<void(bool synced, float* gm)>;

std::string RunRace(uint32_t cores, std::vector<float>& gm, const RaceBody& body, bool synced,
                    twin::LaunchReport* report = nullptr)
{
    twin::LaunchConfig config;
    config.blockDim = cores;
    config.scheduleMode = 1;  // the bodies may SyncAll
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    return twin::Launch(config, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        body(synced, gm.data());
    }, report);
}

void ExpectRace(const char* name, uint32_t cores, const RaceBody& body, const int& line)
{
    std::vector<float> gm(4096, 1.0f);
    const std::string racy = RunRace(cores, gm, body, false);
    Expect("R39", name, racy, " race: ", line, /*anySite=*/true);
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

// The cube writes GM with Fixpipe; a vector core reads it: a cross-core flag set from the
// FIX pipe must order it. Unsynced, the flag is missing, or (fromWrongPipe) set from MTE3.
void RaceCrossCoreFlag(const char* name, bool fromWrongPipe)
{
    int line = 0;
    ExpectRace(name, 1, [&](bool synced, [[maybe_unused]] float* gm) {
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
            if (synced) {
                CrossCoreSetFlag<2, PIPE_FIX>(1);
            } else if (fromWrongPipe) {
                CrossCoreSetFlag<2, PIPE_MTE3>(1);
            }
        } else {
            if (synced || fromWrongPipe) CrossCoreWaitFlag(1);
            TQue<TPosition::VECIN, 1> que;
            pipe.InitBuffer(que, 1, 1024);
            LocalTensor<float> t = que.AllocTensor<float>();
            if (OnAiv0()) line = AT;
            DataCopy(t, g, 256);
            que.FreeTensor(t);
        }
    }, line);
}

void RaceMissingCrossCoreFlag()
{
    RaceCrossCoreFlag("race: no cross-core flag", false);
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

// The vector core 0 of two AI cores adds into one GM range. With no edge between the
// adds their order is not fixed, and the launch reports the tensor (the structural check
// of a deterministic kernel variant); with core 0's add before a SyncAll and core 1's
// after it, the order is fixed and nothing is reported.
void UnorderedAtomicAddsReported()
{
    const RaceBody body = [](bool ordered, float* gm) {
        const bool adds = OnAiv0();
        const bool early = adds && twin::Core().blockIdx == 0;
        auto add = [gm] {
            TPipe pipe;
            GlobalTensor<float> g;
            g.SetGlobalBuffer(gm, 256);
            TQue<TPosition::VECOUT, 1> que;
            pipe.InitBuffer(que, 1, 256);
            LocalTensor<float> t = que.AllocTensor<float>();
            Duplicate(t, 1.0f, 64);
            que.EnQue(t);
            t = que.DeQue<float>();
            SetAtomicAdd<float>();
            DataCopy(g, t, 64);
            SetAtomicNone();
            que.FreeTensor(t);
        };
        if (adds && (early || !ordered)) add();
        if (ordered) SyncAll<false>();
        if (adds && !early && ordered) add();
    };
    for (const bool ordered : {false, true}) {
        std::vector<float> gm(4096, 1.0f);
        twin::LaunchReport report;
        const std::string v = RunRace(2, gm, body, ordered, &report);
        const std::vector<std::string> expected = ordered ? std::vector<std::string>{}
                                                          : std::vector<std::string>{"gm"};
        ++g_tests;
        if (!v.empty() || report.unorderedAtomicAdds != expected) {
            ++g_failures;
            std::fprintf(stderr, "FAIL unordered atomic adds (%s): %s, %zu tensors reported\n",
                         ordered ? "ordered" : "unordered", v.c_str(), report.unorderedAtomicAdds.size());
        } else {
            std::printf("ok   %-28s %s\n", ordered ? "atomic adds, SyncAll between" : "atomic adds, unordered",
                        ordered ? "nothing reported" : "'gm' reported");
        }
    }
}

// The queue's FreeTensor -> AllocTensor edge orders the next fill of a reused buffer
// after the vector reads of the previous one; with that edge dropped at the FreeTensor
// call (a mutation, as tests/test_twin_races.py does to the kernel) it is a race.
void RaceQueueReuseWithoutFreeEdge()
{
    int line = 0;
    ExpectRace("race: queue reuse, no Free edge", 1, [&](bool synced, float* gm) {
        if (!OnAiv0()) return;
        struct Restore {  // the race ends the body early
            ~Restore() { twin::DropSyncSite(""); }
        } restore;
        TPipe pipe;
        TQue<TPosition::VECIN, 1> que;
        TBuf<TPosition::VECCALC> sum;
        pipe.InitBuffer(que, 1, 256);
        pipe.InitBuffer(sum, 256);
        GlobalTensor<float> g;
        g.SetGlobalBuffer(gm, 64);
        for (int round = 0; round < 2; ++round) {
            LocalTensor<float> t = que.AllocTensor<float>();
            if (round == 1) line = AT;
            DataCopy(t, g, 64);  // MTE2 refills the buffer the vector read in round 0
            que.EnQue(t);
            t = que.DeQue<float>();
            Adds(sum.Get<float>(), t, 1.0f, 64);
            if (!synced) twin::DropSyncSite("twin_rule_tests.cpp:" + std::to_string(__LINE__ + 1));
            que.FreeTensor(t);
        }
    }, line);
}

// A flag, a wait or a barrier on the wrong pipe orders nothing the access needs: each
// racy body below has the right kind of call, only with the wrong pipe, and its synced
// twin the right one. (Written as the class of bug: a detector that lets a WaitFlag
// order every pipe of the unit, or a SetFlag release every pipe's work, or a
// PipeBarrier order every pipe, or a CrossCoreSetFlag release every pipe, passes them.)

// MTE2 writes t, V reads it; the synced body flags MTE2 -> V, the racy one flags WRONG:
// from the wrong source pipe (MTE3_V) or to the wrong destination pipe (MTE2_MTE3).
template <HardEvent WRONG>
void RaceMte2ThenVectorFlagged(const char* name)
{
    int line = 0;
    ExpectRace(name, 1, [&](bool synced, [[maybe_unused]] float* gm) {
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
        } else {
            SetFlag<WRONG>(EVENT_ID0);
            WaitFlag<WRONG>(EVENT_ID0);
        }
        line = AT;
        Muls(t, t, 2.0f, 64);
    }, line);
}

void RaceFlagFromTheWrongPipe()
{
    RaceMte2ThenVectorFlagged<HardEvent::MTE3_V>("race: flag from the wrong pipe");
}

void RaceWaitOnTheWrongPipe()
{
    RaceMte2ThenVectorFlagged<HardEvent::MTE2_MTE3>("race: wait on the wrong pipe");
}

// V writes a and reads it next; the barrier is PipeBarrier<MTE2> instead of <V>.
void RaceBarrierOnTheWrongPipe()
{
    int line = 0;
    ExpectRace("race: barrier on the wrong pipe", 1, [&](bool synced, [[maybe_unused]] float* gm) {
        if (!OnAiv0()) return;
        TPipe pipe;
        TBuf<TPosition::VECCALC> buf;
        pipe.InitBuffer(buf, 1024);
        LocalTensor<float> a = buf.Get<float>(), b = a[64];
        Duplicate(a, 1.0f, 64);
        if (synced) {
            PipeBarrier<PIPE_V>();
        } else {
            PipeBarrier<PIPE_MTE2>();
        }
        line = AT;
        Add(b, a, a, 64);
    }, line);
}

// The cross-core flag is set from MTE3 instead of FIX: it does not wait for Fixpipe.
void RaceCrossCoreFlagFromTheWrongPipe()
{
    RaceCrossCoreFlag("race: cross-core flag, wrong pipe", true);
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

// --- one negative case per remaining rule of twin/ (the rule id in its message): each
// body breaks the rule once, at a call in this file. ---
struct RuleCase {
    const char* rule;
    twin::CoreType role;
    std::function<void(float* gm)> body;
};

using twin::CoreType;

const std::vector<RuleCase>& RuleCases()
{
    static const std::vector<RuleCase> cases = {
        {"R03", CoreType::AIV, [](float* gm) {
             TPipe pipe; TQue<TPosition::VECOUT, 1> q; pipe.InitBuffer(q, 1, 256);
             GlobalTensor<float> g; g.SetGlobalBuffer(gm, 64);
             DataCopy(g, q.AllocTensor<float>(), 5);  // 20 bytes UB -> GM
         }},
        {"R04", CoreType::AIC, [](float* gm) {
             TPipe pipe; TQue<TPosition::A1, 1> q; pipe.InitBuffer(q, 1, 4096);
             GlobalTensor<half> g; g.SetGlobalBuffer(reinterpret_cast<half*>(gm), 512);
             DataCopy(q.AllocTensor<half>(), g, Nd2NzParams(0, 1, 16, 0, 16, 16, 1, 0));  // ndNum 0
         }},
        {"R05", CoreType::AIC, [](float* gm) {
             TPipe pipe; TQue<TPosition::A1, 1> q; pipe.InitBuffer(q, 1, 4096);
             GlobalTensor<half> g; g.SetGlobalBuffer(reinterpret_cast<half*>(gm), 512);
             DataCopy(q.AllocTensor<half>(), g, Nd2NzParams(1, 2, 32, 0, 16, 16, 1, 0));  // dValue > pitch
         }},
        {"R06", CoreType::AIV, [](float* gm) {
             TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 1, 256);
             GlobalTensor<float> g; g.SetGlobalBuffer(gm, 64);
             DataCopyPad(q.AllocTensor<float>(), g, DataCopyExtParams(1, 6, 0, 0, 0),
                         DataCopyPadExtParams<float>(false, 0, 0, 0));  // 6 bytes of float
         }},
        {"R07", CoreType::AIV, [](float* gm) {
             TPipe pipe; TQue<TPosition::VECOUT, 1> q; pipe.InitBuffer(q, 1, 256);
             GlobalTensor<float> g; g.SetGlobalBuffer(gm, 64);
             DataCopyPad(g, q.AllocTensor<float>(), DataCopyExtParams(1, 6, 0, 0, 0));
         }},
        {"R08", CoreType::AIC, [](float*) {
             TPipe pipe; TQue<TPosition::A1, 1> l1; TQue<TPosition::A2, 1> a;
             pipe.InitBuffer(l1, 1, 1024); pipe.InitBuffer(a, 1, 1024);
             LoadData(a.AllocTensor<float>(), l1.AllocTensor<float>(), LoadData2DParams(0, 1, 0, 0, 0, true, 0));
         }},
        {"R10", CoreType::AIC, [](float*) {
             TPipe pipe; TBuf<TPosition::A2> a; TBuf<TPosition::B2> b; TBuf<TPosition::CO1> c;
             pipe.InitBuffer(a, 512); pipe.InitBuffer(b, 512); pipe.InitBuffer(c, 1024);
             Mmad(c.Get<float>(), a.Get<half>(), b.Get<half>(), MmadParams(4096, 16, 16, 0, false, true));
         }},
        {"R11", CoreType::AIC, [](float* gm) {
             TPipe pipe; TBuf<TPosition::CO1> c; pipe.InitBuffer(c, 1024);
             GlobalTensor<float> g; g.SetGlobalBuffer(gm, 256);
             FixpipeParamsV220 p(16, 16, 16, 16, false);
             p.quantPre = QuantMode_t::F322F16;
             Fixpipe<float, float, CFG_ROW_MAJOR>(g, c.Get<float>(), p);
         }},
        {"R12", CoreType::AIC, [](float* gm) {
             TPipe pipe; TBuf<TPosition::CO1> c; pipe.InitBuffer(c, 1024);
             GlobalTensor<float> g; g.SetGlobalBuffer(gm, 256);
             Fixpipe<float, float, CFG_ROW_MAJOR>(g, c.Get<float>(), FixpipeParamsV220(16, 16, 8, 16, false));
         }},
        {"R13", CoreType::AIC, [](float* gm) {
             TPipe pipe; TBuf<TPosition::CO1> c; pipe.InitBuffer(c, 1024);
             GlobalTensor<float> g; g.SetGlobalBuffer(gm, 256);
             Fixpipe<float, float, CFG_ROW_MAJOR>(g, c.Get<float>(), FixpipeParamsV220(16, 16, 16, 8, false));
         }},
        {"R96", CoreType::AIC, [](float* gm) {
             TPipe pipe; TBuf<TPosition::CO1> c; pipe.InitBuffer(c, 1024);
             GlobalTensor<half> g; g.SetGlobalBuffer(reinterpret_cast<half*>(gm), 256);
             Fixpipe<half, float, CFG_ROW_MAJOR>(g, c.Get<float>(), FixpipeParamsV220(16, 16, 16, 16, false));
         }},
        {"R14", CoreType::AIV, [](float*) { LocalTensor<float> unbound; unbound.GetValue(0); }},
        // The bounds at their edges: one element past a 64-element tensor, past the end of
        // a view t[32] (32 elements left), and a TBuf view whose offset carries it past the
        // buffer (OutOfBoundsLocal overshoots by 64; these by one).
        {"R15", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             b.Get<float>().GetValue(64);
         }},
        {"R15", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             b.Get<float>()[32].GetValue(32);
         }},
        {"R18", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             b.GetWithOffset<float>(57, 32);  // bytes 32 .. 260 of 256
         }},
        // The 8 KB scratch at its edge: 186 KB of buffers leave 6 KB of UB free, less than it.
        {"R43", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> big; pipe.InitBuffer(big, 186 * 1024);
             Select(big.Get<float>(64), big.Get<uint8_t>(32), big.Get<float>(64), 0.0f,
                    SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);
         }},
        {"R16", CoreType::AIV, [](float*) { TBuf<TPosition::VECCALC> b; b.Get<float>(); }},
        {"R17", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             b.GetWithOffset<float>(8, 4);
         }},
        {"R18", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             b.Get<float>(128);
         }},
        {"R19", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             const LocalTensor<float> t = b.Get<float>();
             Add(t, t, t, 0, 1, BinaryRepeatParams());  // mask 0
         }},
        {"R20", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             const LocalTensor<float> t = b.Get<float>();
             Add(t, t, t, 64, 1, BinaryRepeatParams(0, 1, 1, 8, 8, 8));
         }},
        {"R21", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             Adds(b.Get<float>(), b.Get<float>(), 1.0f, -1);
         }},
        {"R22", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             Cast(b.Get<float>(), b.GetWithOffset<half>(16, 128), RoundMode::CAST_RINT, 16);
         }},
        {"R23", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             Cast(b.GetWithOffset<half>(16, 128), b.Get<float>(), RoundMode::CAST_NONE, 16);
         }},
        {"R24", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             Cast(b.Get<float>(), b.Get<half>(), RoundMode::CAST_NONE, 16);  // in place, widening
         }},
        {"R26", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b, bits; pipe.InitBuffer(b, 256); pipe.InitBuffer(bits, 32);
             Select(b.Get<float>(), bits.Get<uint8_t>(), b.Get<float>(), 0.0f, SELMODE::VSEL_CMPMASK_SPR, 64);
         }},
        {"R27", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             WholeReduceSum(b.Get<float>(), b.Get<float>(), 64, 256, 1, 1, 8);
         }},
        {"R28", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             WholeReduceSum(b.Get<float>(), b.Get<float>(), 0, 1, 1, 1, 8);
         }},
        {"R29", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             WholeReduceMax(b.Get<float>(), b.Get<float>(), 64, 1, 1, 1, 8);  // value/index pairs
         }},
        {"R30", CoreType::AIV, [](float*) {
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 1024);
             Brcb(b.Get<float>(), b.Get<float>(), 1, BrcbRepeatParams(1, 8));
         }},
        {"R35", CoreType::AIC, [](float*) {
             KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
             for (int i = 0; i < 16; ++i) CrossCoreSetFlag<2, PIPE_FIX>(2);
         }},
        {"R36", CoreType::AIV, [](float*) {
             KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
             for (int i = 0; i < 16; ++i) CrossCoreSetFlag<2, PIPE_MTE3>(2);
         }},
        {"R37", CoreType::AIV, [](float*) {
             KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
             CrossCoreWaitFlag(11);
         }},
        {"R41", CoreType::AIC, [](float* gm) {
             TPipe pipe; TQue<TPosition::A2, 1> q; pipe.InitBuffer(q, 1, 512);
             GlobalTensor<float> g; g.SetGlobalBuffer(gm, 64);
             DataCopy(q.AllocTensor<float>(), g, 8);  // GM -> L0A is no DataCopy path
         }},
        {"R44", CoreType::AIV, [](float*) { TPipe pipe; TBuf<TPosition::GM> b; pipe.InitBuffer(b, 32); }},
        {"R45", CoreType::AIV, [](float*) {
             TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 1, 32); pipe.InitBuffer(q, 1, 32);
         }},
        {"R46", CoreType::AIV, [](float*) { TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 0, 32); }},
        {"R47", CoreType::AIV, [](float*) { TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 1, 0); }},
        {"R48", CoreType::AIV, [](float*) {
             TPipe pipe;
             std::unique_ptr<TBuf<TPosition::VECCALC>[]> bufs(new TBuf<TPosition::VECCALC>[65]);
             for (int i = 0; i < 65; ++i) pipe.InitBuffer(bufs[i], 32);
         }},
        {"R49", CoreType::AIV, [](float*) { TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 9, 32); }},
        {"R51", CoreType::AIV, [](float*) {
             TPipe pipe; TQue<TPosition::VECIN, 1> q1, q2; pipe.InitBuffer(q1, 1, 32); pipe.InitBuffer(q2, 1, 32);
             LocalTensor<float> other = q2.AllocTensor<float>();
             q1.FreeTensor(other);
         }},
        {"R52", CoreType::AIV, [](float*) { TQue<TPosition::VECIN, 1> q; q.AllocTensor<float>(); }},
        {"R54", CoreType::AIV, [](float*) {
             TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 1, 32);
             LocalTensor<float> t = q.AllocTensor<float>();
             q.FreeTensor(t);
             q.EnQue(t);
         }},
        {"R55", CoreType::AIV, [](float*) {
             TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 2, 32);
             q.EnQue(q.AllocTensor<float>());
             q.EnQue(q.AllocTensor<float>());  // depth 1
         }},
        {"R57", CoreType::AIV, [](float*) {
             TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 1, 32);
             LocalTensor<float> t = q.AllocTensor<float>();
             q.FreeTensor(t);
             q.FreeTensor(t);
         }},
        {"R58", CoreType::AIV, [](float*) {
             TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 1, 32);
             LocalTensor<float> t = q.AllocTensor<float>();
             q.EnQue(t);
             q.FreeTensor(t);
         }},
        {"R59", CoreType::AIV, [](float*) { SetFlag<HardEvent::MTE2_V>(8); }},
        {"R61", CoreType::AIV, [](float*) { WaitFlag<HardEvent::MTE2_V>(8); }},
        {"R63", CoreType::AIV, [](float*) { PipeBarrier<PIPE_S>(); }},
        {"R68", CoreType::AIV, [](float*) { TPipe pipe; pipe.ReleaseEventID<HardEvent::V_S>(3); }},
        {"R69", CoreType::AIV, [](float*) {  // takes the flag the queue's FreeTensor set
             TPipe pipe; TQue<TPosition::VECIN, 1> q; pipe.InitBuffer(q, 1, 32);
             LocalTensor<float> t = q.AllocTensor<float>();
             q.FreeTensor(t);
             WaitFlag<HardEvent::V_MTE2>(EVENT_ID0);
         }},
        {"R42", CoreType::AIV, [](float*) {  // a vector operand off the 32-byte grid
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 512);
             Adds(b.Get<float>()[1], b.Get<float>()[1], 1.0f, 8);
         }},
        // The integer instructions of the dropout generator (flash_attention_philox.h).
        {"R90", CoreType::AIV, [](float*) {  // vadd has no uint32 form on 910B
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             Add(b.Get<uint32_t>(), b.Get<uint32_t>(), b.Get<uint32_t>(), 64);
         }},
        {"R91", CoreType::AIV, [](float*) {  // int32 overflow, saturation mode never set
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             Duplicate(b.Get<int32_t>(), int32_t{0x7FFFFFFF}, 64);
             PipeBarrier<PIPE_V>();
             Adds(b.Get<int32_t>(), b.Get<int32_t>(), int32_t{1}, 64);
         }},
        {"R92", CoreType::AIV, [](float*) {  // vshl takes 16/32-bit integers only
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             ShiftLeft(b.Get<float>(), b.Get<float>(), 1.0f, 64);
         }},
        {"R93", CoreType::AIV, [](float*) {  // a 32-bit shift past 32
             TPipe pipe; TBuf<TPosition::VECCALC> b; pipe.InitBuffer(b, 256);
             ShiftRight(b.Get<uint32_t>(), b.Get<uint32_t>(), 33u, 64);
         }},
        {"R94", CoreType::AIV, [](float*) {  // int32 -> float: CAST_NONE or CAST_RINT only
             TPipe pipe; TBuf<TPosition::VECCALC> a, b; pipe.InitBuffer(a, 256); pipe.InitBuffer(b, 256);
             Cast(b.Get<float>(), a.Get<int32_t>(), RoundMode::CAST_FLOOR, 64);
         }},
        {"R95", CoreType::AIV, [](float*) {  // int32 compares only for equality
             TPipe pipe; TBuf<TPosition::VECCALC> a, bits; pipe.InitBuffer(a, 256); pipe.InitBuffer(bits, 32);
             Compares(bits.Get<uint8_t>(), a.Get<int32_t>(), int32_t{0}, CMPMODE::GE, 64);
         }},
    };
    return cases;
}

// A wait on a core that is alive but slow is no deadlock: only the backstop timeout
// ends it (the cube sleeps past it, then sets the flag).
void BackstopTimeout()
{
    std::vector<float> gm(8);
    int line = 0;
    twin::SetDeadlockTimeout(std::chrono::milliseconds(100));
    twin::LaunchConfig config;
    config.gm = {{gm.data(), gm.size() * sizeof(float), "gm"}};
    const std::string v = twin::Launch(config, [&] {
        KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
        if (twin::Core().type == twin::CoreType::AIC) {
            std::this_thread::sleep_for(std::chrono::milliseconds(400));
            CrossCoreSetFlag<2, PIPE_FIX>(1);
        } else if (twin::Core().subBlockIdx == 0) {
            line = AT;
            CrossCoreWaitFlag(1);
        }
    });
    twin::SetDeadlockTimeout(std::chrono::milliseconds(120000));
    Expect("R32", "backstop timeout", v, "still waiting after 100 ms", line);
}

// The integer saturation bit left changed at exit (R99); saved and restored, it passes.
void SaturationModeNotRestored()
{
    std::vector<float> gm(8);
    int line = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        line = AT;
        SetSaturationFlag<SaturationMode::INT>(false);
    });
    Expect("R99", "saturation bit not restored", v, "not as it found it", line);
    const std::string restored = RunOn(twin::CoreType::AIV, gm, [&] {
        const bool saturating = GetSaturationFlag<SaturationMode::INT>();
        SetSaturationFlag<SaturationMode::INT>(false);
        SetSaturationFlag<SaturationMode::INT>(saturating);
    });
    ++g_tests;
    if (!restored.empty()) {
        ++g_failures;
        std::fprintf(stderr, "FAIL saturation bit restored: %s\n", restored.c_str());
    } else {
        std::printf("ok   %-28s (no violation)\n", "saturation bit restored");
    }
}

// Integer arithmetic under CTRL bit 53: truncation wraps, saturation clamps; 16-bit
// lanes and shifts as the dropout generator uses them.
void IntegerArithmetic()
{
    std::vector<float> gm(8);
    int32_t wrapped = 0, saturated = 0, high = 0;
    uint16_t bitwise = 0;
    int16_t difference = 0;
    const std::string v = RunOn(twin::CoreType::AIV, gm, [&] {
        TPipe pipe;
        TBuf<TPosition::VECCALC> a, b, c;
        pipe.InitBuffer(a, 256); pipe.InitBuffer(b, 256); pipe.InitBuffer(c, 256);
        SetSaturationFlag<SaturationMode::INT>(false);
        Duplicate(a.Get<int32_t>(), int32_t{0x7FFFFFFF}, 64);
        Duplicate(c.Get<uint32_t>(), 0xD2511F53u, 64);
        PipeBarrier<PIPE_V>();
        Muls(b.Get<int32_t>(), a.Get<int32_t>(), int32_t{3}, 64);      // wraps to 0x7FFFFFFD
        ShiftRight(c.Get<uint32_t>(), c.Get<uint32_t>(), 16u, 64);     // logical: 0xD251
        PipeBarrier<PIPE_ALL>();  // the scalar reads below, and the vector writes after them
        wrapped = b.Get<int32_t>().GetValue(5);
        high = c.Get<int32_t>().GetValue(63);
        PipeBarrier<PIPE_ALL>();
        SetSaturationFlag<SaturationMode::INT>(true);
        Muls(b.Get<int32_t>(), a.Get<int32_t>(), int32_t{3}, 64);
        Or(c.Get<uint16_t>(), a.Get<uint16_t>(), a.Get<uint16_t>(), 128);
        PipeBarrier<PIPE_ALL>();
        saturated = b.Get<int32_t>().GetValue(0);
        bitwise = c.Get<uint16_t>().GetValue(1);                        // high half of 0x7FFFFFFF
        PipeBarrier<PIPE_ALL>();
        Sub(b.Get<int16_t>(), c.Get<int16_t>(), a.Get<int16_t>(), 128); // 0x7FFF - 0x7FFF
        PipeBarrier<PIPE_ALL>();
        difference = b.Get<int16_t>().GetValue(1);
    });
    ++g_tests;
    if (!v.empty() || wrapped != 0x7FFFFFFD || saturated != 0x7FFFFFFF || high != 0xD251 ||
        bitwise != 0x7FFF || difference != 0) {
        ++g_failures;
        std::fprintf(stderr, "FAIL integer arithmetic: %s wrapped %x saturated %x high %x or %x sub %d\n",
                     v.c_str(), wrapped, saturated, high, bitwise, difference);
    } else {
        std::printf("ok   integer arithmetic (wrap, saturate, logical shift, 16-bit lanes)\n");
    }
}

void RuleCasesFire()
{
    for (const RuleCase& c : RuleCases()) {
        std::vector<float> gm(1024, 1.0f);
        const std::string v = RunOn(c.role, gm, [&] { c.body(gm.data()); });
        ++g_tests;
        const std::string tag = std::string("[") + c.rule + "] ";
        if (v.find(tag) == std::string::npos || v.find("twin_rule_tests.cpp:") == std::string::npos) {
            ++g_failures;
            std::fprintf(stderr, "FAIL rule %s: got %s\n", c.rule, v.empty() ? "(no violation)" : v.c_str());
        } else {
            std::printf("ok   rule %-23s %s\n", c.rule, v.c_str());
        }
    }
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
                                 reinterpret_cast<GM_ADDR>(v.data()), nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, reinterpret_cast<GM_ADDR>(out.data()),
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
                      WaitWithoutSet, SetTwice, FixToCubeAfterCo1Free, MatmulMacroIds, QueueAfterKernelFlag,
                      ReservedEventIds, EventPoolExhausted, ComparePartialRepeat, VectorOnCube, GemvMode,
                      ScratchOverlap, CrossCoreDeadlock, CrossCoreNeedsMix, CrossCoreReservedFlag,
                      SyncAllAndAtomicAdd, SyncAllMissed, SyncAllWithoutBatchMode, SyncAllMoreBlocksThanCores,
                      SyncAllAivOnlyOnCube, AtomicTypeMismatch,
                      RaceMissingVectorBarrier, RaceMissingMte2ToV, RaceMissingCrossCoreFlag,
                      RaceMissingFixToM, RaceAtomicVersusPlain, UnorderedAtomicAddsReported, RaceScalarThenVector,
                      RaceSmallMmadAccumulation, RaceQueueReuseWithoutFreeEdge, RaceFlagFromTheWrongPipe,
                      RaceWaitOnTheWrongPipe, RaceBarrierOnTheWrongPipe,
                      RaceCrossCoreFlagFromTheWrongPipe, IntegerArithmetic, SaturationModeNotRestored, RuleCasesFire, BackstopTimeout, KernelValid,
                      KernelCorruptTiling, KernelTruncatedInput}) {
        test();
    }
    std::printf("%d of %d twin rule tests passed\n", g_tests - g_failures, g_tests);
    return g_failures == 0 ? 0 : 1;
}
