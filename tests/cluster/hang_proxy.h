#pragma once
// A TCP proxy for tests of a dependency that hangs: it forwards both ways until `hang()`, then
// keeps every connection open and moves no byte (new connections are accepted and left
// unanswered), as a server that stops without closing, or a network that drops packets, would.
// `resume()` forwards again, what was held included.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

class HangProxy {
  public:
    //! Forwards 127.0.0.1:port() to 127.0.0.1:`target_port`.
    explicit HangProxy(int target_port) : target_(target_port) {
        ls_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t n = sizeof a;
        if (::bind(ls_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 && ::listen(ls_, 64) == 0 &&
            ::getsockname(ls_, reinterpret_cast<sockaddr *>(&a), &n) == 0)
            port_ = ntohs(a.sin_port);
        acceptor_ = std::thread([this] { accept_loop(); });
    }
    ~HangProxy() {
        stop_ = true;
        ::shutdown(ls_, SHUT_RDWR);
        ::close(ls_);
        acceptor_.join();
        std::vector<std::thread> pumps;
        {
            std::lock_guard lk(mu_);
            pumps.swap(pumps_);
        }
        for (auto & t : pumps)
            t.join();
    }
    int port() const { return port_; }
    void hang() { hung_ = true; }
    void resume() { hung_ = false; }

  private:
    void accept_loop() {
        while (!stop_) {
            const int c = ::accept(ls_, nullptr, nullptr);
            if (c < 0) return;
            const int u = ::socket(AF_INET, SOCK_STREAM, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            a.sin_port = htons(uint16_t(target_));
            if (::connect(u, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
                ::close(u);
                ::close(c);
                continue;
            }
            std::lock_guard lk(mu_);
            pumps_.emplace_back([this, c, u] { pump(c, u); });
        }
    }
    //! Moves bytes between the two sockets while not hung; ends when either side closes.
    void pump(int a, int b) {
        char buf[16384];
        while (!stop_) {
            if (hung_) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                continue;
            }
            pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
            if (::poll(p, 2, 50) <= 0) continue;
            if (hung_) continue;
            bool closed = false;
            for (int i = 0; i < 2 && !closed; ++i) {
                if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
                if (n <= 0) {
                    closed = true;
                    break;
                }
                const int to = i == 0 ? b : a;
                for (ssize_t off = 0; off < n;) {
                    const ssize_t w = ::write(to, buf + off, size_t(n - off));
                    if (w <= 0) {
                        closed = true;
                        break;
                    }
                    off += w;
                }
            }
            if (closed) break;
        }
        ::close(a);
        ::close(b);
    }

    int target_, ls_ = -1, port_ = 0;
    std::atomic<bool> stop_{false}, hung_{false};
    std::mutex mu_;
    std::vector<std::thread> pumps_;
    std::thread acceptor_;
};
