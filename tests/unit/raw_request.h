#pragma once

// For tests whose server is a plain socket: where the first whole HTTP request in the bytes read
// so far ends (its head and its Content-Length body).

#include <unistd.h>

#include <string>

namespace armada::testing {

//! The length of the first whole request in `in`, or 0 while it is not all there.
inline size_t whole_request(const std::string & in) {
    const size_t end = in.find("\r\n\r\n");
    if (end == std::string::npos) return 0;
    size_t len = 0;
    if (auto p = in.find("Content-Length: "); p != std::string::npos && p < end) len = std::stoul(in.substr(p + 16));
    return in.size() >= end + 4 + len ? end + 4 + len : 0;
}

//! Reads one request from `fd`; false on EOF first.
inline bool read_request(int fd) {
    std::string in;
    char b[4096];
    while (whole_request(in) == 0) {
        const ssize_t n = ::read(fd, b, sizeof b);
        if (n <= 0) return false;
        in.append(b, size_t(n));
    }
    return true;
}

}  // namespace armada::testing
