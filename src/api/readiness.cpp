#include "api/readiness.h"

#include "common/clock.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <memory>

namespace armada::api {

void StoreReadiness::check(std::function<void(std::string)> answer) {
    if (auto w = store_.writable(); !w.ok) return answer(w.error);
    {
        std::lock_guard lk(last_->mu);
        if (common::steady_ms() - last_->at_ms < min_interval_ms_) return answer(last_->why);
    }
    // The first of the write and the timer answers; the timer lives on the I/O executor and is
    // only touched there.
    struct Once {
        std::atomic<bool> done{false};
        std::function<void(std::string)> fn;
    };
    auto once = std::make_shared<Once>();
    once->fn = [last = last_, answer = std::move(answer)](const std::string & why) {
        {
            std::lock_guard lk(last->mu);
            last->at_ms = common::steady_ms();
            last->why = why;
        }
        answer(why);
    };
    auto timer = std::make_shared<boost::asio::steady_timer>(io_, std::chrono::milliseconds(timeout_ms_));
    timer->async_wait([once, timer, ms = timeout_ms_](boost::system::error_code ec) {
        if (!ec && !once->done.exchange(true))
            once->fn("the store did not take a write within " + std::to_string(ms) + " ms");
    });
    store::Batch probe;
    probe.probe = true;
    store_.commit(std::move(probe), [once, timer, io = io_](store::Status s) {
        if (!once->done.exchange(true)) once->fn(s.ok ? "" : "the store refuses writes: " + s.error);
        boost::asio::post(io, [timer] { timer->cancel(); });
    });
}

}  // namespace armada::api
