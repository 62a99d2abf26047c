// src/meshtrain/core/system.h — facts about the machine this rank runs on.
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain {

/// Memory the kernel reports as available for new allocations without swapping
/// (MemAvailable of /proc/meminfo), in bytes; 0 when it cannot be read.
std::int64_t available_memory_bytes();

/// This machine's host name (gethostname); "localhost" when it cannot be read.
std::string host_name();

}  // namespace meshtrain
