#pragma once

// A TCP proxy in front of a dependency, for fault injection (`armada cluster up --fault-proxies`,
// tests): it forwards both ways until `hang()`, then keeps every connection open and moves no
// byte (new connections are accepted and left unanswered), as a server that stops without
// closing, or a network that drops packets, would. `resume()` forwards again, what was held
// included.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace armada::cluster {

class HangProxy {
  public:
    //! Listens on 127.0.0.1 (any free port) and forwards to 127.0.0.1:`target_port`.
    explicit HangProxy(int target_port);
    ~HangProxy();
    HangProxy(const HangProxy &) = delete;
    HangProxy & operator=(const HangProxy &) = delete;
    //! 0 when it could not listen.
    int port() const { return port_; }
    void hang() { hung_ = true; }
    void resume() { hung_ = false; }
    bool hung() const { return hung_.load(); }

  private:
    void accept_loop();
    void pump(int a, int b);

    int target_, ls_ = -1, port_ = 0;
    std::atomic<bool> stop_{false}, hung_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    int pumps_ = 0;  // connections being forwarded (mu_)
    std::thread acceptor_;
};

}  // namespace armada::cluster
