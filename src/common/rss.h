#pragma once

// A process's resident memory, as Linux reports it (VmRSS in /proc/PID/status), for benches and
// tests that watch memory.

#include <cstdint>
#include <fstream>
#include <string>

namespace armada::common {

//! Resident bytes of process `pid` (0: this one); 0 when it cannot be read.
inline uint64_t rss_bytes(int pid = 0) {
    std::ifstream f(pid > 0 ? "/proc/" + std::to_string(pid) + "/status" : std::string("/proc/self/status"));
    std::string k;
    while (f >> k) {
        if (k == "VmRSS:") {
            uint64_t kb = 0;
            f >> kb;
            return kb * 1024;
        }
        std::string rest;
        std::getline(f, rest);
    }
    return 0;
}

}  // namespace armada::common
