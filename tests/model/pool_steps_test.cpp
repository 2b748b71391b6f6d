// Agent steps sent to a GPU pool, on the node's side: the request body in each grammar dialect
// (from a real rendered turn of the tiny model), the reading of the upstream's stream, and the
// runner against a local upstream that hangs (cancel, deadline) or answers.
#include "routing/pool_steps.h"
#include "routing/upstream.h"
#include "tiny_model.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

using namespace armada;
using nlohmann::json;

namespace {

const char * kParams = R"({"type":"object","properties":{"r":{"type":"string","enum":["a","b"]}},"required":["r"]})";

routing::PoolStep step(bool required) {
    static engine::ChatFormat format(armada::testing::tiny_model());
    std::vector<common_chat_msg> msgs(1);
    msgs[0].role = "user";
    msgs[0].content = "look it up";
    std::vector<common_chat_tool> tools{{"lookup", "Look up a record", kParams}};
    routing::PoolStep s;
    s.pool = "gpu";
    s.turn = std::make_shared<engine::ChatTurn>(
        format.render(msgs, tools, required ? COMMON_CHAT_TOOL_CHOICE_REQUIRED : COMMON_CHAT_TOOL_CHOICE_AUTO, false));
    s.tools = tools;
    s.sampling.max_tokens = 64;
    s.sampling.temperature = 0.5f;
    s.seed = 9;
    s.cancelled = std::make_shared<std::atomic<bool>>(false);
    return s;
}

}  // namespace

TEST(PoolStepBody, LlamaDialectSendsTheTokensAndTheToolCallGrammar) {
    const auto s = step(true);
    const json b = routing::pool_step_body(s, "qwen-gpu", routing::GrammarDialect::llama);
    EXPECT_EQ(b["model"], "qwen-gpu");
    EXPECT_EQ(b["prompt"].get<engine::Tokens>(), s.turn->prompt);  // the node's rendering, as token ids
    EXPECT_EQ(b["max_tokens"], 64);
    EXPECT_EQ(b["seed"], 9);
    EXPECT_EQ(b["stream"], true);
    ASSERT_TRUE(b.contains("grammar"));
    EXPECT_NE(b["grammar"].get<std::string>().find("lookup"), std::string::npos);
    EXPECT_EQ(b["grammar_type"], "tool_calls");
    EXPECT_EQ(b["grammar_lazy"], false);  // a call is required
    EXPECT_EQ(b["generation_prompt"], s.turn->params.generation_prompt);
    EXPECT_FALSE(b.contains("response_format"));
    // A step that may call a tool: the grammar waits for its trigger.
    const json lazy = routing::pool_step_body(step(false), "qwen-gpu", routing::GrammarDialect::llama);
    EXPECT_EQ(lazy["grammar_lazy"], true);
    EXPECT_FALSE(lazy["grammar_triggers"].empty());
}

TEST(PoolStepBody, JsonSchemaDialectAsksForOneOfTheToolsCalls) {
    const json b =
        routing::pool_step_body(step(true), "Qwen/Qwen2.5-7B-Instruct", routing::GrammarDialect::json_schema);
    EXPECT_FALSE(b.contains("grammar"));
    ASSERT_TRUE(b.contains("response_format"));
    EXPECT_EQ(b["response_format"]["type"], "json_schema");
    const json & schema = b["response_format"]["json_schema"]["schema"];
    EXPECT_EQ(schema["properties"]["name"]["enum"], json::array({"lookup"}));
    EXPECT_EQ(schema["properties"]["arguments"], json::parse(kParams));
    // May call: nothing in this dialect says "text or a call", so it goes unconstrained.
    const json a = routing::pool_step_body(step(false), "m", routing::GrammarDialect::json_schema);
    EXPECT_FALSE(a.contains("response_format"));
    EXPECT_FALSE(a.contains("grammar"));
}

TEST(PoolStepBody, ASchemaReplyIsReadAsACall) {
    const auto m = routing::call_from_schema_reply(R"({"name":"lookup","arguments":{"r":"a"}})");
    ASSERT_TRUE(m);
    ASSERT_EQ(m->tool_calls.size(), 1u);
    EXPECT_EQ(m->tool_calls[0].name, "lookup");
    EXPECT_EQ(json::parse(m->tool_calls[0].arguments), json::parse(R"({"r":"a"})"));
    EXPECT_FALSE(routing::call_from_schema_reply(R"({"name":"lookup","arguments":"r=a"})"));
    EXPECT_FALSE(routing::call_from_schema_reply(R"({"name":"lookup","argum)"));
    EXPECT_FALSE(routing::call_from_schema_reply("plain text"));
}

TEST(CompletionStream, ReadsPiecesAcrossChunkBordersThenTheEnd) {
    routing::CompletionStream s;
    std::string text;
    const std::string all =
        "data: {\"choices\":[{\"text\":\"Hel\",\"finish_reason\":null}]}\n\n"
        "data: {\"choices\":[{\"text\":\"lo\",\"finish_reason\":null}]}\r\n\r\n"
        "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n"
        "data: [DONE]\n\n";
    for (size_t i = 0; i < all.size(); i += 7) {
        s.feed(std::string_view(all).substr(i, 7), [&](const std::string & p) { text += p; });
        if (i + 7 < 60) EXPECT_FALSE(s.done());
    }
    EXPECT_EQ(text, "Hello");
    EXPECT_TRUE(s.done());
    EXPECT_EQ(s.finish(), "length");
    EXPECT_EQ(s.prompt_tokens(), 12);
    EXPECT_EQ(s.completion_tokens(), 3);
    routing::CompletionStream e;
    e.feed("data: {\"error\":{\"message\":\"out of memory\"}}\n\n", [](const std::string &) {});
    EXPECT_EQ(e.error(), "out of memory");
    // Two chunks in one event, and a last one the upstream never ended with a blank line.
    routing::CompletionStream m;
    std::string mt;
    const auto add = [&](const std::string & p) { mt += p; };
    m.feed("data: {\"choices\":[{\"text\":\"a\"}]}\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n", add);
    m.feed("data: {\"choices\":[{\"text\":\"c\",\"finish_reason\":\"stop\"}]}", add);
    EXPECT_EQ(mt, "ab");
    EXPECT_FALSE(m.done());
    m.end(add);
    EXPECT_EQ(mt, "abc");
    EXPECT_TRUE(m.done());
}

namespace {

//! A local upstream on a free port: answers /health and warm-ups, and either hangs on
//! /v1/completions until the client goes (`hang`) or streams a short answer.
class LocalUpstream {
  public:
    //! `status`: what /v1/completions answers when it does not hang (200 streams an answer;
    //! kCut streams a piece and then closes the connection).
    static constexpr int kCut = 1;
    explicit LocalUpstream(bool hang, int status = 200) : hang_(hang), status_(status) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
        ::listen(fd_, 16);
        socklen_t n = sizeof a;
        ::getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &n);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { serve(); });
    }
    ~LocalUpstream() {
        stop_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        ::close(fd_);
        thread_.join();
        // Every answering thread ends before the members it writes go: a hung one wakes when its
        // connection is shut down.
        std::vector<std::thread> answering;
        {
            std::lock_guard lk(mu_);
            for (int c : open_)
                ::shutdown(c, SHUT_RDWR);
            answering.swap(answering_);
        }
        for (auto & t : answering)
            t.join();
    }
    std::string base() const { return "http://127.0.0.1:" + std::to_string(port_); }
    std::atomic<int> completions{0};
    std::atomic<int> hung_up{0};  // completion requests whose client closed the connection
    //! The head of the last completion request (request line and headers).
    std::string last_head() {
        std::lock_guard lk(mu_);
        return last_head_;
    }

  private:
    void serve() {
        while (!stop_) {
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) return;
            std::lock_guard lk(mu_);
            open_.insert(c);
            answering_.emplace_back([this, c] { answer(c); });
        }
    }
    void answer(int c) {
        std::string req;
        char buf[4096];
        ssize_t n;
        while (req.find("\r\n\r\n") == std::string::npos && (n = ::read(c, buf, sizeof buf)) > 0)
            req.append(buf, size_t(n));
        const bool completion = req.rfind("POST /v1/completions", 0) == 0;
        if (completion) {
            ++completions;
            std::lock_guard lk(mu_);
            last_head_ = req.substr(0, req.find("\r\n\r\n"));
        }
        if (completion && hang_) {
            while ((n = ::read(c, buf, sizeof buf)) > 0) {
            }
            ++hung_up;
        } else if (completion && status_ == kCut) {
            // A stream that says a word and then stops, without its end.
            const std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
            const std::string part = head + "data: {\"choices\":[{\"text\":\"part\",\"finish_reason\":null}]}\n\n";
            (void)!::write(c, part.data(), part.size());
        } else if (completion && status_ != 200) {
            const std::string e =
                "HTTP/1.1 " + std::to_string(status_) + " No\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
            (void)!::write(c, e.data(), e.size());
        } else if (completion) {
            const std::string body =
                "data: {\"choices\":[{\"text\":\"fine\",\"finish_reason\":\"stop\"}]}\n\n"
                "data: [DONE]\n\n";
            const std::string head =
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " + std::to_string(body.size()) +
                "\r\nConnection: close\r\n\r\n";
            (void)!::write(c, (head + body).data(), head.size() + body.size());
        } else {
            const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
            (void)!::write(c, ok.data(), ok.size());
        }
        std::lock_guard lk(mu_);
        open_.erase(c);
        ::close(c);
    }
    bool hang_;
    int status_;
    std::mutex mu_;
    std::string last_head_;
    std::set<int> open_;                  // connections being answered (under mu_)
    std::vector<std::thread> answering_;  // their threads (under mu_)
    int fd_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

struct RunnerRig {
    routing::RoutingConfig cfg;
    std::unique_ptr<routing::PoolSet> pools;
    std::unique_ptr<routing::PoolStepRunner> runner;
    explicit RunnerRig(const std::vector<std::string> & urls, int timeout_ms = 60000) {
        routing::PoolConfig p;
        p.name = "gpu";
        p.context = 12000;
        p.timeout_ms = timeout_ms;
        for (const auto & u : urls)
            p.upstreams.push_back({u, "big", "", "", 4, routing::GrammarDialect::llama});
        cfg.pools.push_back(p);
        cfg.routes = routing::default_routes(cfg.pools);
        std::string err;
        pools = routing::PoolSet::open(cfg.pools, err);
        EXPECT_TRUE(pools) << err;
        pools->start();
        for (int i = 0; i < 500 && pools->status()["gpu"]["up"].get<int>() < int(urls.size()); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_EQ(pools->status()["gpu"]["up"].get<int>(), int(urls.size())) << pools->status().dump();
        runner = std::make_unique<routing::PoolStepRunner>(cfg, *pools,
                                                           [](const std::string & t) { return int32_t(t.size()); });
    }
    routing::PoolStepResult run(routing::PoolStep s, std::string * streamed = nullptr) {
        std::promise<routing::PoolStepResult> p;
        runner->run(
            std::move(s),
            [streamed](std::string t) {
                if (streamed) *streamed += t;
            },
            [&](routing::PoolStepResult r) { p.set_value(std::move(r)); });
        return p.get_future().get();
    }
};

}  // namespace

TEST(PoolStepRunner, ATenantsLatencyClassRoutesItsSteps) {
    LocalUpstream up(false);
    RunnerRig rig({up.base()});
    routing::RoutingConfig cfg = rig.cfg;
    cfg.tenant_latency = {{"acme", "realtime"}};
    routing::RouteRule r;
    r.latency = {"realtime"};
    r.to = "gpu";
    cfg.routes.insert(cfg.routes.begin(), r);
    ASSERT_EQ(rig.runner->reload(cfg), "");
    // A session's owner is the API's tenant id: "t:" and the name the config uses.
    EXPECT_EQ(rig.runner->route({100, 100, false, "t:acme", ""}), "gpu");
    EXPECT_EQ(rig.runner->route({100, 100, false, "t:other", ""}), "");
    cfg.default_latency = "realtime";
    ASSERT_EQ(rig.runner->reload(cfg), "");
    EXPECT_EQ(rig.runner->route({100, 100, false, "t:other", ""}), "gpu");
}

TEST(PoolStepRunner, AStepTooLongForTheNodeGoesToAPoolThatHoldsItWhateverTheRules) {
    LocalUpstream up(false);
    RunnerRig rig({up.base()});
    routing::RoutingConfig cfg = rig.cfg;
    routing::RouteRule r;
    r.latency = {"standard"};
    r.to = "cpu";
    cfg.routes.insert(cfg.routes.begin(), r);  // every step stays on the node, by the rules
    ASSERT_EQ(rig.runner->reload(cfg), "");
    EXPECT_EQ(rig.runner->route({9000, 100, false, "t", "", 16384}), "");
    // The node holds 4,096 a sequence: the pool (12,000) takes it.
    EXPECT_EQ(rig.runner->route({9000, 100, false, "t", "", 4096}), "gpu");
    EXPECT_EQ(rig.runner->route({4095, 100, false, "t", "", 4096}), "gpu");
    EXPECT_EQ(rig.runner->route({4094, 100, false, "t", "", 4096}), "");
    // Nor can the pool hold it (prompt and max_tokens): it stays, to be compacted or refused.
    EXPECT_EQ(rig.runner->route({11950, 100, false, "t", "", 4096}), "");
}

TEST(PoolStepRunner, RoutesByTheRulesAndRunsOnAnUpstream) {
    LocalUpstream up(false);
    RunnerRig rig({up.base()});
    EXPECT_EQ(rig.runner->route({9000, 100, false, "t", ""}), "gpu");
    EXPECT_EQ(rig.runner->route({100, 100, true, "t", ""}), "gpu");
    EXPECT_EQ(rig.runner->route({100, 100, false, "t", ""}), "");
    // A step the pool's context cannot hold (prompt and max_tokens) stays on the node.
    EXPECT_EQ(rig.runner->route({9000, 4000, false, "t", ""}), "");
    std::string streamed;
    auto s = step(false);
    s.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const auto r = rig.run(s, &streamed);
    EXPECT_TRUE(r.ran) << r.error;
    // The step's span is the upstream's parent.
    std::string head = up.last_head();
    std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    EXPECT_NE(head.find("traceparent: " + s.traceparent), std::string::npos) << head;
    EXPECT_EQ(r.text, "fine");
    EXPECT_EQ(streamed, "fine");
    EXPECT_EQ(r.n_generated, 4);  // no usage in the stream: counted here
    EXPECT_EQ(r.n_prompt, int32_t(step(false).turn->prompt.size()));
}

TEST(PoolStepRunner, CancellingTheStepClosesTheUpstreamConnection) {
    LocalUpstream up(true);
    RunnerRig rig({up.base()});
    auto s = step(true);
    auto flag = s.cancelled;
    std::promise<routing::PoolStepResult> p;
    rig.runner->run(
        s, [](std::string) {}, [&](routing::PoolStepResult r) { p.set_value(std::move(r)); });
    for (int i = 0; i < 500 && up.completions.load() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(up.completions.load(), 1);
    EXPECT_EQ(up.hung_up.load(), 0);
    flag->store(true);
    auto f = p.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    EXPECT_TRUE(f.get().cancelled);
    for (int i = 0; i < 500 && up.hung_up.load() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(up.hung_up.load(), 1);  // the upstream saw its client go: it stops generating
}

TEST(PoolStepRunner, AnUpstreamThatTimesOutIsLeftForTheNextThenTheNode) {
    LocalUpstream hung(true), fine(false);
    {
        RunnerRig rig({hung.base(), fine.base()}, 300);
        // Whichever it tries first, the step ends on the one that answers.
        for (int i = 0; i < 2; ++i) {
            const auto r = rig.run(step(false));
            EXPECT_TRUE(r.ran) << r.error;
            EXPECT_EQ(r.text, "fine");
        }
        EXPECT_GE(hung.completions.load(), 1);
    }
    RunnerRig alone({hung.base()}, 300);
    const auto r = alone.run(step(false));
    EXPECT_FALSE(r.ran);
    EXPECT_FALSE(r.cancelled);
    EXPECT_FALSE(r.error.empty());
}

TEST(PoolStepRunner, AStreamCutMidwayIsRetractedBeforeTheNextUpstreamAnswers) {
    LocalUpstream cut(false, LocalUpstream::kCut), fine(false);
    RunnerRig rig({cut.base(), fine.base()});
    std::vector<std::string> pieces;
    std::promise<routing::PoolStepResult> p;
    rig.runner->run(
        step(false), [&](std::string t) { pieces.push_back(std::move(t)); },
        [&](routing::PoolStepResult r) { p.set_value(std::move(r)); });
    const auto r = p.get_future().get();
    EXPECT_TRUE(r.ran) << r.error;
    EXPECT_EQ(r.text, "fine");
    EXPECT_EQ(cut.completions.load(), 1);
    // The cut upstream's piece, then the empty piece that voids it, then the answer.
    EXPECT_EQ(pieces, (std::vector<std::string>{"part", "", "fine"}));
}

TEST(PoolStepRunner, AnUpstreamWithAWrongKeyOrModelIsLeftForTheNext) {
    for (int status : {401, 403, 404}) {
        LocalUpstream wrong(false, status), fine(false);
        RunnerRig rig({wrong.base(), fine.base()});
        for (int i = 0; i < 3; ++i) {
            const auto r = rig.run(step(false));
            EXPECT_TRUE(r.ran) << status << ": " << r.error;
        }
        EXPECT_GE(wrong.completions.load(), 1) << status;
        EXPECT_EQ(fine.completions.load(), 3) << status;
    }
    // A request the upstream refuses for what it is (400) is not sent to another.
    LocalUpstream bad(false, 400), fine(false);
    RunnerRig rig({bad.base(), fine.base()});
    int refused = 0;
    for (int i = 0; i < 4; ++i)
        refused += !rig.run(step(false)).ran;
    EXPECT_EQ(refused, bad.completions.load());
    EXPECT_GE(refused, 1);
}
