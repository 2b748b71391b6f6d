// The HTTP front end's notice of a client that hangs up, against a real socket client.
#include "api/http_server.h"
#include "bench/http_client.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

using namespace armada;

// A handler that asks to hear of a hang-up at once (as the gateway does before forwarding) and
// answers from another thread a moment later. A client that waits for its answer must never be
// taken for gone: a wait that ends with nothing to read is not a hang-up.
TEST(HttpServer, AClientWaitingForItsAnswerIsNeverTakenForGone) {
    api::HttpConfig cfg;
    cfg.port = 0;
    std::atomic<int> gone{0};
    api::HttpServer http(cfg, [&](api::HttpRequest &&, std::shared_ptr<api::Responder> out) {
        out->on_close([&] { ++gone; });
        std::thread([out] {
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            out->send(200, "application/json", R"({"ok":true})");
        }).detach();
    });
    ASSERT_EQ(http.listen(), "");
    http.run();
    const std::string url = "http://127.0.0.1:" + std::to_string(http.port()) + "/x";
    int failed = 0;
    for (int i = 0; i < 600; ++i) {
        auto r = bench::http_call("POST", url, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})",
                                  {{"Content-Type", "application/json"}}, 5000);
        if (r.status != 200) ++failed;
    }
    http.stop();
    EXPECT_EQ(failed, 0);
    EXPECT_EQ(gone.load(), 0);
}

// A stream whose client stops reading (a browser tab asleep, a peer gone without a word) is
// closed once its backlog passes the limit, instead of queueing without end.
TEST(HttpServer, AStreamWhoseClientDoesNotReadIsClosedPastItsBacklog) {
    api::HttpConfig cfg;
    cfg.port = 0;
    cfg.max_stream_backlog = 1u << 20;
    std::atomic<bool> closed{false};
    std::atomic<size_t> written{0}, peak{0};
    std::thread writer;
    api::HttpServer http(cfg, [&](api::HttpRequest &&, std::shared_ptr<api::Responder> out) {
        out->start_stream(200);
        writer = std::thread([out, &closed, &written, &peak] {
            const std::string chunk(256 * 1024, 'x');
            // Far more than the socket buffers of both ends hold.
            while (written.load() < (512u << 20)) {
                if (out->closed()) {
                    closed = true;
                    return;
                }
                out->write(chunk);
                written += chunk.size();
                peak = std::max(peak.load(), out->backlog());
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        });
    });
    ASSERT_EQ(http.listen(), "");
    http.run();
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(http.port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
    const std::string req = "GET /events HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd, req.data(), req.size(), 0), ssize_t(req.size()));
    // The client reads nothing.
    for (int i = 0; i < 600 && !closed.load() && written.load() < (512u << 20); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (writer.joinable()) writer.join();
    ::close(fd);
    http.stop();
    EXPECT_TRUE(closed.load()) << written.load() << " bytes written to a client that reads none";
    // What it queued showed in its backlog, which a sender paces itself on.
    EXPECT_GT(peak.load(), size_t(256u << 10));
}
