#include "bench/agents_bench.h"

#include "api/http_server.h"
#include "bench/http_client.h"
#include "common/cli_exit.h"
#include "common/json_fields.h"
#include "common/rss.h"
#include "net/sse.h"

#include <fmt/format.h>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <csignal>

namespace armada::bench {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string LatencyDist::parse(const std::string & text, LatencyDist & out) {
    const auto colon = text.find(':');
    out = {};
    out.kind = text.substr(0, colon);
    std::vector<double> v;
    if (colon != std::string::npos) {
        std::stringstream ss(text.substr(colon + 1));
        std::string part;
        while (std::getline(ss, part, ',')) {
            try {
                v.push_back(std::stod(part));
            } catch (...) {
                return "tool latency '" + text + "': '" + part + "' is not a number";
            }
        }
    }
    if (out.kind == "constant" && v.size() == 1 && v[0] >= 0) {
        out.a = v[0];
    } else if ((out.kind == "uniform" && v.size() == 2 && v[0] >= 0 && v[1] >= v[0]) ||
               (out.kind == "lognormal" && v.size() == 2 && v[0] > 0 && v[1] >= 0)) {
        out.a = v[0];
        out.b = v[1];
    } else {
        return "tool latency '" + text + "': use constant:S, uniform:LO,HI or lognormal:MEAN,SIGMA (seconds)";
    }
    return {};
}

std::string LatencyDist::describe() const {
    std::ostringstream s;
    if (kind == "constant") s << "constant " << a << " s";
    if (kind == "uniform") s << "uniform " << a << "–" << b << " s";
    if (kind == "lognormal") s << "lognormal, mean " << a << " s, sigma " << b;
    return s.str();
}

std::string apply_preset(const std::string & name, AgentsBenchOptions & o) {
    if (name == "throughput") {
        o.steps = 0;
        o.instruction_tokens = 100;
        o.answer_tokens = 32;
        o.tool_latency = {"constant", 0, 0};
    } else if (name == "mixed") {
        o.steps = 3;
        o.instruction_tokens = 700;
        o.step_tokens = 64;
        o.answer_tokens = 32;
        o.tool_latency = {"constant", 1.0, 0};
    } else if (name == "fault") {
        apply_preset("mixed", o);
        if (o.kill_after_s <= 0) o.kill_after_s = 20;
        if (o.retry_s <= 0) o.retry_s = 120;
    } else {
        return "unknown preset '" + name + "' (throughput, mixed, fault)";
    }
    return {};
}

namespace {

double draw(const LatencyDist & d, std::mt19937_64 & rng) {
    if (d.kind == "uniform") return std::uniform_real_distribution<double>(d.a, d.b)(rng);
    if (d.kind == "lognormal") {
        // mean of a lognormal is exp(mu + sigma²/2): pick mu so the mean is d.a.
        const double mu = std::log(d.a) - d.b * d.b / 2;
        return std::lognormal_distribution<double>(mu, d.b)(rng);
    }
    return d.a;
}

const char * kWords[] = {"the",   "data", "record", "shows", "that",   "each",  "value", "is",    "ready",
                         "for",   "next", "step",   "and",   "result", "of",    "a",     "check", "with",
                         "order", "list", "field",  "name",  "time",   "state", "user",  "team",  "report"};

//! About `n` tokens of plain English words (most are one token each in Qwen's vocabulary).
std::string words(int n, uint64_t seed) {
    std::string s;
    std::mt19937_64 rng(seed);
    for (int i = 0; i < n; ++i) {
        if (i) s += ' ';
        s += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
    }
    return s;
}

json tool_schema() {
    return {{"type", "object"},
            {"properties", {{"page", {{"type", "integer"}, {"enum", {1, 2, 3}}}}}},
            {"required", {"page"}},
            {"additionalProperties", false}};
}

//! The built-in tool server: every tool sleeps for a drawn latency, then returns about
//! `tool_output_tokens` tokens of text.
class ToolServer {
  public:
    explicit ToolServer(const AgentsBenchOptions & opt)
        : opt_(opt), server_(config(), [this](api::HttpRequest && r, std::shared_ptr<api::Responder> out) {
              handle(std::move(r), std::move(out));
          }) {}
    std::string start() {
        if (auto e = server_.listen(); !e.empty()) return e;
        server_.run();
        return {};
    }
    ~ToolServer() { server_.stop(); }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(server_.port()); }
    uint64_t calls() const { return calls_.load(); }

  private:
    static api::HttpConfig config() {
        api::HttpConfig c;
        c.port = 0;
        c.threads = 2;
        return c;
    }
    void handle(api::HttpRequest && r, std::shared_ptr<api::Responder> out) {
        const uint64_t n = calls_++;
        double delay;
        {
            std::lock_guard lk(mu_);
            delay = draw(opt_.tool_latency, rng_);
        }
        auto t = std::make_shared<boost::asio::steady_timer>(server_.executor(),
                                                             std::chrono::microseconds(int64_t(delay * 1e6)));
        std::string body = json{{"tool", r.path}, {"result", words(opt_.tool_output_tokens, opt_.seed ^ n)}}.dump();
        t->async_wait(
            [t, out, body = std::move(body)](boost::system::error_code) { out->send(200, "application/json", body); });
    }

    const AgentsBenchOptions & opt_;
    api::HttpServer server_;
    std::mutex mu_;
    std::mt19937_64 rng_{opt_.seed};
    std::atomic<uint64_t> calls_{0};
};

struct SessionResult {
    bool ok = false;
    std::string error_kind, error;
    double start_s = 0, end_s = 0;
    std::vector<double> step_s, ttft_s;
    int64_t prompt_tokens = 0, gen_tokens = 0;
    int invalid_calls = 0;
    int tool_errors = 0;  // tool results the node recorded as errors (sessions mode)
    uint64_t kv_bytes = 0;
};

double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t i = size_t(std::min<double>(double(v.size() - 1), std::floor(p / 100.0 * double(v.size()))));
    return v[i];
}

class Bench {
  public:
    Bench(const AgentsBenchOptions & opt, std::string tools_url) : opt_(opt), tools_url_(std::move(tools_url)) {
        instructions_ = "You are a careful operations agent. " + words(opt.instruction_tokens, opt.seed);
        for (int k = 0; k < opt.tools; ++k) {
            tools_.push_back({{"type", "function"},
                              {"function",
                               {{"name", "tool_" + std::to_string(k)},
                                {"description", "Reads page of dataset " + std::to_string(k)},
                                {"parameters", tool_schema()}}}});
        }
        if (!opt.api_key.empty()) headers_.push_back({"Authorization", "Bearer " + opt.api_key});
        headers_.push_back({"Content-Type", "application/json"});
    }

    std::string setup() {
        if (opt_.mode != "sessions") return {};
        json tools = json::array();
        for (int k = 0; k < opt_.tools; ++k) {
            tools.push_back({{"name", "tool_" + std::to_string(k)},
                             {"description", "Reads page of dataset " + std::to_string(k)},
                             {"url", tools_url_ + "/tool_" + std::to_string(k)},
                             {"timeout_ms", 600000},
                             {"parameters", tool_schema()}});
        }
        json agent = {{"id", "bench"},
                      {"instructions", instructions_},
                      {"min_tool_steps", opt_.steps},
                      {"answer_without_tools", true},
                      {"parallel_tool_calls", false},
                      {"sampling", {{"temperature", 0.7}, {"seed", opt_.seed}}},
                      {"limits",
                       {{"max_steps", opt_.steps + 1},
                        {"max_tokens_per_step", std::max(opt_.step_tokens, opt_.answer_tokens)},
                        {"tool_timeout_ms", 600000}}},
                      {"tools", tools}};
        const auto r = http_call("POST", opt_.target + "/v1/agents", agent.dump(), headers_, 30000);
        if (r.status != 200)
            return "cannot declare the bench agent: " + std::to_string(r.status) + " " + r.error + r.body;
        return {};
    }

    SessionResult run_session(int i) { return opt_.mode == "sessions" ? server_side(i) : client_side(i); }

    double now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
    std::atomic<int> retries{0};

    //! http_call, retried while the server is down, loading (503) or full (429), for up to
    //! retry_s seconds. Streams restart from the beginning, so `reset` runs before each try.
    HttpResult call(const std::string & method, const std::string & url, const std::string & body,
                    const std::function<bool(std::string_view)> & on_chunk = {},
                    const std::function<void()> & reset = {}) {
        const double until = now() + opt_.retry_s;
        for (;;) {
            if (reset) reset();
            HttpResult r = http_call(method, url, body, headers_, opt_.timeout_s * 1000, on_chunk);
            // No answer (down), 503 (still loading) and 429 (full) are worth another try.
            const bool again = r.status == 0 || r.status == 503 || r.status == 429;
            if (!again || now() >= until) return r;
            ++retries;
            double wait_s = 0.5;
            if (!r.retry_after.empty()) wait_s = std::clamp(std::atof(r.retry_after.c_str()), 0.1, 2.0);
            std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
        }
    }
    void reset_clock() { t0_ = Clock::now(); }

  private:
    // Armada's sessions API: one POST, then the SSE stream until the session ends, then one GET
    // for the step log.
    SessionResult server_side(int i) {
        SessionResult res;
        res.start_s = now();
        const auto c =
            call("POST", opt_.target + "/v1/agents/bench/sessions",
                 json{{"input", "Task " + std::to_string(i) + ": " + words(12, opt_.seed + uint64_t(i))}}.dump());
        if (c.status != 200) return fail(res, c);
        const std::string id = json::parse(c.body, nullptr, false).value("id", "");
        std::string state;
        const net::SseReader::Handler sse_fn = [&](net::SseEvent & ev) {
            if (ev.type() != "state") return true;
            const json j = json::parse(ev.data, nullptr, false);
            state = j.is_object() ? j.value("state", "") : "";
            return state != "completed" && state != "failed" && state != "cancelled";
        };
        net::SseReader sse;
        // A stream cut by a server restart is opened again: the session is durable and resumes.
        HttpResult s;
        for (;;) {
            s = call(
                "GET", opt_.target + "/v1/sessions/" + id + "/events", "",
                [&](std::string_view b) { return sse.feed(b, sse_fn); }, [&] { sse = net::SseReader(); });
            const bool ended = state == "completed" || state == "failed" || state == "cancelled";
            if (s.status != 200 || ended || opt_.retry_s <= 0) break;
            ++retries;
        }
        if (s.status != 200) return fail(res, s);
        const auto g = call("GET", opt_.target + "/v1/sessions/" + id, "");
        res.end_s = now();
        const json v = json::parse(g.body, nullptr, false);
        if (g.status != 200 || !v.is_object()) return fail(res, g);
        state = v.value("state", "");
        if (state != "completed") {
            res.error_kind = "session_" + state;
            res.error = v.value("reason", "");
            return res;
        }
        int64_t last_ts = -1;
        for (const auto & st : v["steps"]) {
            const std::string kind = st.value("kind", "");
            const int64_t ts = st.value("ts_ms", int64_t(0));
            if (kind == "model_output") {
                const json & d = st["data"];
                res.prompt_tokens += d.value("prompt_tokens", 0);
                res.gen_tokens += d.value("completion_tokens", 0);
                if (d.contains("ttft_ms")) res.ttft_s.push_back(d.value("ttft_ms", 0.0) / 1000);
                if (last_ts >= 0) res.step_s.push_back(double(ts - last_ts) / 1000);
            }
            if (kind == "user_input" || kind == "tool_result") last_ts = ts;
            // The node records a failed tool call and the session goes on; the step did less
            // work than the workload asks for, so it is an error of the run.
            if (kind == "tool_result" && st.contains("data") && st["data"].value("is_error", false)) {
                if (res.tool_errors++ == 0) res.error = st["data"].value("content", "");
            }
        }
        if (v.contains("memory")) res.kv_bytes = v["memory"].value("kv_bytes", uint64_t(0));
        res.ok = true;
        return res;
    }

    // Any OpenAI-compatible server: the bench runs the loop, streaming each step.
    SessionResult client_side(int i) {
        SessionResult res;
        res.start_s = now();
        json messages = json::array(
            {{{"role", "system"}, {"content", instructions_}},
             {{"role", "user"}, {"content", "Task " + std::to_string(i) + ": " + words(12, opt_.seed + uint64_t(i))}}});
        const int turns = std::max(1, opt_.user_turns);
        for (int turn = 0; turn < turns; ++turn) {
            if (turn > 0) {
                // A person reads the answer and writes the next message.
                std::this_thread::sleep_for(std::chrono::duration<double>(opt_.think_s));
                messages.push_back({{"role", "user"},
                                    {"content", "Next " + std::to_string(turn) + ": " +
                                                    words(12, opt_.seed + uint64_t(i) * 31 + uint64_t(turn))}});
            }
            if (!client_turn(res, messages, i)) return res;
        }
        res.end_s = now();
        res.ok = true;
        return res;
    }

    //! One user turn of a client-side conversation: tool steps, then the answer, which joins
    //! `messages`. False when the run failed (res says why).
    bool client_turn(SessionResult & res, json & messages, int i) {
        for (int step = 0; step <= opt_.steps; ++step) {
            const bool answer = step == opt_.steps;
            json req = {{"messages", messages}, {"max_tokens", answer ? opt_.answer_tokens : opt_.step_tokens},
                        {"temperature", 0.7},   {"seed", opt_.seed + uint32_t(i)},
                        {"stream", true},       {"stream_options", {{"include_usage", true}}}};
            if (!opt_.model.empty()) req["model"] = opt_.model;
            req["tools"] = tools_;
            req["tool_choice"] = answer ? "none" : "required";
            req["parallel_tool_calls"] = false;
            const double t_step = now();
            double t_first = -1;
            std::string content, name, args;
            int64_t pt = 0, ct = 0;
            const net::SseReader::Handler sse_fn = [&](net::SseEvent & ev) {
                const std::string & data = ev.data;
                if (data == "[DONE]") return false;
                const json j = json::parse(data, nullptr, false);
                if (!j.is_object()) return true;
                if (const auto * u = common::object_field(j, "usage")) {
                    pt = common::int_field(*u, "prompt_tokens").value_or(0);
                    ct = common::int_field(*u, "completion_tokens").value_or(0);
                }
                const auto * choices = common::array_field(j, "choices");
                if (!choices || choices->empty()) return true;
                const auto * d = common::object_field((*choices)[0], "delta");
                if (!d) return true;
                const auto piece = common::string_field(*d, "content");
                const auto * calls = common::array_field(*d, "tool_calls");
                if (((piece && !piece->empty()) || calls) && t_first < 0) t_first = now();
                if (piece) content += *piece;
                if (calls) {
                    for (const auto & tc : *calls) {
                        if (const auto * f = common::object_field(tc, "function")) {
                            name += common::string_field(*f, "name").value_or("");
                            args += common::string_field(*f, "arguments").value_or("");
                        }
                    }
                }
                return true;
            };
            net::SseReader sse;
            const auto r = call(
                "POST", opt_.target + "/v1/chat/completions", req.dump(),
                [&](std::string_view b) { return sse.feed(b, sse_fn); },
                [&] {
                    sse = net::SseReader();
                    content.clear();
                    name.clear();
                    args.clear();
                    t_first = -1;
                });
            if (r.status != 200) {
                fail(res, r);
                return false;
            }
            res.step_s.push_back(now() - t_step);
            if (t_first >= 0) res.ttft_s.push_back(t_first - t_step);
            res.prompt_tokens += pt;
            res.gen_tokens += ct;
            if (answer) {
                messages.push_back({{"role", "assistant"}, {"content", content}});
                break;
            }
            // A step that did not produce a valid call is counted, and a stand-in call keeps the
            // token work of both targets the same.
            const json parsed = json::parse(args, nullptr, false);
            bool known = false;
            for (int k = 0; k < opt_.tools; ++k)
                known = known || name == "tool_" + std::to_string(k);
            if (!known || !parsed.is_object()) {
                ++res.invalid_calls;
                name = "tool_" + std::to_string(step % std::max(1, opt_.tools));
                args = R"({"page": 1})";
            }
            const std::string call_id = "call_" + std::to_string(step);
            messages.push_back({{"role", "assistant"},
                                {"content", nullptr},
                                {"tool_calls", json::array({{{"id", call_id},
                                                             {"type", "function"},
                                                             {"function", {{"name", name}, {"arguments", args}}}}})}});
            const auto t = http_call("POST", tools_url_ + "/" + name, args, {{"Content-Type", "application/json"}},
                                     opt_.timeout_s * 1000);
            if (t.status != 200) {
                fail(res, t, "tool");
                return false;
            }
            messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", t.body}});
        }
        return true;
    }

    static SessionResult & fail(SessionResult & res, const HttpResult & r, const std::string & what = "server") {
        if (r.status == 0) {
            res.error_kind = what + "_connection";
        } else if (r.status == 429) {
            res.error_kind = "http_429";
        } else if (r.status >= 500) {
            res.error_kind = "http_5xx";
        } else {
            res.error_kind = "http_" + std::to_string(r.status);
        }
        res.error = r.error.empty() ? r.body.substr(0, 300) : r.error;
        return res;
    }

    const AgentsBenchOptions & opt_;
    std::string tools_url_;
    std::string instructions_;
    json tools_ = json::array();
    std::vector<std::pair<std::string, std::string>> headers_;
    Clock::time_point t0_ = Clock::now();
};

void progress_bar(int done, int total, int errors, double elapsed) {
    const int width = 30;
    const int fill = total > 0 ? done * width / total : 0;
    fprintf(stderr, "\r[%.*s%*s] %d/%d sessions, %d errors, %.1f s, %.1f sessions/min   ", fill,
            "==============================", width - fill, "", done, total, errors, elapsed,
            elapsed > 0 ? done * 60.0 / elapsed : 0.0);
    fflush(stderr);
}

}  // namespace

int agents_bench(const AgentsBenchOptions & opt) {
    if (opt.mode != "sessions" && opt.mode != "chat") {
        return common::fail("--mode must be sessions or chat", 2);
    }
    ToolServer tools(opt);
    if (auto e = tools.start(); !e.empty()) {
        return common::fail(fmt::format("tool server: {}", e));
    }
    Bench bench(opt, tools.url());
    if (auto e = bench.setup(); !e.empty()) {
        return common::fail(e);
    }
    std::vector<SessionResult> results(size_t(opt.sessions));
    std::atomic<int> next{0}, done{0}, errors{0};
    std::atomic<bool> running{true};
    std::vector<double> rss_samples;
    std::mutex rss_mu;
    // The server's memory before the load: weights and runtime, what every session adds to.
    const double rss_idle = opt.server_pid > 0 ? double(common::rss_bytes(opt.server_pid)) : 0;
    bench.reset_clock();
    std::thread sampler([&] {
        while (running) {
            if (opt.server_pid > 0) {
                std::lock_guard lk(rss_mu);
                rss_samples.push_back(double(common::rss_bytes(opt.server_pid)));
            }
            if (opt.progress) progress_bar(done, opt.sessions, errors, bench.now());
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
        }
    });
    auto work = [&](int i) {
        results[size_t(i)] = bench.run_session(i);
        if (!results[size_t(i)].ok) ++errors;
        ++done;
    };
    std::vector<std::thread> threads;
    if (opt.rate > 0) {
        // Open loop: arrivals follow a Poisson process whatever the server's speed.
        std::mt19937_64 rng(opt.seed);
        std::exponential_distribution<double> gap(opt.rate);
        for (int i = 0; i < opt.sessions; ++i) {
            threads.emplace_back(work, i);
            std::this_thread::sleep_for(std::chrono::duration<double>(gap(rng)));
        }
    } else {
        for (int w = 0; w < std::max(1, opt.concurrency); ++w) {
            threads.emplace_back([&] {
                for (int i = next++; i < opt.sessions; i = next++)
                    work(i);
            });
        }
    }
    std::thread killer;
    if (opt.kill_after_s > 0 && opt.server_pid > 0) {
        killer = std::thread([&] {
            while (running && bench.now() < opt.kill_after_s)
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            if (!running) return;
            fprintf(stderr, "\nfault: SIGKILL to %d at %.1f s\n", opt.server_pid, bench.now());
            kill(opt.server_pid, SIGKILL);
            // Wait until every thread of it is gone (the leader turns zombie before the others
            // have closed the shared descriptors), so its port is free for the restart.
            const std::string proc = "/proc/" + std::to_string(opt.server_pid);
            for (int i = 0; i < 200; ++i) {
                std::error_code ec;
                size_t tasks = 0;
                for (auto it = std::filesystem::directory_iterator(proc + "/task", ec);
                     !ec && it != std::filesystem::directory_iterator(); ++it)
                    ++tasks;
                std::ifstream st(proc + "/stat");
                std::string pid, comm, state;
                if (ec || !(st >> pid >> comm >> state) || (state == "Z" && tasks <= 1)) break;
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
            if (!opt.restart_cmd.empty()) {
                const int rc = std::system(opt.restart_cmd.c_str());
                fprintf(stderr, "fault: restart command exited with %d at %.1f s\n", rc, bench.now());
            }
        });
    }
    for (auto & t : threads)
        t.join();
    const double wall = bench.now();
    running = false;
    sampler.join();
    if (killer.joinable()) killer.join();
    if (opt.progress) {
        progress_bar(done, opt.sessions, errors, wall);
        fputc('\n', stderr);
    }

    // Aggregate.
    std::vector<double> completion, ttft, step;
    std::map<std::string, int> kinds;
    int completed = 0, invalid = 0, tool_errors = 0;
    int64_t pt = 0, gt = 0;
    uint64_t kv = 0;
    std::map<int, int> per_second;
    std::string sample_error;
    for (const auto & r : results) {
        invalid += r.invalid_calls;
        tool_errors += r.tool_errors;
        if (r.tool_errors > 0 && sample_error.empty()) sample_error = "tool_error: " + r.error;
        pt += r.prompt_tokens;
        gt += r.gen_tokens;
        if (!r.ok) {
            kinds[r.error_kind.empty() ? "unknown" : r.error_kind]++;
            if (sample_error.empty()) sample_error = r.error_kind + ": " + r.error;
            continue;
        }
        ++completed;
        completion.push_back(r.end_s - r.start_s);
        ttft.insert(ttft.end(), r.ttft_s.begin(), r.ttft_s.end());
        step.insert(step.end(), r.step_s.begin(), r.step_s.end());
        kv += r.kv_bytes;
        per_second[int(r.end_s)]++;
    }
    if (invalid > 0) kinds["invalid_tool_call"] = invalid;
    if (tool_errors > 0) kinds["tool_error"] = tool_errors;
    double rss_peak = 0, rss_mean = 0;
    for (double v : rss_samples) {
        rss_peak = std::max(rss_peak, v);
        rss_mean += v / double(rss_samples.size());
    }
    json timeline = json::array();
    for (int s = 0; s <= int(wall); ++s)
        timeline.push_back(per_second.count(s) ? per_second[s] : 0);
    const std::string label = opt.label.empty() ? opt.mode : opt.label;
    json out = {
        {"label", label},
        {"date",
         [] {
             char b[32];
             const time_t t = time(nullptr);
             strftime(b, sizeof b, "%Y-%m-%d %H:%M", gmtime(&t));
             return std::string(b);
         }()},
        {"workload",
         {{"target", opt.target},
          {"mode", opt.mode},
          {"sessions", opt.sessions},
          {"concurrency", opt.rate > 0 ? 0 : opt.concurrency},
          {"rate_per_s", opt.rate},
          {"steps", opt.steps},
          {"instruction_tokens", opt.instruction_tokens},
          {"tools", opt.tools},
          {"tool_latency", opt.tool_latency.describe()},
          {"tool_output_tokens", opt.tool_output_tokens},
          {"step_tokens", opt.step_tokens},
          {"answer_tokens", opt.answer_tokens},
          {"seed", opt.seed}}},
        {"results",
         {{"wall_s", wall},
          {"completed", completed},
          {"sessions_per_min", wall > 0 ? completed * 60.0 / wall : 0},
          {"completion_s", {{"p50", pct(completion, 50)}, {"p95", pct(completion, 95)}, {"p99", pct(completion, 99)}}},
          {"ttft_s", {{"p50", pct(ttft, 50)}, {"p95", pct(ttft, 95)}}},
          {"step_s", {{"p50", pct(step, 50)}, {"p95", pct(step, 95)}}},
          {"prompt_tokens_per_s", wall > 0 ? double(pt) / wall : 0},
          {"generated_tokens_per_s", wall > 0 ? double(gt) / wall : 0},
          {"errors", kinds},
          {"chain_survival", opt.sessions > 0 ? double(completed) / opt.sessions : 0},
          {"server_rss_idle_mb", rss_idle / 1048576.0},
          {"server_rss_peak_mb", rss_peak / 1048576.0},
          {"server_rss_mean_mb", rss_mean / 1048576.0},
          {"kv_bytes_per_session", completed > 0 ? double(kv) / completed : 0},
          {"tool_calls_served", tools.calls()},
          {"retries", bench.retries.load()},
          {"fault", {{"kill_after_s", opt.kill_after_s}, {"restart_cmd", opt.restart_cmd}}},
          {"completions_per_second", timeline}}}};
    if (!sample_error.empty()) out["results"]["first_error"] = sample_error;

    std::ostringstream md;
    const json & R = out["results"];
    md.setf(std::ios::fixed);
    md.precision(2);
    md << "| target | mode | concurrency | sessions | completed | sessions/min | p50 s | p95 s | p99 s | TTFT p50 s | "
          "TTFT p95 s | step p50 s | step p95 s | prompt tok/s | gen tok/s | errors | survival |\n"
       << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
       << "| " << label << " | " << opt.mode << " | "
       << (opt.rate > 0 ? "rate " + std::to_string(opt.rate) : std::to_string(opt.concurrency)) << " | " << opt.sessions
       << " | " << completed << " | " << R["sessions_per_min"].get<double>() << " | "
       << R["completion_s"]["p50"].get<double>() << " | " << R["completion_s"]["p95"].get<double>() << " | "
       << R["completion_s"]["p99"].get<double>() << " | " << R["ttft_s"]["p50"].get<double>() << " | "
       << R["ttft_s"]["p95"].get<double>() << " | " << R["step_s"]["p50"].get<double>() << " | "
       << R["step_s"]["p95"].get<double>() << " | " << R["prompt_tokens_per_s"].get<double>() << " | "
       << R["generated_tokens_per_s"].get<double>() << " | " << (kinds.empty() ? "none" : json(kinds).dump()) << " | "
       << R["chain_survival"].get<double>() << " |\n";
    fputs(md.str().c_str(), stdout);
    if (!sample_error.empty()) fprintf(stderr, "first error: %s\n", sample_error.c_str());
    if (!opt.output.empty()) {
        std::ofstream(opt.output + ".json") << out.dump(2) << "\n";
        std::ofstream(opt.output + ".md") << md.str();
    }
    return completed == opt.sessions ? 0 : 3;
}

int plot_results(const std::vector<std::string> & files, const std::string & out_prefix) {
    // label → concurrency → (sessions/min, p95)
    std::map<std::string, std::map<int, std::pair<double, double>>> series;
    for (const auto & f : files) {
        std::ifstream in(f);
        const json j = json::parse(in, nullptr, false);
        if (!j.is_object() || !j.contains("results")) {
            return common::fail(fmt::format("{} is not a bench result", f), 2);
        }
        series[j.value("label", "?")][j["workload"].value("concurrency", 0)] = {
            j["results"].value("sessions_per_min", 0.0), j["results"]["completion_s"].value("p95", 0.0)};
    }
    std::ofstream dat(out_prefix + ".dat");
    std::ostringstream plot1, plot2;
    int idx = 0;
    for (const auto & [label, pts] : series) {
        dat << "# " << label << "\n";
        for (const auto & [c, v] : pts)
            dat << c << " " << v.first << " " << v.second << "\n";
        dat << "\n\n";
        const std::string sep = idx ? ", " : "";
        plot1 << sep << "'" << out_prefix << ".dat' index " << idx << " using 1:2 with linespoints title '" << label
              << "'";
        plot2 << sep << "'" << out_prefix << ".dat' index " << idx << " using 1:3 with linespoints title '" << label
              << "'";
        ++idx;
    }
    dat.close();
    std::ofstream gp(out_prefix + ".gp");
    gp << "set terminal svg size 900,380 dynamic\nset output '" << out_prefix << ".svg'\n"
       << "set multiplot layout 1,2\nset logscale x 2\nset xlabel 'concurrent sessions'\nset key top left\n"
       << "set grid\nset ylabel 'sessions / min'\nset title 'Throughput'\nplot " << plot1.str() << "\n"
       << "set ylabel 'seconds'\nset title 'p95 session time'\nplot " << plot2.str() << "\nunset multiplot\n";
    gp.close();
    const std::string cmd = "gnuplot '" + out_prefix + ".gp'";
    if (std::system(cmd.c_str()) != 0) {
        return common::fail("gnuplot failed (is gnuplot-nox installed?)");
    }
    printf("wrote %s.svg\n", out_prefix.c_str());
    return 0;
}

int plan_capacity(const std::string & file, double water_level, int64_t target_sessions, uint64_t node_memory) {
    std::ifstream in(file);
    const json j = json::parse(in, nullptr, false);
    if (!j.is_object() || !j.contains("results")) {
        return common::fail(fmt::format("{} is not a bench result", file), 2);
    }
    const json & w = j["workload"];
    const json & r = j["results"];
    const int measured = w.value("concurrency", 0);
    const double survival = r.value("chain_survival", 0.0);
    if (measured <= 0) {
        return common::fail("the plan needs a closed-loop result (a concurrency)", 2);
    }
    if (survival < 1.0) {
        printf("warning: only %.1f%% of sessions completed at concurrency %d; plan from a run with none failing\n",
               survival * 100, measured);
    }
    const double kv = r.value("kv_bytes_per_session", 0.0);
    const double rss_idle = r.value("server_rss_idle_mb", 0.0) * 1048576.0;
    const double rss_peak = r.value("server_rss_peak_mb", 0.0) * 1048576.0;
    printf("measured: %d concurrent sessions, %.1f sessions/min, p95 %.1f s (%s, %s)\n", measured,
           r.value("sessions_per_min", 0.0), r["completion_s"].value("p95", 0.0), j.value("label", "?").c_str(),
           j.value("date", "").c_str());
    // Two limits: the concurrency the node served at that latency, and the memory its sessions
    // need. Memory per session is the larger of its measured KV and what the server's RSS grew
    // by per session under the load; the node's fixed part (weights, runtime) is the RSS before it.
    const int64_t by_load = int64_t(std::floor(measured * water_level));
    const double grown = rss_peak > rss_idle && rss_idle > 0 ? (rss_peak - rss_idle) / measured : 0;
    const double per_session = std::max(kv, grown);
    int64_t by_memory = -1;
    if (per_session > 0 && node_memory > 0) {
        const double usable = double(node_memory) * water_level - rss_idle;
        by_memory = usable > 0 ? int64_t(std::floor(usable / per_session)) : 0;
    }
    const bool memory_binds = by_memory >= 0 && by_memory < by_load;
    const int64_t per_node = memory_binds ? by_memory : by_load;
    printf("memory per session: %.1f MiB (KV %.1f MiB, RSS growth %.1f MiB per session); node's fixed RSS %.0f MiB\n",
           per_session / 1048576.0, kv / 1048576.0, grown / 1048576.0, rss_idle / 1048576.0);
    printf("limits at water level %.2f: concurrency allows %lld sessions, ", water_level,
           static_cast<long long>(by_load));
    if (by_memory >= 0) {
        printf("memory (%.1f GiB) allows %lld\n", double(node_memory) / (1ull << 30),
               static_cast<long long>(by_memory));
    } else {
        printf("memory not measured (run the bench with --server-pid)\n");
    }
    printf("binding limit: %s\n", memory_binds ? "memory" : "concurrency");
    printf("plan at water level %.2f: %lld sessions per node\n", water_level, static_cast<long long>(per_node));
    if (target_sessions > 0 && per_node > 0) {
        const int64_t nodes = (target_sessions + per_node - 1) / per_node;
        printf("for %lld concurrent sessions: %lld nodes\n", static_cast<long long>(target_sessions),
               static_cast<long long>(nodes));
    }
    return 0;
}

}  // namespace armada::bench
