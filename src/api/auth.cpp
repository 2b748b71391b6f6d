#include "api/auth.h"

#include <fstream>

namespace armada::api {

bool constant_time_equal(const std::string & a, const std::string & b) {
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= static_cast<unsigned char>(x ^ y);
    }
    return diff == 0;
}

void ApiKeys::add(const std::string & key) {
    if (!key.empty()) keys_.push_back(key);
}

std::string ApiKeys::load_file(const std::string & path) {
    std::ifstream f(path);
    if (!f) return "cannot read API key file " + path;
    std::string line;
    while (std::getline(f, line)) {
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
            line.pop_back();
        if (line.empty() || line[0] == '#') continue;
        add(line);
    }
    return {};
}

std::string ApiKeys::check(const std::string & authorization, const std::string & x_api_key) const {
    std::string presented = x_api_key;
    static const std::string bearer = "Bearer ";
    if (authorization.size() > bearer.size() && authorization.compare(0, bearer.size(), bearer) == 0) {
        presented = authorization.substr(bearer.size());
    }
    if (presented.empty()) return {};
    std::string match;
    // Every key is compared, so timing does not reveal which one matched.
    for (const auto & k : keys_) {
        if (constant_time_equal(k, presented)) match = k;
    }
    return match;
}

}  // namespace armada::api
