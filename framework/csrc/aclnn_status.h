// What an aclnn status means, from the table generated out of flash_cann.backends.npu.aclnn_status
// (flash_cann_aclnn_status.h). Walks the rows as flash_cann.backends.npu.aclnn_status.describe does.
#pragma once

#include <cstdint>
#include <string>

#include "flash_cann_aclnn_status.h"

namespace flash_cann_npu {

inline std::string DescribeStatus(int32_t code) {
  for (const AclnnStatusRow &row : kAclnnStatusTable) {
    if (row.first <= code && code <= row.last) {
      return std::string(row.name) + ": " + row.meaning;
    }
  }
  return kAclnnStatusUnknown;
}

}  // namespace flash_cann_npu
