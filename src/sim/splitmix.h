#pragma once

#include <cstdint>

namespace armada::sim {

//! splitmix64: a small, fast seeded generator whose stream is the same on every machine (the
//! standard library's distributions are not). Used where a seed must replay exactly.
struct SplitMix64 {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
};

}  // namespace armada::sim
