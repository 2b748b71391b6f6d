#pragma once

#include "api/rate_limit.h"

#include <string>
#include <utility>
#include <vector>

namespace armada::api {

//! Compares in time that depends only on the lengths, not on where the strings differ.
bool constant_time_equal(const std::string & a, const std::string & b);

//! API keys accepted by the server. Empty means authentication is off.
class ApiKeys {
  public:
    void add(const std::string & key);
    //! Reads one key per line; blank lines and lines starting with '#' are skipped. A key may be
    //! followed by its own rate limits: `sk-abc rpm=60 tpm=100000`.
    //! Returns an error message, empty on success.
    std::string load_file(const std::string & path);
    bool enabled() const { return !keys_.empty(); }
    //! Checks `Authorization: Bearer <key>` or `x-api-key: <key>`; returns the matching key or "".
    std::string check(const std::string & authorization, const std::string & x_api_key) const;

    //! Keys given their own rate limits in the key file.
    const std::vector<std::pair<std::string, RateLimits>> & limits() const { return limits_; }

  private:
    std::vector<std::string> keys_;
    std::vector<std::pair<std::string, RateLimits>> limits_;
};

}  // namespace armada::api
