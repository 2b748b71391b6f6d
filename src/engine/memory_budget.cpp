#include "engine/memory_budget.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

namespace armada::engine {

namespace {
std::optional<uint64_t> read_number(const std::string & path) {
    std::ifstream f(path);
    std::string s;
    if (!(f >> s) || s == "max") return std::nullopt;
    try {
        size_t used = 0;
        const unsigned long long v = std::stoull(s, &used);
        if (used != s.size()) return std::nullopt;
        return uint64_t(v);
    } catch (...) {
        return std::nullopt;
    }
}
}  // namespace

uint64_t memory_limit(const std::string & root) {
    uint64_t total = 0;
    std::ifstream mi(root + "proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (mi >> key >> kb >> unit) {
        if (key == "MemTotal:") {
            total = kb * 1024;
            break;
        }
    }
    for (const char * p : {"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
        if (auto v = read_number(root + p); v && *v > 0 && (total == 0 || *v < total)) total = *v;
    }
    return total;
}

std::optional<uint64_t> parse_size(const std::string & text) {
    size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
        ++i;
    if (i == 0) return std::nullopt;
    double v = 0;
    try {
        size_t used = 0;
        v = std::stod(text.substr(0, i), &used);
        if (used != i) return std::nullopt;
    } catch (...) {
        return std::nullopt;
    }
    std::string u = text.substr(i);
    for (auto & c : u)
        c = char(std::tolower(static_cast<unsigned char>(c)));
    if (!u.empty() && u.back() == 'b') u.pop_back();
    if (!u.empty() && u.back() == 'i') u.pop_back();
    double mul = 1;
    if (u.empty()) {
        mul = 1;
    } else if (u == "k") {
        mul = 1024.0;
    } else if (u == "m") {
        mul = 1024.0 * 1024;
    } else if (u == "g") {
        mul = 1024.0 * 1024 * 1024;
    } else if (u == "t") {
        mul = 1024.0 * 1024 * 1024 * 1024;
    } else {
        return std::nullopt;
    }
    const double bytes = v * mul;
    if (!std::isfinite(bytes) || bytes < 0 || bytes > 1e18) return std::nullopt;
    return uint64_t(bytes);
}

std::string format_size(uint64_t bytes) {
    const char * units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    std::ostringstream ss;
    ss.precision(u == 0 ? 0 : 1);
    ss << std::fixed << v << ' ' << units[u];
    return ss.str();
}

}  // namespace armada::engine
