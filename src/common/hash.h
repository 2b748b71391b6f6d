#pragma once

// FNV-1a, 64 bits: a small, stable hash of bytes for names that must come out the same in every
// process and every release (account ids from keys, a data directory's database, a
// conversation's affinity key, rendezvous picks). Not for anything an attacker must not forge.

#include <cstdint>
#include <string_view>

namespace armada::common {

inline uint64_t fnv1a64(std::string_view s) {
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ULL;
    }
    return h;
}

}  // namespace armada::common
