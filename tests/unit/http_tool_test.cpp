// HTTP tool calls on I/O threads shared by many calls, against a plain socket server whose
// answers arrive just around each call's deadline.
#include "tools/http_tool.h"

#include "raw_request.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace net = boost::asio;

//! A socket listening on a free loopback port (its fd in `ls`, -1 on failure); its port.
int listen_loopback(int & ls) {
    ls = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(ls, 256) != 0 ||
        ::getsockname(ls, reinterpret_cast<sockaddr *>(&a), &al) != 0) {
        if (ls >= 0) ::close(ls);
        ls = -1;
        return 0;
    }
    return ntohs(a.sin_port);
}

using armada::testing::read_request;

//! An SSRF guard that lets the calls reach the loopback servers of these tests.
armada::tools::SsrfGuard loopback_guard() {
    armada::tools::SsrfGuard guard;
    armada::tools::Cidr loop;
    EXPECT_TRUE(armada::tools::parse_cidr("127.0.0.1/32", loop));
    guard.allow(loop);
    return guard;
}

}  // namespace

// Answers come from half the deadline to one and a half times it, so deadlines and answers
// land together, on two I/O threads: a deadline closes the socket as the read that got the
// answer finishes. Every
// call must still end exactly once, and nothing may crash (before each call ran on a strand of
// its own, this crashed in Asio's reactor now and then, and ThreadSanitizer reported the race).
TEST(HttpTool, DeadlinesThatRaceTheirAnswersOnTwoThreadsEndEachCallOnce) {
    int ls = -1;
    const int port = listen_loopback(ls);
    ASSERT_GE(ls, 0);
    constexpr int kCalls = 200;
    constexpr int kTimeoutMs = 100;

    std::mutex mu;
    std::vector<std::thread> answering;
    std::thread acceptor([&] {
        std::mt19937 rng(7);
        for (int i = 0; i < kCalls; ++i) {
            const int c = ::accept(ls, nullptr, nullptr);
            if (c < 0) return;
            const int delay_us = int(rng() % 100000) + 50000;  // 50..150 ms
            std::lock_guard lk(mu);
            answering.emplace_back([c, delay_us] {
                if (read_request(c)) {
                    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
                    const std::string r = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";
                    (void)!::write(c, r.data(), r.size());
                }
                ::close(c);
            });
        }
    });

    net::io_context ioc;
    auto work = net::make_work_guard(ioc);
    std::vector<std::thread> io;
    for (int i = 0; i < 2; ++i)
        io.emplace_back([&] { ioc.run(); });

    armada::tools::HttpToolTransport transport(ioc.get_executor(), loopback_guard());
    armada::tools::HttpToolSpec spec;
    spec.name = "race";
    spec.url = "http://127.0.0.1:" + std::to_string(port) + "/race";
    spec.timeout_ms = kTimeoutMs;

    std::atomic<int> ended{0}, answered{0}, timed_out{0};
    std::vector<std::atomic<int>> ends(kCalls);
    for (int i = 0; i < kCalls; ++i) {
        armada::tools::ToolCall call;
        call.session_id = "s";
        call.name = "race";
        call.arguments = "{}";
        call.idempotency_key = "s:1:" + std::to_string(i);
        transport.call(spec, call, [&, i](armada::tools::ToolResult r) {
            ends[size_t(i)]++;
            if (!r.is_error && r.content == "ok") answered++;
            if (r.is_error && r.content.find("did not answer within") != std::string::npos) timed_out++;
            ended++;
        });
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (ended.load() < kCalls && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));

    ::shutdown(ls, SHUT_RDWR);
    acceptor.join();
    {
        std::lock_guard lk(mu);
        for (auto & t : answering)
            t.join();
    }
    work.reset();
    for (auto & t : io)
        t.join();
    ::close(ls);

    EXPECT_EQ(ended.load(), kCalls);
    for (int i = 0; i < kCalls; ++i)
        EXPECT_EQ(ends[size_t(i)].load(), 1) << "call " << i;
    // Each ended as an answer or as a deadline, nothing else.
    EXPECT_EQ(answered.load() + timed_out.load(), kCalls);
    std::printf("answered %d, timed out %d\n", answered.load(), timed_out.load());
}

// A retry goes out only while the caller allows it; otherwise the call comes back unsent, for the
// caller to send again once it knows the session is still its own (a node stopped past its lease
// may have lost it, and its next node sends the call).
TEST(HttpTool, ARetryTheCallerDoesNotAllowComesBackUnsent) {
    int ls = -1;
    const int port = listen_loopback(ls);
    ASSERT_GE(ls, 0);
    std::atomic<int> requests{0};
    std::thread server([&] {
        for (int i = 0; i < 3; ++i) {
            const int c = ::accept(ls, nullptr, nullptr);
            if (c < 0) return;
            if (read_request(c)) {
                const int n = ++requests;
                const std::string r =
                    n < 3 ? "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n"
                          : "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";
                (void)!::write(c, r.data(), r.size());
            }
            ::close(c);
        }
    });
    net::io_context ioc;
    auto work = net::make_work_guard(ioc);
    std::thread io([&] { ioc.run(); });

    armada::tools::HttpToolTransport transport(ioc.get_executor(), loopback_guard());
    armada::tools::HttpToolSpec spec;
    spec.name = "held";
    spec.url = "http://127.0.0.1:" + std::to_string(port) + "/held";
    spec.timeout_ms = 5000;
    spec.retries = 2;

    std::atomic<bool> allowed{false};
    std::atomic<int> asked{0};
    std::atomic<bool> ended{false};
    armada::tools::ToolResult result;
    armada::tools::ToolCall call;
    call.session_id = "s";
    call.name = "held";
    call.arguments = "{}";
    call.idempotency_key = "s:1:0";
    // Asked before each attempt's bytes go: the first time yes (as the node's own check just
    // said), then what `allowed` says.
    call.may_send = [&] { return asked.fetch_add(1) == 0 || allowed.load(); };
    transport.call(spec, call, [&](armada::tools::ToolResult r) {
        result = std::move(r);
        ended = true;
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!ended.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(ended.load());
    EXPECT_TRUE(result.not_sent) << result.content;
    EXPECT_EQ(result.attempts, 1);
    EXPECT_EQ(asked.load(), 2);  // before the first attempt's bytes, and before the retry
    EXPECT_EQ(requests.load(), 1);

    // Allowed, the retry goes out and the call ends with the tool's answer.
    allowed = true;
    ended = false;
    transport.call(spec, call, [&](armada::tools::ToolResult r) {
        result = std::move(r);
        ended = true;
    });
    while (!ended.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(ended.load());
    EXPECT_FALSE(result.not_sent);
    EXPECT_FALSE(result.is_error) << result.content;
    EXPECT_EQ(result.content, "ok");
    EXPECT_EQ(result.attempts, 2);
    EXPECT_EQ(requests.load(), 3);

    ::shutdown(ls, SHUT_RDWR);  // a server still waiting for a request gives up
    server.join();
    work.reset();
    io.join();
    ::close(ls);
}

TEST(HttpTool, AnAttemptWhoseNodeLostItsLeaseBeforeTheBytesWentIsNotSent) {
    // The node checked its lease, then was stopped (SIGSTOP, starved) before the request went
    // out; it wakes with its lease gone, and another node may have sent this call meanwhile.
    int ls = -1;
    const int port = listen_loopback(ls);
    ASSERT_GE(ls, 0);
    std::atomic<int> requests{0};
    std::thread server([&] {
        const int c = ::accept(ls, nullptr, nullptr);
        if (c < 0) return;
        if (read_request(c)) ++requests;
        ::close(c);
    });
    net::io_context ioc;
    auto work = net::make_work_guard(ioc);
    std::thread io([&] { ioc.run(); });
    armada::tools::HttpToolTransport transport(ioc.get_executor(), loopback_guard());
    armada::tools::HttpToolSpec spec;
    spec.name = "late";
    spec.url = "http://127.0.0.1:" + std::to_string(port) + "/late";
    spec.timeout_ms = 2000;
    armada::tools::ToolCall call;
    call.session_id = "s";
    call.name = "late";
    call.arguments = "{}";
    call.idempotency_key = "s:1:0";
    call.may_send = [] { return false; };  // by the time the bytes would go
    std::atomic<bool> ended{false};
    armada::tools::ToolResult result;
    transport.call(spec, call, [&](armada::tools::ToolResult r) {
        result = std::move(r);
        ended = true;
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!ended.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(ended.load());
    EXPECT_TRUE(result.not_sent) << result.content;
    ::shutdown(ls, SHUT_RDWR);
    server.join();
    EXPECT_EQ(requests.load(), 0) << "no byte of the request may reach the tool";
    work.reset();
    io.join();
    ::close(ls);
}
