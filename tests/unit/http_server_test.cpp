// The HTTP front end's notice of a client that hangs up, against a real socket client.
#include "api/http_server.h"
#include "bench/http_client.h"

#include <gtest/gtest.h>

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
