// TEST-ONLY stand-in of the toolkit's include/version/cann_version.h: CANN_VERSION_NUM is
// the release the recording stand-in (../cann_host_stub.h) presents, set by
// tests/cann_host/CMakeLists.txt (one driver per release).
#ifndef FLASH_CANN_TEST_CANN_VERSION_H
#define FLASH_CANN_TEST_CANN_VERSION_H
#ifndef FLASH_CANN_STUB_CANN_VERSION_NUM
#error "tests/cann_host: FLASH_CANN_STUB_CANN_VERSION_NUM names the CANN release the stand-in presents"
#endif
#define CANN_VERSION_NUM FLASH_CANN_STUB_CANN_VERSION_NUM
#endif
