// What differs in CANN's host API between the toolkit releases flash-cann targets (8.x and
// 9.x), in one place, selected by CANN's version macro (framework/csrc/torch_npu_compat.h
// does the same for torch_npu, by detection: torch_npu has no version macro).
//
// The version: FLASH_CANN_CANN_VERSION_NUM if given (-D), else CANN_VERSION_NUM from the
// toolkit's <CANN>/include/version/cann_version.h when the include path has it, else 0:
// the 8.x names, which every release declares so far (9.x keeps them as deprecated
// aliases). CANN_VERSION_NUM is major * 10000000 + minor * 100000 + patch * 1000 (8.5.0 is
// 80500000, 9.0.0 is 90000000: hicann/hccl reads it so in its CMake, and Huawei's op sources
// test `CANN_VERSION_NUM >= 90000000` for 9.x, e.g. hicann/ops-transformer
// mc2/moe_distribute_combine_v2/op_host/op_tiling/arch35/).
//
// Differences, with the public headers they were read in:
// - The number of blocks a launch runs on: gert::TilingContext::SetBlockDim in CANN 8.x
//   (Ascend/metadef inc/external/exe_graph/runtime/tiling_context.h, its only setter);
//   SetSimdNumBlocks in 9.x, where SetBlockDim is a deprecated alias of it, "to be
//   deleted" (hicann/metadef, the same file).
#ifndef FLASH_CANN_CANN_COMPAT_H
#define FLASH_CANN_CANN_COMPAT_H

#include <cstdint>

#include "register/op_def_registry.h"

#ifndef FLASH_CANN_CANN_VERSION_NUM
#if defined(__has_include)
#if __has_include("version/cann_version.h")
#include "version/cann_version.h"
#endif
#endif
#ifdef CANN_VERSION_NUM
#define FLASH_CANN_CANN_VERSION_NUM CANN_VERSION_NUM
#else
#define FLASH_CANN_CANN_VERSION_NUM 0
#endif
#endif

// 1 when building against CANN 9.0 or later.
#define FLASH_CANN_CANN_9 (FLASH_CANN_CANN_VERSION_NUM >= 90000000)

namespace flash_cann {
namespace cann {

// The name of the setter SetNumBlocks calls (tests print it).
#if FLASH_CANN_CANN_9
constexpr const char* kNumBlocksApi = "SetSimdNumBlocks";
#else
constexpr const char* kNumBlocksApi = "SetBlockDim";
#endif

// The number of blocks (AI cores) the kernel launches on.
inline ge::graphStatus SetNumBlocks(gert::TilingContext* context, uint32_t blocks)
{
#if FLASH_CANN_CANN_9
    return context->SetSimdNumBlocks(blocks);
#else
    return context->SetBlockDim(blocks);
#endif
}

}  // namespace cann
}  // namespace flash_cann

#endif
