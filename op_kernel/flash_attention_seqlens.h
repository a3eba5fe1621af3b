// The packed sequences' offsets as both kernels read them: cu_seqlens_q/k (int32,
// batch + 1) of a layout-TND launch, in GM, read on the device by the scalar unit -- the
// `Offsets` reader of flash_cann_packed.h's walks. The host never reads them.
#ifndef FLASH_CANN_FLASH_ATTENTION_SEQLENS_H
#define FLASH_CANN_FLASH_ATTENTION_SEQLENS_H

#include "kernel_operator.h"
#include "flash_cann_packed.h"

namespace flash_cann {

class DeviceSeqlens {
public:
    __aicore__ inline void Init(GM_ADDR cuSeqlensQ, GM_ADDR cuSeqlensK)
    {
        q_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(cuSeqlensQ));
        k_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(cuSeqlensK));
    }
    __aicore__ inline int64_t Query(uint32_t b) const { return q_.GetValue(b); }
    __aicore__ inline int64_t Key(uint32_t b) const { return k_.GetValue(b); }

private:
    AscendC::GlobalTensor<int32_t> q_, k_;
};

}  // namespace flash_cann

#endif  // FLASH_CANN_FLASH_ATTENTION_SEQLENS_H
