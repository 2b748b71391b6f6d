#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace armada::gateway {

//! Threads for blocking work (a request relayed to a node or a pool), kept for reuse. A task goes
//! to an idle thread when there is one, else to a new thread: a slow task never waits behind
//! another, as with a thread per task, but a busy gateway no longer creates and frees a thread
//! (its stack) per request. A thread idle for `idle` ends, so a burst does not keep its threads.
class WorkerPool {
  public:
    //! `max_threads` bounds the threads alive at once (0: no bound); a task beyond it is refused.
    explicit WorkerPool(std::chrono::milliseconds idle = std::chrono::seconds(30), size_t max_threads = 0)
        : idle_for_(idle), max_threads_(max_threads) {}
    WorkerPool(const WorkerPool &) = delete;
    WorkerPool & operator=(const WorkerPool &) = delete;

    //! Waits for the tasks running to end; idle threads end at once.
    ~WorkerPool() {
        std::unique_lock lk(mu_);
        stop_ = true;
        cv_.notify_all();
        gone_.wait(lk, [&] { return threads_ == 0; });
    }

    //! Throws std::system_error when no thread can be started, and Full when every thread is
    //! busy and there are `max_threads` of them (the task is then dropped).
    struct Full : std::runtime_error {
        Full() : std::runtime_error("every worker thread is busy") {}
    };
    void post(std::function<void()> task) {
        std::lock_guard lk(mu_);
        // Every queued task has an idle thread of its own waiting for it.
        if (idle_ > tasks_.size()) {
            tasks_.push_back(std::move(task));
            cv_.notify_one();
            return;
        }
        if (max_threads_ > 0 && threads_ >= max_threads_) throw Full();
        // Counted once it exists: a thread that could not be started would otherwise stay
        // counted, and the destructor wait for it forever. It takes mu_ only after its task.
        std::thread th([this, t = std::move(task)]() mutable { loop(std::move(t)); });
        ++threads_;
        ++started_;
        th.detach();
    }

    //! Threads alive (busy or idle), idle ones, and threads started in all (tests, metrics).
    size_t threads() const {
        std::lock_guard lk(mu_);
        return threads_;
    }
    size_t idle() const {
        std::lock_guard lk(mu_);
        return idle_;
    }
    size_t started() const {
        std::lock_guard lk(mu_);
        return started_;
    }

  private:
    void loop(std::function<void()> task) {
        for (;;) {
            task();
            task = nullptr;
            std::unique_lock lk(mu_);
            ++idle_;
            cv_.wait_for(lk, idle_for_, [&] { return stop_ || !tasks_.empty(); });
            --idle_;
            if (tasks_.empty()) {
                --threads_;
                gone_.notify_all();
                return;
            }
            task = std::move(tasks_.front());
            tasks_.pop_front();
        }
    }

    const std::chrono::milliseconds idle_for_;
    const size_t max_threads_;
    mutable std::mutex mu_;
    std::condition_variable cv_, gone_;
    std::deque<std::function<void()>> tasks_;  // mu_
    size_t idle_ = 0, threads_ = 0, started_ = 0;
    bool stop_ = false;
};

}  // namespace armada::gateway
