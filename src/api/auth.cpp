#include "api/auth.h"

#include <fstream>
#include <sstream>

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
    int n = 0;
    while (std::getline(f, line)) {
        ++n;
        std::istringstream words(line);
        std::string key, opt;
        if (!(words >> key) || key[0] == '#') continue;
        RateLimits lim;
        bool has_limits = false;
        while (words >> opt) {
            const auto eq = opt.find('=');
            const std::string name = opt.substr(0, eq);
            double v = -1;
            if (eq != std::string::npos) {
                try {
                    size_t used = 0;
                    v = std::stod(opt.substr(eq + 1), &used);
                    if (used != opt.size() - eq - 1) v = -1;
                } catch (const std::exception &) {
                    v = -1;
                }
            }
            if ((name != "rpm" && name != "tpm") || !(v >= 0)) {
                return path + ":" + std::to_string(n) + ": expected 'rpm=N' or 'tpm=N' after the key, got '" + opt +
                       "'";
            }
            (name == "rpm" ? lim.requests_per_min : lim.tokens_per_min) = v;
            has_limits = true;
        }
        add(key);
        if (has_limits) limits_.emplace_back(key, lim);
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
