// The CPU twin's stand-in for CANN's "kernel_operator.h": the subset of the Ascend C API
// that flash-cann's kernels use, with the documented semantics and the hardware's rules
// enforced (see twin/*.h). TEST AND DEVELOPMENT ONLY: the NPU build uses CANN's header.
#ifndef FLASH_CANN_TWIN_KERNEL_OPERATOR_H
#define FLASH_CANN_TWIN_KERNEL_OPERATOR_H

#include <cstring>

#include "twin/core.h"
#include "twin/types.h"
#include "twin/tensor.h"
#include "twin/cube.h"
#include "twin/vector.h"
#include "twin/sync.h"

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*

// Global, as in the real headers (impl/basic_api/utils/kernel_utils_macros.h).
enum KernelMetaType : uint8_t {
    KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIV_1_0, KERNEL_TYPE_MIX_AIC_1_0,
    KERNEL_TYPE_MIX_AIC_1_1, KERNEL_TYPE_MIX_AIC_1_2
};

namespace AscendC {

enum { MIX = 0, AIC = 1, AIV = 2 };

inline int64_t GetBlockIdx() { return twin::Core().blockIdx; }
inline int64_t GetBlockNum() { return twin::Core().blockNum; }
inline int64_t GetSubBlockIdx() { return twin::Core().subBlockIdx; }
inline int64_t GetTaskRation() { return twin::Core().type == twin::CoreType::AIV ? 2 : 1; }

// The NPU places the user workspace after the system workspace the host reserves
// (PlatformAscendC::GetLibApiWorkSpaceSize, 16 MiB on 910B); the twin does the same.
constexpr uint64_t kSystemWorkspaceBytes = 16 * 1024 * 1024;
inline GM_ADDR GetUserWorkspace(GM_ADDR workspace) { return workspace + kSystemWorkspaceBytes; }

}  // namespace AscendC

#define ASCEND_IS_AIC (::twin::Core().type == ::twin::CoreType::AIC)
#define ASCEND_IS_AIV (::twin::Core().type == ::twin::CoreType::AIV)
#define KERNEL_TASK_TYPE_DEFAULT(value) \
    (::twin::Core().mixDeclared = ((value) == ::KERNEL_TYPE_MIX_AIC_1_2))
#define REGISTER_TILING_DEFAULT(tiling_struct)
#define GET_TILING_DATA_WITH_STRUCT(tiling_struct, tiling_data, tiling_arg)                     \
    tiling_struct tiling_data;                                                                  \
    ::twin::CheckGm(tiling_arg, sizeof(tiling_struct), {__FILE__, __LINE__}, "tiling data");    \
    std::memcpy(&tiling_data, tiling_arg, sizeof(tiling_struct))
#define TILING_KEY_IS(key) (::twin::TilingKey() == (key))

#endif
