// Generated from op_project/flash_cann_ops.yaml by `python -m flash_cann.ascend.contract_header`;
// do not edit (tests/test_spec.py fails while this file is out of date).
#ifndef FLASH_CANN_CONTRACT_H
#define FLASH_CANN_CONTRACT_H

#include <cstddef>
#include <cstdint>

namespace flash_cann {
namespace contract {

constexpr int64_t kHeadDimMin = 1;
constexpr int64_t kHeadDimMax = 256;

// Values of the layout attribute, in spec order.
constexpr uint32_t kLayoutBNSD = 0;
constexpr uint32_t kLayoutBSND = 1;
constexpr uint32_t kLayoutTND = 2;
constexpr const char* kLayoutNames[] = {"BNSD", "BSND", "TND"};
constexpr size_t kLayoutCount = 3;

// The dtypes the NPU backend computes, in spec order.
constexpr uint32_t kDTypeFloat16 = 0;
constexpr uint32_t kDTypeBfloat16 = 1;

// FlashCannAttention
namespace fwd {
namespace input {
enum Index : size_t {
    kQuery = 0,
    kKey = 1,
    kValue = 2,
    kKeyPaddingMask = 3,
    kCuSeqlensQ = 4,
    kCuSeqlensK = 5,
    kAlibiSlopes = 6,
    kRngState = 7,
    kSinks = 8,
};
constexpr size_t kCount = 9;
}  // namespace input
namespace attr {
enum Index : size_t {
    kScale = 0,
    kCausal = 1,
    kLayout = 2,
    kMaxSeqlenQ = 3,
    kMaxSeqlenK = 4,
    kWindowLeft = 5,
    kWindowRight = 6,
    kSoftcap = 7,
    kDropoutP = 8,
    kFp16Scores = 9,
};
constexpr size_t kCount = 10;
}  // namespace attr
namespace output {
enum Index : size_t {
    kOut = 0,
    kSoftmaxLse = 1,
};
constexpr size_t kCount = 2;
}  // namespace output
}  // namespace fwd

// FlashCannAttentionGrad
namespace bwd {
namespace input {
enum Index : size_t {
    kGradOut = 0,
    kQuery = 1,
    kKey = 2,
    kValue = 3,
    kOut = 4,
    kSoftmaxLse = 5,
    kKeyPaddingMask = 6,
    kGradSoftmaxLse = 7,
    kCuSeqlensQ = 8,
    kCuSeqlensK = 9,
    kAlibiSlopes = 10,
    kRngState = 11,
    kSinks = 12,
};
constexpr size_t kCount = 13;
}  // namespace input
namespace attr {
enum Index : size_t {
    kScale = 0,
    kCausal = 1,
    kLayout = 2,
    kDeterministic = 3,
    kMaxSeqlenQ = 4,
    kMaxSeqlenK = 5,
    kWindowLeft = 6,
    kWindowRight = 7,
    kSoftcap = 8,
    kDropoutP = 9,
    kFp16Scores = 10,
};
constexpr size_t kCount = 11;
}  // namespace attr
namespace output {
enum Index : size_t {
    kGradQuery = 0,
    kGradKey = 1,
    kGradValue = 2,
    kGradSinks = 3,
};
constexpr size_t kCount = 4;
}  // namespace output
}  // namespace bwd

// FlashCannAttentionKVCache
namespace fwd_kvcache {
namespace input {
enum Index : size_t {
    kQuery = 0,
    kKCache = 1,
    kVCache = 2,
    kKey = 3,
    kValue = 4,
    kCacheSeqlens = 5,
    kCacheBatchIdx = 6,
    kBlockTable = 7,
    kCacheLeftpad = 8,
    kCuSeqlensQ = 9,
    kAlibiSlopes = 10,
    kSinks = 11,
};
constexpr size_t kCount = 12;
}  // namespace input
namespace attr {
enum Index : size_t {
    kScale = 0,
    kCausal = 1,
    kLayout = 2,
    kMaxSeqlenQ = 3,
    kWindowLeft = 4,
    kWindowRight = 5,
    kSoftcap = 6,
    kNumSplits = 7,
};
constexpr size_t kCount = 8;
}  // namespace attr
namespace output {
enum Index : size_t {
    kOut = 0,
    kSoftmaxLse = 1,
};
constexpr size_t kCount = 2;
}  // namespace output
}  // namespace fwd_kvcache

}  // namespace contract
}  // namespace flash_cann

#endif  // FLASH_CANN_CONTRACT_H
