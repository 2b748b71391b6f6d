#include "cluster/hang_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

namespace armada::cluster {

HangProxy::HangProxy(int target_port) : target_(target_port) {
    ls_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (ls_ >= 0 && ::bind(ls_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 && ::listen(ls_, 256) == 0 &&
        ::getsockname(ls_, reinterpret_cast<sockaddr *>(&a), &n) == 0)
        port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
}

HangProxy::~HangProxy() {
    stop_ = true;
    ::shutdown(ls_, SHUT_RDWR);
    ::close(ls_);
    acceptor_.join();
    // Each pump notices the stop within its poll's 50 ms.
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return pumps_ == 0; });
}

void HangProxy::accept_loop() {
    while (!stop_) {
        const int c = ::accept4(ls_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) {
            if (stop_) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));  // EMFILE and the like
            continue;
        }
        const int u = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(uint16_t(target_));
        if (u < 0 || ::connect(u, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
            if (u >= 0) ::close(u);
            ::close(c);  // the server is down: the client sees its connection refused, as it would
            continue;
        }
        {
            std::lock_guard lk(mu_);
            ++pumps_;
        }
        std::thread([this, c, u] { pump(c, u); }).detach();
    }
}

void HangProxy::pump(int a, int b) {
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
                const ssize_t w = ::send(to, buf + off, size_t(n - off), MSG_NOSIGNAL);
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
    std::lock_guard lk(mu_);
    if (--pumps_ == 0) cv_.notify_all();
}

}  // namespace armada::cluster
