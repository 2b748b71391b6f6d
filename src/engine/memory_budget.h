#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace armada::engine {

//! Bytes of memory this process may use: the machine's RAM, or its cgroup's limit (v2
//! `memory.max`, v1 `memory.limit_in_bytes`) when that is lower. `root` is for tests.
uint64_t memory_limit(const std::string & root = "/");

//! "8G", "512M", "64k", "1.5GiB" or a plain byte count; nullopt when malformed.
std::optional<uint64_t> parse_size(const std::string & text);

//! "1.5 GiB"-style rendering for logs and errors.
std::string format_size(uint64_t bytes);

}  // namespace armada::engine
