// The gateway's forwarding to a node over kept-alive connections, against a plain socket server.
#include "routing/upstream.h"

#include "raw_request.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace {

using armada::testing::read_request;

//! A socket listening on a free loopback port (its fd in `ls`, -1 on failure); its base URL.
std::string listen_loopback(int & ls) {
    ls = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(ls, 4) != 0 ||
        ::getsockname(ls, reinterpret_cast<sockaddr *>(&a), &al) != 0) {
        if (ls >= 0) ::close(ls);
        ls = -1;
        return {};
    }
    return "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

TEST(Upstream, AKeptConnectionTheNodeClosedIsNotUsedSoAPostStillGoesThrough) {
    int ls = -1;
    const std::string base = listen_loopback(ls);
    ASSERT_GE(ls, 0);

    // Each connection answers one request, keep-alive, and is then closed by the server (as a
    // node that restarted or crashed between two requests would).
    std::atomic<int> accepted{0}, closed{0};
    std::thread server([&] {
        for (int i = 0; i < 2; ++i) {
            const int c = ::accept(ls, nullptr, nullptr);
            if (c < 0) return;
            ++accepted;
            if (read_request(c)) {
                const std::string r = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok";
                (void)!::write(c, r.data(), r.size());
            }
            ::close(c);
            ++closed;
        }
    });

    auto first = armada::routing::forward(base, "POST", "/v1/x", {}, "{}", 5000);
    EXPECT_EQ(first.status, 200) << first.error;
    while (closed.load() < 1)
        std::this_thread::yield();
    auto second = armada::routing::forward(base, "POST", "/v1/x", {}, "{}", 5000);
    EXPECT_EQ(second.status, 200) << second.error;
    EXPECT_EQ(second.body, "ok");
    EXPECT_EQ(accepted.load(), 2);
    ::shutdown(ls, SHUT_RDWR);  // a server still waiting for a second connection stops
    server.join();
    ::close(ls);
}

TEST(Upstream, AServerThatAcceptsAndNeverAnswersTimesOutAtTheDeadline) {
    // The kernel accepts connections on it; whether anyone reads is up to the test.
    int ls = -1;
    const std::string base = listen_loopback(ls);
    ASSERT_GE(ls, 0);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = armada::routing::forward(base, "POST", "/v1/x", {}, "{}", 300);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.error.find("no answer within 300 ms"), std::string::npos) << r.error;
    EXPECT_GE(s, 0.25);
    EXPECT_LT(s, 5.0);
    ::close(ls);
}

TEST(Upstream, AStreamThatGoesQuietForItsIdleTimeIsCutWithAnError) {
    int ls = -1;
    const std::string base = listen_loopback(ls);
    ASSERT_GE(ls, 0);
    std::atomic<bool> done{false};
    std::thread server([&] {
        const int c = ::accept(ls, nullptr, nullptr);
        if (c < 0) return;
        if (read_request(c)) {
            const std::string head =
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                "b\r\ndata: one\n\n\r\n";
            (void)!::write(c, head.data(), head.size());
        }
        // Then nothing more, as a pool that hung mid-stream; it gives up after 4.5 s, so that
        // without an idle limit the call ends late rather than never.
        for (int i = 0; i < 225 && !done.load(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ::close(c);
    });
    std::string got;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = armada::routing::forward(
        base, "POST", "/v1/x", {}, "{}", 5000, [](const armada::routing::UpstreamReply &) { return true; },
        [&](std::string_view chunk) {
            got += chunk;
            return true;
        },
        nullptr, 300);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done = true;
    server.join();
    ::close(ls);
    EXPECT_TRUE(r.streamed);
    EXPECT_EQ(got, "data: one\n\n");
    EXPECT_NE(r.error.find("sent nothing for 300 ms"), std::string::npos) << r.error;
    EXPECT_LT(s, 4.0);  // well before the 5 s head deadline would matter
}

}  // namespace
