// The outgoing HTTP client (net/http_client.h) against plain socket servers: what it writes, when
// it keeps a connection, redirects, and the deadline of a stream whose head comes late.
#include "net/http_client.h"
#include "raw_request.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using armada::net::HttpFailure;
using armada::net::HttpOptions;
using armada::net::HttpReply;
using armada::net::HttpRequest;

//! A loopback server that runs `answer` for each request it reads, on a connection it keeps
//! until the client closes it; it records every request whole.
class RawServer {
  public:
    using Answer = std::function<std::string(const std::string & request)>;
    explicit RawServer(Answer answer) : answer_(std::move(answer)) {
        ls_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof a;
        if (::bind(ls_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(ls_, 8) != 0 ||
            ::getsockname(ls_, reinterpret_cast<sockaddr *>(&a), &al) != 0)
            return;
        base_ = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
        thread_ = std::thread([this] { accept_loop(); });
    }
    ~RawServer() {
        ::shutdown(ls_, SHUT_RDWR);
        ::close(ls_);
        thread_.join();
        {
            // A connection the client keeps (its pool) ends here.
            std::lock_guard lk(mu_);
            for (int fd : fds_)
                ::shutdown(fd, SHUT_RDWR);
        }
        for (auto & t : conns_)
            t.join();
    }
    const std::string & base() const { return base_; }
    int accepted() const { return accepted_.load(); }
    std::vector<std::string> requests() {
        std::lock_guard lk(mu_);
        return requests_;
    }

  private:
    void accept_loop() {
        for (;;) {
            const int c = ::accept(ls_, nullptr, nullptr);
            if (c < 0) return;
            ++accepted_;
            {
                std::lock_guard lk(mu_);
                fds_.push_back(c);
            }
            conns_.emplace_back([this, c] { serve(c); });
        }
    }
    void serve(int c) {
        std::string in;
        char b[4096];
        for (;;) {
            if (const size_t whole = armada::testing::whole_request(in); whole > 0) {
                const std::string req = in.substr(0, whole);
                in.erase(0, whole);
                {
                    std::lock_guard lk(mu_);
                    requests_.push_back(req);
                }
                const std::string out = answer_(req);
                // MSG_NOSIGNAL: a client that gave up has closed its end.
                if (out.empty() || ::send(c, out.data(), out.size(), MSG_NOSIGNAL) < 0) break;
                continue;
            }
            const ssize_t n = ::read(c, b, sizeof b);
            if (n <= 0) break;
            in.append(b, size_t(n));
        }
        std::lock_guard lk(mu_);
        std::erase(fds_, c);
        ::close(c);
    }

    Answer answer_;
    int ls_ = -1;
    std::string base_;
    std::thread thread_;
    std::vector<std::thread> conns_;
    std::atomic<int> accepted_{0};
    std::mutex mu_;
    std::vector<std::string> requests_;
    std::vector<int> fds_;  // mu_: connections open
};

std::string ok(const std::string & body) {
    return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST(HttpClient, FramingIsItsOwnAndNoConnectionHeaderIsSent) {
    RawServer srv([](const std::string &) { return ok("hi"); });
    ASSERT_FALSE(srv.base().empty());
    HttpRequest r;
    r.method = "POST";
    r.url = srv.base() + "/x?y=1";
    r.body = "{}";
    // A caller's framing headers are dropped: the client writes Host and Content-Length itself.
    r.headers = {{"Content-Length", "999"}, {"Host", "evil.example"}, {"Connection", "close"}, {"X-A", "1"}};
    const HttpReply rep = armada::net::http_call(r, {});
    ASSERT_EQ(rep.status, 200) << rep.error;
    EXPECT_EQ(rep.body, "hi");
    const auto reqs = srv.requests();
    ASSERT_EQ(reqs.size(), 1u);
    const std::string & q = reqs[0];
    EXPECT_EQ(q.rfind("POST /x?y=1 HTTP/1.1\r\n", 0), 0u) << q;
    EXPECT_NE(q.find("Host: " + srv.base().substr(7) + "\r\n"), std::string::npos) << q;
    EXPECT_NE(q.find("Content-Length: 2\r\n"), std::string::npos) << q;
    EXPECT_NE(q.find("X-A: 1\r\n"), std::string::npos) << q;
    EXPECT_EQ(q.find("evil.example"), std::string::npos) << q;
    EXPECT_EQ(q.find("999"), std::string::npos) << q;
    // A proxy that keeps its own upstream connection would pass a `Connection: close` on.
    EXPECT_EQ(q.find("Connection"), std::string::npos) << q;
}

TEST(HttpClient, ABodyGoesWithAGetOnlyWhenGivenAndAHostThatCouldSplitTheRequestIsRefused) {
    RawServer srv([](const std::string &) { return ok(""); });
    HttpRequest g;
    g.url = srv.base() + "/g";
    ASSERT_EQ(armada::net::http_call(g, {}).status, 200);
    g.body = "q";
    ASSERT_EQ(armada::net::http_call(g, {}).status, 200);
    const auto reqs = srv.requests();
    ASSERT_EQ(reqs.size(), 2u);
    EXPECT_EQ(reqs[0].find("Content-Length"), std::string::npos) << reqs[0];
    EXPECT_NE(reqs[1].find("Content-Length: 1\r\n\r\nq"), std::string::npos) << reqs[1];

    HttpRequest bad;
    bad.url = "http://127.0.0.1\r\nX-Injected: 1/";
    const auto rep = armada::net::http_call(bad, {});
    EXPECT_EQ(rep.failure, HttpFailure::bad_request) << rep.error;
    EXPECT_FALSE(rep.sent);
}

TEST(HttpClient, KeptConnectionsAreNeverUsedByACallWhoseAddressesAreChecked) {
    RawServer srv([](const std::string &) { return ok("k"); });
    HttpRequest r;
    r.url = srv.base() + "/k";
    HttpOptions o;
    o.reuse = true;
    for (int i = 0; i < 3; ++i)
        ASSERT_EQ(armada::net::http_call(r, o).status, 200);
    EXPECT_EQ(srv.accepted(), 1) << "a kept connection serves the next call";
    // With an address check, every call resolves and checks again: a kept connection would skip it.
    o.admit = [](const boost::asio::ip::address &) { return std::string(); };
    for (int i = 0; i < 2; ++i)
        ASSERT_EQ(armada::net::http_call(r, o).status, 200);
    EXPECT_EQ(srv.accepted(), 3);
}

TEST(HttpClient, AFollowedRedirectIsNotOfferedAsTheAnswerAnd303DropsTheBody) {
    RawServer srv([](const std::string & q) {
        if (q.rfind("POST /from", 0) == 0)
            return std::string("HTTP/1.1 303 See Other\r\nLocation: /to\r\nContent-Length: 4\r\n\r\nmove");
        return ok("there");
    });
    HttpRequest r;
    r.method = "POST";
    r.url = srv.base() + "/from";
    r.body = "payload";
    HttpOptions o;
    o.max_redirects = 3;
    std::vector<int> heads;
    std::string streamed;
    o.on_head = [&](const HttpReply & h) {
        heads.push_back(h.status);
        return true;
    };
    o.on_chunk = [&](std::string_view piece) {
        streamed += piece;
        return true;
    };
    const auto rep = armada::net::http_call(r, o);
    ASSERT_EQ(rep.status, 200) << rep.error;
    EXPECT_EQ(heads, std::vector<int>{200});
    EXPECT_EQ(streamed, "there");
    const auto reqs = srv.requests();
    ASSERT_EQ(reqs.size(), 2u);
    EXPECT_EQ(reqs[1].rfind("GET /to HTTP/1.1", 0), 0u) << reqs[1];
    EXPECT_EQ(reqs[1].find("payload"), std::string::npos) << reqs[1];
}

TEST(HttpClient, AStreamWhoseHeadMayWaitOutlivesItsTimeoutButAnotherDoesNot) {
    // The head comes 600 ms after the request, with the first message (as etcd's watches do).
    RawServer srv([](const std::string &) {
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        return std::string("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n0\r\n\r\n");
    });
    HttpRequest r;
    r.method = "POST";
    r.url = srv.base() + "/watch";
    HttpOptions o;
    o.timeout_ms = 200;
    std::string got;
    o.on_head = [](const HttpReply &) { return true; };
    o.on_chunk = [&](std::string_view piece) {
        got += piece;
        return true;
    };
    const auto cut = armada::net::http_call(r, o);
    EXPECT_EQ(cut.failure, HttpFailure::timeout) << cut.error;
    EXPECT_TRUE(got.empty());
    o.head_may_wait = true;
    const auto waited = armada::net::http_call(r, o);
    EXPECT_TRUE(waited.error.empty()) << waited.error;
    EXPECT_EQ(waited.status, 200);
    EXPECT_EQ(got, "one");
}

TEST(HttpClient, ADownloadLargerThanItsCapIsRefusedAtItsHead) {
    RawServer srv([](const std::string &) { return ok(std::string(4096, 'x')); });
    const std::string path =
        (std::filesystem::temp_directory_path() / ("armada-dl-cap." + std::to_string(::getpid()))).string();
    std::filesystem::remove(path);
    armada::net::DownloadOptions o;
    o.max_bytes = 1000;
    const auto d = armada::net::http_download(srv.base() + "/kv", {}, path, o);
    EXPECT_NE(d.error.find("larger than 1000 bytes"), std::string::npos) << d.error;
    EXPECT_EQ(d.bytes, 0u);
    EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
