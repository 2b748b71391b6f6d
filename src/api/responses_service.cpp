#include "api/responses_service.h"

#include "agent/agent_spec.h"
#include "api/errors.h"
#include "api/openai_map.h"
#include "api/openai_service.h"
#include "api/responses_input.h"
#include "common/clock.h"
#include "common/json_fields.h"
#include "net/sse.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include <chrono>
#include <map>
#include <mutex>
#include <set>

namespace armada::api {

namespace net = boost::asio;

//! One response being generated. Engine events queue under `mu` and render on `strand`.
struct ResponsesService::Run : std::enable_shared_from_this<Run> {
    explicit Run(net::any_io_executor io) : strand(net::make_strand(io)) {}

    net::strand<net::any_io_executor> strand;
    std::shared_ptr<Responder> out;
    store::Store * store = nullptr;
    const engine::ChatFormat * format = nullptr;
    std::shared_ptr<engine::ChatTurn> turn;
    std::vector<common_chat_msg> conversation;  // without the system message
    json resp;                                  // the response object, filled as it goes
    std::string owner;                          // the tenant
    std::string chain;    // the first response of its previous_response_id chain: the program it is part of
    std::string account;  // the key's rate-limit account
    std::string named_tool;
    bool stream = false, store_it = true;
    std::string text, msg_id;
    common_chat_msg parsed;
    int64_t seq = 0;
    bool item_open = false;
    // server-side MCP tools: the loop runs model step → MCP calls → model step until an answer
    ResponsesService * svc = nullptr;
    engine::EngineSet * engine = nullptr;
    std::vector<common_chat_tool> tools;
    common_chat_tool_choice choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    bool parallel = true;
    engine::SamplingOptions so;
    std::string instructions;
    std::map<std::string, std::pair<std::string, std::shared_ptr<tools::McpClient>>> mcp;  // tool → (label, client)
    json items = json::array();  // mcp_list_tools and mcp_call items, in order
    int iterations = 0, pending = 0;
    std::optional<obs::TraceContext> trace;  // the request's, the parent of the MCP calls' spans
    int64_t in_tokens = 0, out_tokens = 0, cached_tokens = 0;
    // One flag for every step of the run: the client hanging up stops whichever is running.
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    // GPU pools (svc->pool_ set): where steps ran, for X-Armada-Route.
    std::string model_asked;                   // the request's `model`, for the rules that name one
    std::string route = "cpu";                 // the first step's pool, or cpu
    std::string degraded;                      // "<pool>-unavailable" once a pool step fell back here
    std::string step_pool;                     // the pool running the current step ("" : this node)
    bool pool_local = false;                   // a pool failed: the run's later steps stay here
    bool streaming = false;                    // start_stream was called
    int error_status = 500;                    // for a failure before any stream
    std::optional<common_chat_msg> pool_call;  // a call read from a pool's response_format reply

    std::mutex mu;
    std::vector<engine::GenEvent> events;  // guarded by mu
    bool scheduled = false;                // guarded by mu

    void push(engine::GenEvent && ev) {
        bool post = false;
        {
            std::lock_guard lk(mu);
            events.push_back(std::move(ev));
            post = !scheduled;
            scheduled = true;
        }
        if (post) net::post(strand, [self = shared_from_this()] { self->drain(); });
    }

    void drain() {
        std::vector<engine::GenEvent> batch;
        {
            std::lock_guard lk(mu);
            batch.swap(events);
            scheduled = false;
        }
        for (auto & ev : batch)
            on_event(std::move(ev));
    }

    void send_event(const std::string & type, json data) {
        data["type"] = type;
        data["sequence_number"] = seq++;
        out->write(armada::net::sse_event(type, dump(data)));
    }

    //! `index`: the message's place in the response's output (after any MCP items before it).
    void open_message(size_t index) {
        if (item_open) return;
        item_open = true;
        json item = {{"type", "message"},
                     {"id", msg_id},
                     {"status", "in_progress"},
                     {"role", "assistant"},
                     {"content", json::array()}};
        send_event("response.output_item.added", {{"output_index", index}, {"item", item}});
        send_event("response.content_part.added",
                   {{"item_id", msg_id},
                    {"output_index", index},
                    {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
    }

    void on_event(engine::GenEvent && ev) {
        if (stream && seq == 0) {
            // The first engine event opens the stream, so nothing can overtake these two.
            send_event("response.created", {{"response", resp}});
            send_event("response.in_progress", {{"response", resp}});
        }
        if (ev.kind == engine::GenEvent::Kind::Text) {
            text += ev.text;
            if (!stream || !mcp.empty()) return;  // with server tools, text goes out when the loop ends
            auto m = format->try_parse(*turn, text, true);
            if (!m) return;
            // What went out is never sent again: text that does not extend it (a pool step begun
            // again on another upstream, or here) adds deltas only once it goes past it.
            if (m->content.size() < parsed.content.size() ||
                m->content.compare(0, parsed.content.size(), parsed.content) != 0)
                return;
            if (m->content.size() > parsed.content.size()) {
                open_message(items.size());
                send_event("response.output_text.delta", {{"item_id", msg_id},
                                                          {"output_index", items.size()},
                                                          {"content_index", 0},
                                                          {"delta", m->content.substr(parsed.content.size())}});
            }
            parsed = std::move(*m);
            return;
        }
        finish(ev);
    }

    void finish(const engine::GenEvent & ev) {
        if (ev.finish == engine::FinishReason::Error || ev.finish == engine::FinishReason::Cancelled) {
            resp["status"] = "failed";
            resp["error"] = {{"code", "server_error"}, {"message", ev.error.empty() ? "generation stopped" : ev.error}};
            if (stream && streaming) {
                if (seq == 0) send_event("response.created", {{"response", resp}});
                send_event("response.failed", {{"response", resp}});
                out->end();
            } else {
                // Nothing went out yet (a pool step that could run nowhere): a plain error.
                Headers h = route_headers();
                if (error_status == 503) h.emplace_back("Retry-After", "1");
                out->send(error_status, "application/json", error_body(error_status, resp["error"]["message"]), h);
            }
            return;
        }
        common_chat_msg msg = pool_call ? *pool_call : format->parse(*turn, text, false);
        pool_call.reset();
        in_tokens += ev.n_prompt;
        out_tokens += ev.n_generated;
        cached_tokens += ev.n_cached;
        if (run_mcp_calls(msg)) return;
        json output = items;
        if (!msg.content.empty() || msg.tool_calls.empty()) {
            output.push_back({{"type", "message"},
                              {"id", msg_id},
                              {"status", "completed"},
                              {"role", "assistant"},
                              {"content", json::array({{{"type", "output_text"},
                                                        {"text", msg.content},
                                                        {"annotations", json::array()},
                                                        {"logprobs", json::array()}}})}});
        }
        for (auto & c : msg.tool_calls) {
            c.id = random_id("call_");
            output.push_back({{"type", "function_call"},
                              {"id", random_id("fc_")},
                              {"call_id", c.id},
                              {"name", c.name},
                              {"arguments", c.arguments},
                              {"status", "completed"}});
        }
        const bool cut = ev.finish == engine::FinishReason::Length;
        resp["status"] = cut ? "incomplete" : "completed";
        resp["incomplete_details"] = cut ? json{{"reason", "max_output_tokens"}} : json(nullptr);
        resp["output"] = output;
        resp["usage"] = {{"input_tokens", in_tokens},
                         {"input_tokens_details", {{"cached_tokens", cached_tokens}}},
                         {"output_tokens", out_tokens},
                         {"output_tokens_details", {{"reasoning_tokens", 0}}},
                         {"total_tokens", in_tokens + out_tokens}};
        msg.role = "assistant";
        conversation.push_back(msg);
        if (!store_it) return deliver(output);
        // Stored responses are durable before the client hears of them.
        store::ResponseRecord r;
        r.id = resp["id"];
        r.tenant = owner;
        r.data = dump(json{{"response", resp}, {"messages", msgs_to_json(conversation)}, {"chain", chain}});
        r.created_ms = resp["created_at"].get<int64_t>() * 1000;
        store::Batch b;
        b.responses.push_back(r);
        store->commit(std::move(b), [self = shared_from_this(), output](store::Status st) {
            net::post(self->strand, [self, output, st] {
                if (!st.ok) {
                    if (self->stream) {
                        self->send_event("error", {{"message", "could not store the response: " + st.error}});
                        self->out->end();
                    } else {
                        self->out->send(503, "application/json",
                                        error_body(503, "could not store the response: " + st.error));
                    }
                    return;
                }
                self->deliver(output);
            });
        });
    }

    // When every call of the step is for a server-side MCP tool, run them (in parallel, on the
    // MCP workers), record mcp_call items and tool results, and take another model step.
    bool run_mcp_calls(common_chat_msg & msg) {
        if (msg.tool_calls.empty() || mcp.empty()) return false;
        for (const auto & c : msg.tool_calls) {
            if (!mcp.count(c.name)) return false;  // a client function call ends the loop
        }
        if (++iterations > 8) return false;
        for (auto & c : msg.tool_calls)
            c.id = random_id("call_");
        msg.role = "assistant";
        conversation.push_back(msg);
        pending = int(msg.tool_calls.size());
        for (const auto & c : msg.tool_calls) {
            const auto & entry = mcp.at(c.name);
            // Each call is an `execute_tool` span, sent along as the call's `traceparent`.
            auto sp =
                std::make_shared<obs::Span>(obs::Span::start("execute_tool " + c.name, obs::SpanKind::client, trace));
            sp->set("gen_ai.operation.name", std::string("execute_tool"));
            sp->set("gen_ai.tool.name", c.name);
            sp->set("gen_ai.tool.call.id", c.id);
            sp->set("gen_ai.tool.type", std::string("extension"));
            sp->set("armada.mcp.server", entry.first);
            sp->set("armada.tenant", owner);
            svc->run_mcp(owner, entry.second, c, sp->context().traceparent(),
                         [self = shared_from_this(), c, label = entry.first, sp](tools::ToolResult r) {
                             if (r.is_error) sp->fail(r.content.substr(0, 200));
                             obs::tracer()->end(std::move(*sp));
                             net::post(self->strand, [self, c, label, r] { self->on_mcp_result(c, label, r); });
                         });
        }
        return true;
    }

    void on_mcp_result(const common_chat_tool_call & c, const std::string & label, const tools::ToolResult & r) {
        items.push_back({{"type", "mcp_call"},
                         {"id", random_id("mcp_")},
                         {"server_label", label},
                         {"name", c.name},
                         {"arguments", c.arguments},
                         {"output", r.is_error ? json(nullptr) : json(r.content)},
                         {"error", r.is_error ? json(r.content) : json(nullptr)}});
        common_chat_msg tm;
        tm.role = "tool";
        tm.tool_call_id = c.id;
        tm.tool_name = c.name;
        tm.content = r.content;
        conversation.push_back(tm);
        if (--pending == 0) next_step();
    }

    void next_step() {
        std::vector<common_chat_msg> msgs;
        if (!instructions.empty()) {
            common_chat_msg sys;
            sys.role = "system";
            sys.content = instructions;
            msgs.push_back(sys);
        }
        msgs.insert(msgs.end(), conversation.begin(), conversation.end());
        text.clear();
        parsed = common_chat_msg();
        std::unique_ptr<engine::GenRequest> req;
        try {
            // After a forced call, the model may answer freely.
            const auto c = choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED ? COMMON_CHAT_TOOL_CHOICE_AUTO : choice;
            turn = std::make_shared<engine::ChatTurn>(format->render(msgs, tools, c, parallel));
        } catch (const std::exception & e) {
            engine::GenEvent ev;
            ev.finish = engine::FinishReason::Error;
            ev.error = e.what();
            return finish(ev);
        }
        if (const std::string p = choose_pool(); !p.empty()) return delegate(p);
        step_pool.clear();
        if (!submit_here()) {
            engine::GenEvent ev;
            ev.finish = engine::FinishReason::Error;
            ev.error = "the server is at capacity";
            finish(ev);
        }
    }

    //! Submits the step to this node's engine; false when it is not taken.
    bool submit_here() {
        std::unique_ptr<engine::GenRequest> req;
        try {
            req = format->request(*turn, so, engine->n_ctx_seq(), engine::choice_seed(so, iterations));
        } catch (const std::exception &) {
            return false;
        }
        req->sink = [self = shared_from_this()](engine::GenEvent && ev) { self->push(std::move(ev)); };
        req->account = account;
        req->tenant = owner;
        req->program = "response:" + chain;
        req->cancelled = cancelled;
        return engine->submit(std::move(req)) == engine::SubmitStatus::Accepted;
    }

    //! The pool the routing rules send this step to ("" : this node).
    std::string choose_pool() const {
        if (!svc->pool_ || pool_local) return {};
        return svc->pool_->route(
            {int64_t(turn->prompt.size()), so.max_tokens, false, owner, model_asked, int64_t(engine->n_ctx_seq())});
    }

    //! X-Armada-Route, on a node with pools: where the first step ran, and a fallback.
    Headers route_headers() const {
        if (!svc->pool_) return {};
        return {{"X-Armada-Route", degraded.empty() ? route : "cpu; degraded=" + degraded}};
    }

    void ensure_stream() {
        if (!stream || streaming) return;
        streaming = true;
        out->start_stream(200, route_headers());
    }

    //! Sends the step to `name`: the rendered prompt, the token limit and sampling, nothing else.
    //! Text and the end come back on the strand, in order.
    void delegate(const std::string & name) {
        step_pool = name;
        text.clear();
        agent::PoolStep step;
        step.pool = name;
        step.turn = turn;
        step.tools = tools;
        step.sampling = so;
        if (step.sampling.max_tokens <= 0) {
            // No limit asked: as many as the pool's context (else this node's) holds. An upstream
            // would otherwise apply its own default (16 tokens on vLLM's /v1/completions).
            const int64_t ctx = svc->pool_->context(name) > 0 ? svc->pool_->context(name) : engine->n_ctx_seq();
            step.sampling.max_tokens = int32_t(std::max<int64_t>(1, ctx - int64_t(turn->prompt.size()) - 1));
        }
        step.seed = engine::choice_seed(so, iterations);
        step.tenant = owner;
        step.cancelled = cancelled;
        if (trace) step.traceparent = trace->traceparent();
        svc->pool_->run(
            std::move(step),
            [self = shared_from_this()](std::string t) {
                net::post(self->strand, [self, t = std::move(t)]() mutable { self->on_pool_text(std::move(t)); });
            },
            [self = shared_from_this()](agent::PoolStepResult r) {
                net::post(self->strand, [self, r = std::move(r)]() mutable { self->on_pool_done(std::move(r)); });
            });
    }

    void on_pool_text(std::string t) {
        ensure_stream();
        if (t.empty()) {
            // An upstream failed midway and the step starts again on the next one: its text so
            // far is void. Deltas already sent stay sent; the final text is in the done events.
            text.clear();
            return;
        }
        if (turn->require_call) {
            // A forced call is no text for the client (from a `response_format` upstream it is
            // bare JSON): it goes out as a function_call item when the step ends.
            text += t;
            return;
        }
        engine::GenEvent ev;
        ev.kind = engine::GenEvent::Kind::Text;
        ev.text = std::move(t);
        on_event(std::move(ev));
    }

    void on_pool_done(agent::PoolStepResult r) {
        engine::GenEvent ev;
        ev.kind = engine::GenEvent::Kind::Done;
        if (r.cancelled) {
            ensure_stream();
            ev.finish = engine::FinishReason::Cancelled;
            ev.error = "the request was cancelled";
            return on_event(std::move(ev));
        }
        if (!r.ran) {
            // The pool could not take it: the step (and the run's later ones) runs here if the
            // prompt fits this node.
            spdlog::warn("responses: pool '{}' did not run a step ({})", step_pool, r.error);
            const bool fits = int64_t(turn->prompt.size()) < int64_t(engine->n_ctx_seq()) - 1;
            if (degraded.empty()) degraded = step_pool + "-unavailable";
            pool_local = true;
            text.clear();
            if (fits && submit_here()) {
                ensure_stream();
                return;
            }
            error_status = 503;
            ev.finish = engine::FinishReason::Error;
            ev.error = fits ? "pool '" + step_pool + "' is unavailable and this node is at capacity"
                            : "pool '" + step_pool + "' is unavailable (" + r.error + ") and the prompt (" +
                                  std::to_string(turn->prompt.size()) + " tokens) does not fit this node's context (" +
                                  std::to_string(engine->n_ctx_seq()) + " tokens)";
            return finish(ev);
        }
        ensure_stream();
        text = std::move(r.text);
        pool_call = std::move(r.call);
        ev.finish = r.finish;
        ev.n_prompt = r.n_prompt;
        ev.n_generated = r.n_generated;
        on_event(std::move(ev));
    }

    void deliver(const json & output) {
        if (!stream) {
            out->send(200, "application/json", dump(resp), route_headers());
            return;
        }
        for (size_t i = 0; i < output.size(); ++i) {
            const json & item = output[i];
            if (item["type"] == "message") {
                open_message(i);
                const std::string full = item["content"][0]["text"];
                if (full.size() > parsed.content.size() &&
                    full.compare(0, parsed.content.size(), parsed.content) == 0) {
                    send_event("response.output_text.delta", {{"item_id", msg_id},
                                                              {"output_index", i},
                                                              {"content_index", 0},
                                                              {"delta", full.substr(parsed.content.size())}});
                }
                send_event("response.output_text.done",
                           {{"item_id", msg_id}, {"output_index", i}, {"content_index", 0}, {"text", full}});
                send_event(
                    "response.content_part.done",
                    {{"item_id", msg_id}, {"output_index", i}, {"content_index", 0}, {"part", item["content"][0]}});
            } else if (item["type"] != "function_call") {
                send_event("response.output_item.added", {{"output_index", i}, {"item", item}});
            } else {
                json added = item;
                added["arguments"] = "";
                added["status"] = "in_progress";
                send_event("response.output_item.added", {{"output_index", i}, {"item", added}});
                send_event("response.function_call_arguments.delta",
                           {{"item_id", item["id"]}, {"output_index", i}, {"delta", item["arguments"]}});
                send_event("response.function_call_arguments.done",
                           {{"item_id", item["id"]}, {"output_index", i}, {"arguments", item["arguments"]}});
            }
            send_event("response.output_item.done", {{"output_index", i}, {"item", item}});
        }
        send_event(resp["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", resp}});
        out->end();
    }
};

ResponsesService::ResponsesService(std::shared_ptr<engine::Model> model, engine::EngineSet & engine,
                                   store::Store & store, net::any_io_executor io, tools::McpClients & mcp,
                                   tools::ClientCalls & calls, int discover_budget_ms)
    : model_(std::move(model)),
      engine_(engine),
      store_(store),
      io_(std::move(io)),
      format_(model_),
      mcp_(mcp),
      calls_(calls),
      discover_budget_ms_(discover_budget_ms) {}

ResponsesService::~ResponsesService() = default;

void ResponsesService::create(const json & body, const Caller & caller, std::shared_ptr<Responder> out,
                              std::optional<obs::TraceContext> trace) {
    auto run = std::make_shared<Run>(io_);
    run->out = out;
    run->trace = std::move(trace);
    run->store = &store_;
    run->format = &format_;
    run->owner = caller.tenant;
    run->account = caller.account;
    run->stream = get_bool(body, "stream", false);
    run->store_it = get_bool(body, "store", true);
    run->msg_id = random_id("msg_");
    run->svc = this;
    run->engine = &engine_;
    run->model_asked = get_string(body, "model");
    if (!engine_.has_room()) throw at_capacity();

    const std::string prev = get_string(body, "previous_response_id");
    if (!prev.empty()) {
        auto rec = store_.response(prev);
        if (!rec || rec->tenant != caller.tenant) {
            throw ApiError(404, "no stored response with id '" + prev + "'", "previous_response_id");
        }
        const json data = json::parse(rec->data);
        run->conversation = msgs_from_json(data.value("messages", json::array()));
        run->chain = common::string_field(data, "chain").value_or(prev);
    }
    if (!body.contains("input") || body["input"].is_null()) throw ApiError(400, "'input' is required", "input");
    append_input(body["input"], run->conversation);

    json tools_echo = json::array();
    std::vector<std::pair<std::string, tools::McpServerSpec>> servers;  // (label, server)
    if (body.contains("tools") && !body["tools"].is_null()) {
        if (!body["tools"].is_array()) throw ApiError(400, "'tools' must be a list", "tools");
        for (const auto & t : body["tools"]) {
            const std::string type = t.is_object() ? get_string(t, "type") : "";
            if (type == "mcp") {
                servers.push_back(mcp_server(t));
                tools_echo.push_back(t);
                continue;
            }
            if (type != "function") throw ApiError(400, "tool type '" + type + "' is not supported", "tools");
            common_chat_tool ct{get_string(t, "name"), get_string(t, "description"),
                                dump(t.contains("parameters") ? t["parameters"] : json{{"type", "object"}})};
            if (ct.name.empty()) throw ApiError(400, "a function tool needs a name", "tools");
            check_tool_schema(json::parse(ct.parameters), ct.name);
            run->tools.push_back(ct);
            tools_echo.push_back(t);
        }
    }
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
        const json & tc = body["tool_choice"];
        if (tc == "none")
            run->choice = COMMON_CHAT_TOOL_CHOICE_NONE;
        else if (tc == "required")
            run->choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
        else if (tc.is_object())
            run->named_tool = get_string(tc, "name");
        else if (tc != "auto")
            throw ApiError(400, "'tool_choice' must be auto, none, required or a named function", "tool_choice");
    }
    run->instructions = get_string(body, "instructions");
    run->parallel = get_bool(body, "parallel_tool_calls", true);
    engine::SamplingOptions so;
    so.temperature = float(get_number(body, "temperature", 0.8));
    so.top_p = float(get_number(body, "top_p", 0.95));
    const int64_t max_out = get_int(body, "max_output_tokens", -1);
    if (max_out == 0 || max_out < -1) throw ApiError(400, "'max_output_tokens' must be positive", "max_output_tokens");
    so.max_tokens = int32_t(std::min<int64_t>(max_out, INT32_MAX));
    if (so.temperature < 0 || so.temperature > 2)
        throw ApiError(400, "'temperature' must be between 0 and 2", "temperature");
    run->so = so;
    const std::string resp_id = random_id("resp_");
    if (run->chain.empty()) run->chain = resp_id;
    run->resp = {{"id", resp_id},
                 {"object", "response"},
                 {"created_at", common::unix_s()},
                 {"status", "in_progress"},
                 {"error", nullptr},
                 {"incomplete_details", nullptr},
                 {"instructions", run->instructions.empty() ? json(nullptr) : json(run->instructions)},
                 {"model", model_->id()},
                 {"output", json::array()},
                 {"parallel_tool_calls", run->parallel},
                 {"previous_response_id", prev.empty() ? json(nullptr) : json(prev)},
                 {"store", run->store_it},
                 {"temperature", so.temperature},
                 {"top_p", so.top_p},
                 {"max_output_tokens", max_out < 0 ? json(nullptr) : json(max_out)},
                 {"tool_choice", body.value("tool_choice", json("auto"))},
                 {"tools", tools_echo},
                 {"text", {{"format", {{"type", "text"}}}}},
                 {"metadata", json::object()},
                 {"usage", nullptr}};
    if (servers.empty()) return begin(run);

    // The servers a client names are asked for their tools on the client-call workers, never on
    // an I/O thread, within the discovery budget, and at most a few at a time per tenant.
    auto clients = std::make_shared<std::vector<std::pair<std::string, std::shared_ptr<tools::McpClient>>>>();
    for (const auto & [label, spec] : servers)
        clients->emplace_back(label, mcp_.get(caller.tenant, spec));
    // One budget for every server the request names, counted from now (a busy pool's wait too).
    const auto t0 = std::chrono::steady_clock::now();
    const bool started = calls_.try_run(caller.tenant, [this, run, clients, servers, t0] {
        std::string err;
        std::vector<std::pair<std::string, std::vector<tools::HttpToolSpec>>> listed;
        for (size_t i = 0; i < clients->size(); ++i) {
            listed.emplace_back((*clients)[i].first, std::vector<tools::HttpToolSpec>{});
            const int left =
                discover_budget_ms_ -
                int(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
                        .count());
            if (err.empty() && left <= 0) err = "MCP servers: no answer within the time allowed";
            if (err.empty())
                err = (*clients)[i].second->list_tools(listed.back().second, servers[i].second.allowed_tools, left);
        }
        net::post(run->strand, [this, run, clients, listed = std::move(listed), err] {
            try {
                if (!err.empty()) throw ApiError(424, err, "tools");
                for (size_t i = 0; i < listed.size(); ++i)
                    add_mcp_tools(*run, listed[i].first, (*clients)[i].second, listed[i].second);
                begin(run);
            } catch (const ApiError & e) {
                Headers h;
                if (e.retry_after_s > 0) h.emplace_back("Retry-After", std::to_string(e.retry_after_s));
                run->out->send(e.status, "application/json", error_body(e.status, e.what(), e.param, e.code), h);
            } catch (const std::exception & e) {
                run->out->send(400, "application/json", error_body(400, e.what()));
            }
        });
    });
    if (!started) {
        ApiError e(429,
                   "too many calls to MCP servers are in flight for this tenant (at most " +
                       std::to_string(calls_.per_tenant()) + "); retry shortly",
                   "tools", "rate_limit_exceeded");
        e.retry_after_s = 1;
        throw e;
    }
}

void ResponsesService::begin(const std::shared_ptr<Run> & run) {
    if (!run->named_tool.empty()) {
        std::erase_if(run->tools, [&](const common_chat_tool & t) { return t.name != run->named_tool; });
        if (run->tools.empty()) throw ApiError(400, "'tool_choice' names an unknown tool", "tool_choice");
        run->choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    }
    std::vector<common_chat_msg> msgs;
    if (!run->instructions.empty()) {
        common_chat_msg sys;
        sys.role = "system";
        sys.content = run->instructions;
        msgs.push_back(sys);
    }
    msgs.insert(msgs.end(), run->conversation.begin(), run->conversation.end());
    run->turn = std::make_shared<engine::ChatTurn>(format_.render(msgs, run->tools, run->choice, run->parallel));
    auto cancelled = run->cancelled;
    if (const std::string p = run->choose_pool(); !p.empty()) {
        // The stream starts with the first thing the pool sends, so its headers can say where
        // the step ran (or that it fell back here).
        run->route = p;
        run->delegate(p);
        run->out->on_close([cancelled, eng = &engine_] {
            cancelled->store(true);
            eng->wake();
        });
        return;
    }
    auto req = format_.request(*run->turn, run->so, engine_.n_ctx_seq(), engine::choice_seed(run->so, 0));
    req->sink = [run](engine::GenEvent && ev) { run->push(std::move(ev)); };
    req->account = run->account;
    req->tenant = run->owner;
    req->program = "response:" + run->chain;
    req->cancelled = cancelled;
    const auto st = engine_.submit(std::move(req));
    if (st == engine::SubmitStatus::QueueFull) throw at_capacity();
    if (st != engine::SubmitStatus::Accepted) {
        ApiError e(503, "the server is shutting down", {}, "unavailable");
        e.retry_after_s = 1;
        throw e;
    }
    run->out->on_close([cancelled, eng = &engine_] {
        cancelled->store(true);
        eng->wake();
    });
    run->ensure_stream();
}

std::pair<std::string, tools::McpServerSpec> ResponsesService::mcp_server(const json & t) {
    tools::McpServerSpec spec;
    spec.url = get_string(t, "server_url");
    const std::string label = get_string(t, "server_label", spec.url);
    if (spec.url.empty()) throw ApiError(400, "an mcp tool needs server_url", "tools");
    if (spec.url.rfind("http://", 0) != 0 && spec.url.rfind("https://", 0) != 0)
        throw ApiError(400, "an mcp tool's server_url must be http:// or https://", "tools");
    if (t.contains("allowed_tools") && t["allowed_tools"].is_array()) {
        for (const auto & a : t["allowed_tools"]) {
            if (a.is_string()) spec.allowed_tools.push_back(a.get<std::string>());
        }
    }
    if (t.contains("headers") && !t["headers"].is_null()) {
        if (!t["headers"].is_object()) throw ApiError(400, "an mcp tool's headers must be an object", "tools");
        for (const auto & [k, v] : t["headers"].items()) {
            if (!v.is_string()) throw ApiError(400, "mcp header '" + k + "' must be a string", "tools");
            // The server's environment and files are the operator's: a client cannot name them.
            if (agent::has_secret_reference(v.get<std::string>())) {
                throw ApiError(400,
                               "mcp header '" + k +
                                   "': ${env:...} and ${file:...} are expanded only in the operator's agent files "
                                   "(--agents); send the value itself",
                               "tools");
            }
            spec.headers[k] = v.get<std::string>();
        }
    }
    spec.expand_secrets = false;
    return {label, spec};
}

void ResponsesService::add_mcp_tools(Run & run, const std::string & label,
                                     const std::shared_ptr<tools::McpClient> & client,
                                     const std::vector<tools::HttpToolSpec> & listed) {
    json list = json::array();
    for (const auto & l : listed) {
        run.tools.push_back({l.name, l.description, l.parameters});
        run.mcp[l.name] = {label, client};
        list.push_back({{"name", l.name}, {"description", l.description}, {"input_schema", json::parse(l.parameters)}});
    }
    run.items.push_back(
        {{"type", "mcp_list_tools"}, {"id", random_id("mcpl_")}, {"server_label", label}, {"tools", list}});
}

void ResponsesService::run_mcp(const std::string & tenant, const std::shared_ptr<tools::McpClient> & client,
                               const common_chat_tool_call & call, const std::string & traceparent,
                               std::function<void(tools::ToolResult)> done) {
    auto shared_done = std::make_shared<std::function<void(tools::ToolResult)>>(std::move(done));
    const bool queued = calls_.run(tenant, [client, call, traceparent, shared_done] {
        (*shared_done)(client->call_tool(call.name, call.arguments, call.id, traceparent));
    });
    if (!queued) {
        tools::ToolResult r;
        r.is_error = true;
        r.content = "tool error: too many MCP calls are waiting for this tenant";
        (*shared_done)(std::move(r));
    }
}

void ResponsesService::get(const std::string & id, const std::string & tenant, const std::shared_ptr<Responder> & out) {
    auto rec = store_.response(id);
    if (!rec || rec->tenant != tenant) {
        throw ApiError(404, "no stored response with id '" + id + "'");
    }
    out->send(200, "application/json", dump(json::parse(rec->data)["response"]));
}

void ResponsesService::erase(const std::string & id, const std::string & tenant,
                             const std::shared_ptr<Responder> & out) {
    auto rec = store_.response(id);
    if (!rec || rec->tenant != tenant) {
        throw ApiError(404, "no stored response with id '" + id + "'");
    }
    store::Batch b;
    b.erase_responses.push_back(id);
    store_.commit(std::move(b), [out, id](store::Status st) {
        if (!st.ok) {
            out->send(503, "application/json", error_body(503, "could not delete: " + st.error));
            return;
        }
        out->send(200, "application/json", dump(json{{"id", id}, {"object", "response"}, {"deleted", true}}));
    });
}

}  // namespace armada::api
