// The dropout keep-mask generator (op_kernel/flash_attention_philox.h) on the twin, for
// Python (ctypes; tests/test_twin_philox.py compares it bit for bit with
// contract.variant.keep_mask): one vector core runs PhiloxDropout::Generate on a slice
// and copies the bit mask to GM.
#include <cstdint>
#include <string>

#include "flash_attention_philox.h"
#include "kernel_operator.h"
#include "report.h"
#include "twin/launch.h"

namespace {

// The slice's bits (rows * width of them) from one AIV: Init reads the rng state from
// GM, Generate fills a VECOUT buffer, DataCopyPad stores it.
void KeepMaskKernel(GM_ADDR rngState, uint32_t threshold, uint32_t batch, uint32_t head, uint32_t row0,
                    uint32_t rows, uint32_t col0, uint32_t width, uint32_t passElements, GM_ADDR bits)
{
    if (!ASCEND_IS_AIV || AscendC::GetSubBlockIdx() != 0) {
        return;
    }
    const uint32_t bitBytes = rows * width / 8;
    AscendC::TPipe pipe;
    AscendC::TBuf<AscendC::TPosition::VECCALC> scratchBuf;
    AscendC::TQue<AscendC::TPosition::VECOUT, 1> bitsQue;
    pipe.InitBuffer(scratchBuf, flash_cann::PhiloxScratchBytes(passElements));
    pipe.InitBuffer(bitsQue, 1, (bitBytes + 31) / 32 * 32);
    flash_cann::PhiloxDropout dropout;
    dropout.Init(rngState, threshold, scratchBuf.Get<uint8_t>(), passElements);
    AscendC::LocalTensor<uint8_t> keep = bitsQue.AllocTensor<uint8_t>();
    dropout.Generate(keep, batch, head, row0, rows, col0, width);
    bitsQue.EnQue(keep);
    keep = bitsQue.DeQue<uint8_t>();
    AscendC::GlobalTensor<uint8_t> out;
    out.SetGlobalBuffer(bits, bitBytes);
    AscendC::DataCopyPad(out, keep, AscendC::DataCopyExtParams(1, bitBytes, 0, 0, 0));
    bitsQue.FreeTensor(keep);
}

}  // namespace

// rngState: int64 (seed, offset); bits: rows * width / 8 bytes. Returns 0, or 1 with the
// twin's first rule violation in `error`.
extern "C" int flash_cann_twin_philox_keep(int64_t* rngState, uint32_t threshold, uint32_t batch,
                                           uint32_t head, uint32_t row0, uint32_t rows, uint32_t col0,
                                           uint32_t width, uint32_t passElements, uint8_t* bits,
                                           char* error, uint64_t errorCapacity)
{
    twin::LaunchConfig config;
    config.gm = {{rngState, 2 * sizeof(int64_t), "rng_state", false},
                 {bits, size_t(rows) * width / 8, "keep_bits"}};
    const std::string violation = twin::Launch(config, [&] {
        KeepMaskKernel(reinterpret_cast<GM_ADDR>(rngState), threshold, batch, head, row0, rows, col0,
                       width, passElements, bits);
    });
    return violation.empty() ? 0 : twin::Report(violation, error, errorCapacity);
}
