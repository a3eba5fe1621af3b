// TEST-ONLY stand-in; see ../../cann_host_stub.h
#include "../../cann_host_stub.h"
