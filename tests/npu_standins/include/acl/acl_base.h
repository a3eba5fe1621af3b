// TEST-ONLY stand-in for CANN's acl/acl_base.h (shipped by torch_npu under
// include/third_party/acl/inc): just the declarations framework/csrc uses, with CANN's
// public values. Lets CI compile the extension without CANN; it is not CANN.
#pragma once

typedef void *aclrtStream;

typedef enum {
  ACL_DT_UNDEFINED = -1,
  ACL_FLOAT = 0,
  ACL_FLOAT16 = 1,
  ACL_BOOL = 12,
  ACL_BF16 = 27,
} aclDataType;

typedef enum {
  ACL_FORMAT_UNDEFINED = -1,
  ACL_FORMAT_NCHW = 0,
  ACL_FORMAT_NHWC = 1,
  ACL_FORMAT_ND = 2,
  ACL_FORMAT_FRACTAL_NZ = 29,
  ACL_FORMAT_NCDHW = 30,
  ACL_FORMAT_NCL = 47,
} aclFormat;
