#pragma once

// A stand-in node for tests of what the gateway sends: it listens on a loopback port, parses
// every request that arrives on each connection (Beast's parser, over the raw bytes), records
// it, and answers. After an answer that is not 2xx it owes a second, unasked answer on the same
// connection: a gateway that reused that connection would read it as the next request's reply: it is written just
// before the answer to the next request on that connection, as a node would answer a second request smuggled behind the
// first. Every answer's body names the request it answers ("req-N"), so a caller can tell.

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace armada::testing {

class StandinNode {
  public:
    struct Seen {
        uint64_t serial = 0;
        int connection = 0;
        std::string method, target;
        std::vector<std::pair<std::string, std::string>> headers;
        std::string body;
    };

    StandinNode() {
        ls_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof a;
        if (ls_ < 0 || ::bind(ls_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(ls_, 64) != 0 ||
            ::getsockname(ls_, reinterpret_cast<sockaddr *>(&a), &al) != 0)
            return;
        base_ = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
        acceptor_ = std::thread([this] { accept_loop(); });
    }
    ~StandinNode() {
        stop_ = true;
        ::shutdown(ls_, SHUT_RDWR);
        if (acceptor_.joinable()) acceptor_.join();
        {
            std::lock_guard lk(mu_);
            for (int fd : fds_)
                ::shutdown(fd, SHUT_RDWR);
        }
        while (active_.load() > 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ::close(ls_);
    }
    StandinNode(const StandinNode &) = delete;
    StandinNode & operator=(const StandinNode &) = delete;

    const std::string & base() const { return base_; }
    //! The status the next requests get, in turn (default 200 only).
    void statuses(std::vector<int> s) {
        std::lock_guard lk(mu_);
        statuses_ = std::move(s);
    }
    std::vector<Seen> seen() {
        std::lock_guard lk(mu_);
        return seen_;
    }
    size_t count() {
        std::lock_guard lk(mu_);
        return seen_.size();
    }
    int connections() const { return connections_.load(); }
    //! Waits (bounded) until `n` requests have been recorded; the count then.
    size_t wait_for(size_t n, int ms = 2000) {
        for (int i = 0; i < ms / 5 && count() < n; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return count();
    }

  private:
    void accept_loop() {
        while (!stop_) {
            const int c = ::accept(ls_, nullptr, nullptr);
            if (c < 0) return;
            const int id = ++connections_;
            std::lock_guard lk(mu_);
            fds_.push_back(c);
            ++active_;
            std::thread([this, c, id] {
                serve(c, id);
                --active_;
            }).detach();
        }
    }
    void serve(int fd, int conn) {
        namespace http = boost::beast::http;
        boost::beast::flat_buffer buf;
        std::string stray;  // an answer owed on this connection (see below)
        for (;;) {
            http::request_parser<http::string_body> p;
            p.body_limit(64u << 20);
            p.header_limit(1u << 20);
            boost::beast::error_code ec;
            // Feed raw bytes until one request is whole.
            while (!p.is_done()) {
                if (buf.size() > 0) {
                    const size_t used = p.put(buf.data(), ec);
                    buf.consume(used);
                    if (ec == http::error::need_more) ec = {};
                    if (ec) break;
                    if (p.is_done()) break;
                    if (used > 0) continue;
                }
                char tmp[8192];
                const ssize_t n = ::read(fd, tmp, sizeof tmp);
                if (n <= 0) {
                    if (n == 0 && p.got_some()) p.put_eof(ec);
                    if (!p.is_done()) return close_fd(fd);
                    break;
                }
                auto b = buf.prepare(size_t(n));
                std::memcpy(b.data(), tmp, size_t(n));
                buf.commit(size_t(n));
            }
            if (ec || !p.is_done()) return close_fd(fd);
            auto msg = p.release();
            Seen s;
            s.connection = conn;
            s.method = std::string(msg.method_string());
            s.target = std::string(msg.target());
            for (const auto & f : msg)
                s.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
            s.body = msg.body();
            int status = 200;
            {
                std::lock_guard lk(mu_);
                s.serial = ++serial_;
                if (!statuses_.empty()) status = statuses_[(s.serial - 1) % statuses_.size()];
                seen_.push_back(s);
            }
            const std::string body = "req-" + std::to_string(s.serial);
            std::string out = "HTTP/1.1 " + std::to_string(status) +
                              " X\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
                              "\r\n\r\n" + body;
            // The answer owed from an earlier refusal goes first: what a node would send for a
            // request smuggled in behind the refused one, read by whoever asks next on this connection.
            out = stray + out;
            stray.clear();
            if (status < 200 || status >= 300) {
                const std::string b = "stray-" + std::to_string(s.serial);
                stray = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(b.size()) +
                        "\r\n\r\n" + b;
            }
            if (::write(fd, out.data(), out.size()) < 0) return close_fd(fd);
        }
    }
    void close_fd(int fd) {
        std::lock_guard lk(mu_);
        ::shutdown(fd, SHUT_RDWR);
        std::erase(fds_, fd);
        ::close(fd);
    }

    int ls_ = -1;
    std::string base_;
    std::atomic<bool> stop_{false};
    std::atomic<int> connections_{0};
    std::thread acceptor_;
    std::mutex mu_;
    std::vector<int> fds_;        // mu_
    std::atomic<int> active_{0};  // connection threads running
    std::vector<Seen> seen_;      // mu_
    std::vector<int> statuses_;   // mu_
    uint64_t serial_ = 0;         // mu_
};

}  // namespace armada::testing
