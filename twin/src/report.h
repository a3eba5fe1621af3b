// How the twin's C ABI hands an error message to its (ctypes) caller.
#ifndef FLASH_CANN_TWIN_REPORT_H
#define FLASH_CANN_TWIN_REPORT_H

#include <cstdint>
#include <cstring>
#include <string>

namespace twin {

// Copies `message` into the caller's buffer (truncated, NUL-terminated); returns 1, the
// C ABI's failure status.
inline int Report(const std::string& message, char* error, uint64_t capacity)
{
    if (capacity > 0) {
        std::strncpy(error, message.c_str(), capacity - 1);
        error[capacity - 1] = '\0';
    }
    return 1;
}

}  // namespace twin

#endif
