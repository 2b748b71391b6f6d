#pragma once

#include "store/store.h"

#include <boost/asio/any_io_executor.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace armada::api {

//! Whether the store takes a write now, for /readyz: a probe row is committed (at most once per
//! `min_interval_ms`, however often the probe is asked, since it needs no key), and the answer is
//! "" when it was durable within `timeout_ms`, else why not. Thread-safe.
class StoreReadiness {
  public:
    StoreReadiness(store::Store & store, boost::asio::any_io_executor io, int min_interval_ms = 1000,
                   int timeout_ms = 2000)
        : store_(store), io_(std::move(io)), min_interval_ms_(min_interval_ms), timeout_ms_(timeout_ms) {}

    //! `answer` runs once, on the store's thread, an I/O thread or this one.
    void check(std::function<void(std::string)> answer);

  private:
    //! Shared with callbacks that may outlive this object (a probe in flight at shutdown).
    struct Last {
        std::mutex mu;
        int64_t at_ms = INT64_MIN / 2;  // guarded by mu
        std::string why;                // guarded by mu
    };
    store::Store & store_;
    boost::asio::any_io_executor io_;
    int min_interval_ms_, timeout_ms_;
    std::shared_ptr<Last> last_ = std::make_shared<Last>();
};

}  // namespace armada::api
