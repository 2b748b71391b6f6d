#include "gateway/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

using namespace armada;
using namespace std::chrono_literals;

namespace {

//! Polls `f` until it holds, for at most 10 s.
template <class F>
bool eventually(F f) {
    for (int i = 0; i < 10000; ++i) {
        if (f()) return true;
        std::this_thread::sleep_for(1ms);
    }
    return f();
}

}  // namespace

TEST(WorkerPool, AThreadThatFinishedATaskTakesTheNext) {
    gateway::WorkerPool pool;
    for (int i = 0; i < 5; ++i) {
        std::promise<void> ran;
        pool.post([&] { ran.set_value(); });
        ran.get_future().get();
        ASSERT_TRUE(eventually([&] { return pool.idle() == 1; }));
    }
    EXPECT_EQ(pool.started(), 1u);
    EXPECT_EQ(pool.threads(), 1u);
}

TEST(WorkerPool, TasksThatBlockDoNotWaitForEachOther) {
    gateway::WorkerPool pool;
    // Each task waits until all three run: with fewer threads than tasks this never ends.
    std::atomic<int> running{0};
    std::promise<void> all;
    auto all_f = all.get_future().share();
    std::atomic<int> done{0};
    for (int i = 0; i < 3; ++i) {
        pool.post([&, all_f] {
            if (++running == 3) all.set_value();
            all_f.wait();
            ++done;
        });
    }
    ASSERT_EQ(all_f.wait_for(10s), std::future_status::ready);
    ASSERT_TRUE(eventually([&] { return done == 3 && pool.idle() == 3; }));
    EXPECT_EQ(pool.started(), 3u);
    // Three idle threads: three more tasks start no new one.
    std::atomic<int> more{0};
    for (int i = 0; i < 3; ++i)
        pool.post([&] { ++more; });
    ASSERT_TRUE(eventually([&] { return more == 3; }));
    EXPECT_EQ(pool.started(), 3u);
}

TEST(WorkerPool, AnIdleThreadEndsAfterItsIdleTime) {
    gateway::WorkerPool pool(50ms);
    std::promise<void> ran;
    pool.post([&] { ran.set_value(); });
    ran.get_future().get();
    EXPECT_TRUE(eventually([&] { return pool.threads() == 0; }));
    // The next task gets a new thread.
    std::promise<void> again;
    pool.post([&] { again.set_value(); });
    again.get_future().get();
    EXPECT_EQ(pool.started(), 2u);
}

TEST(WorkerPool, DestroyingItWaitsForTheTasksRunning) {
    std::atomic<bool> finished{false};
    std::promise<void> started;
    {
        gateway::WorkerPool pool;
        pool.post([&] {
            started.set_value();
            std::this_thread::sleep_for(100ms);
            finished = true;
        });
        started.get_future().get();
    }
    EXPECT_TRUE(finished.load());
}
