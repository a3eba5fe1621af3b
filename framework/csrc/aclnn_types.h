// The CANN aclnn declarations the extension uses.
//
// torch_npu ships CANN's acl/ headers (acl_base.h: aclrtStream, aclDataType, aclFormat)
// but not aclnn/acl_meta.h, so the aclnn side is declared here from CANN's public prototypes and
// resolved at run time from the op package's library (libcust_opapi.so links libnnopbase
// and libascendcl), as op-plugin does. The extension therefore links nothing from CANN.
#pragma once

#include <cstdint>

#include <acl/acl_base.h>

extern "C" {
typedef struct aclTensor aclTensor;
typedef struct aclOpExecutor aclOpExecutor;
}

namespace flash_cann_npu {

using aclnnStatus = int32_t;

// aclnn/acl_meta.h
using CreateTensorFn = aclTensor *(*)(const int64_t *viewDims, uint64_t viewDimsNum,
                                      aclDataType dataType, const int64_t *stride,
                                      int64_t offset, aclFormat format,
                                      const int64_t *storageDims, uint64_t storageDimsNum,
                                      void *tensorData);
using DestroyTensorFn = aclnnStatus (*)(const aclTensor *tensor);
// acl/acl.h: the calling thread's last CANN error message, cleared by reading it.
using RecentErrMsgFn = const char *(*)();
// acl/acl_rt.h: the calling thread takes the stream's resources (core control).
using UseStreamResFn = int (*)(aclrtStream stream);
// Stage 2 of every generated aclnn API.
using ExecuteFn = aclnnStatus (*)(void *workspace, uint64_t workspaceSize,
                                  aclOpExecutor *executor, aclrtStream stream);

}  // namespace flash_cann_npu
