#include "gateway/generation_router.h"

#include "api/errors.h"
#include "gateway/pool_request.h"
#include "gateway/replies.h"
#include "routing/facts.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <set>

namespace armada::gateway {

using json = nlohmann::json;

void GenerationRouter::route(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                             const api::Caller & caller, UsageScan * usage) {
    const bool chat = req.path == "/v1/chat/completions";
    const json body = json::parse(req.body, nullptr, false);
    const auto rcp = routing_();
    const auto & rc = *rcp;
    routing::TargetContexts contexts;
    contexts.cpu = view_.cpu_context();
    for (const auto & name : pools_.names())
        contexts.pools.emplace_back(name, pools_.context(name));
    const int64_t cpu_ctx = contexts.cpu;
    routing::Asked asked;
    asked.tenant = caller.tenant_name;
    asked.admin = caller.admin;
    // The tenant's class; a client header may lower it, or raise it as far as the tenant may
    // (an admin key, any class).
    asked.latency = req.header("x-armada-latency");
    if (body.is_object()) {
        routing::read_body(body, asked);
        // The count matters only up to the smallest number a decision compares it with.
        if (counter_) {
            const int64_t enough = routing::tokens_that_matter(rc.routes, contexts);
            asked.prompt_tokens =
                (chat ? counter_->chat(body, req.body.size(), enough) : counter_->completion(body)).value_or(-1);
        }
    }
    std::string why;
    const auto facts = routing::route_facts(rc, asked, why);
    if (!facts) {
        const bool known =
            std::find(rc.latency_classes.begin(), rc.latency_classes.end(), asked.latency) != rc.latency_classes.end();
        return send_error(out, known ? 403 : 400, why, 0, "latency_class");
    }
    const routing::RouteFacts & f = *facts;
    const routing::GenerationPlan plan = routing::plan_generation(rc.routes, f, body.is_object(), contexts);
    const std::string & target = plan.target;
    const std::string & rule = plan.rule;
    auto first_node = [&]() { return chat ? affinity_.node_for(req, caller) : std::nullopt; };
    if (target == "cpu") {
        if (!routing::prompt_fits(f.prompt_tokens, cpu_ctx))
            return send_error(out, 413,
                              "the prompt has " + std::to_string(f.prompt_tokens) +
                                  " tokens, more than any target holds (the CPU nodes: " + std::to_string(cpu_ctx) +
                                  " per sequence); shorten the input",
                              0, "context_length_exceeded");
        counts_.routed("cpu", rule);
        return relay_.by_load(req, out, first_node(), usage,
                              {{"X-Armada-Route", "cpu"}, {"X-Armada-Route-Rule", rule}});
    }
    std::string reason = "context";
    if (routing::prompt_fits(f.prompt_tokens, pools_.context(target))) {
        // Checked as a node would check it, once, before any upstream is taken: what a node
        // refuses, the pool path refuses with the same words.
        PoolRequestOptions po;
        po.chat = chat;
        po.context = pools_.context(target);
        try {
            po.model = "check";
            (void)pool_request_body(body, po);
        } catch (const api::ApiError & e) {
            return out->send(e.status, "application/json", api::error_body(e.status, e.what(), e.param, e.code));
        }
        std::set<std::string> tried;
        // llama.cpp's own constraint fields: only upstreams of that dialect honour them.
        const bool llama_grammar = body.contains("grammar") || body.contains("json_schema");
        for (;;) {
            routing::PoolSet::Unavailable why = routing::PoolSet::Unavailable::none;
            auto l = pools_.acquire(target, tried, llama_grammar, why);
            if (!l) {
                if (tried.empty()) reason = why == routing::PoolSet::Unavailable::full ? "full" : "down";
                break;
            }
            // Only the fields Armada knows, with the model the upstream serves (the client named
            // the cluster's), and the tenant's cache salt where the upstream takes one.
            po.model = l->model;
            po.cache_salt = l->cache_salt ? routing::tenant_cache_salt(caller.tenant) : std::string();
            const std::string text = pool_request_body(body, po);
            RelayTarget t;
            t.base = l->url;
            t.headers = {{"content-type", "application/json"}};
            if (!l->key.empty()) t.headers.emplace_back("authorization", "Bearer " + l->key);
            for (const char * h : {"accept", "traceparent", "tracestate", "x-request-id"}) {
                if (auto v = req.header(h); !v.empty()) t.headers.emplace_back(h, v);
            }
            t.body = &text;
            t.timeout_ms = l->timeout_ms;
            t.idle_ms = l->timeout_ms;  // a stream that hangs after its head counts as failed
            t.extra = {{"X-Armada-Route", target}, {"X-Armada-Route-Rule", rule}};
            t.may_resend = true;  // a generation has no side effect: another target may take it
            t.hold_errors = true;
            t.scrub = true;
            const Relayed r = relay_to(t, req, out, usage);
            const bool refused = r.status >= 500 || r.status == 401 || r.status == 403 || r.status == 404;
            const routing::PoolOutcome o = r.cut || (!r.delivered && refused) ? routing::PoolOutcome::failed
                                           : r.client_gone                    ? routing::PoolOutcome::cancelled
                                           : r.status == 0                    ? routing::PoolOutcome::failed
                                           : r.status == 429                  ? routing::PoolOutcome::busy
                                                                              : routing::PoolOutcome::ok;
            pools_.release(*l, o, r.head_s);
            if (r.delivered || r.client_gone) {
                if (r.delivered) counts_.routed(target, rule);
                return;
            }
            tried.insert(l->url);
            reason = o == routing::PoolOutcome::busy ? "full" : "failed";
        }
    }
    if (routing::prompt_fits(f.prompt_tokens, cpu_ctx)) {
        counts_.fell_back(target, reason);
        counts_.routed("cpu", rule);
        return relay_.by_load(
            req, out, first_node(), usage,
            {{"X-Armada-Route", "cpu; degraded=" + target + "-unavailable"}, {"X-Armada-Route-Rule", rule}});
    }
    if (reason == "context")
        return send_error(out, 413,
                          "the prompt has " + std::to_string(f.prompt_tokens) +
                              " tokens, more than any target holds (pool " + target + ": " +
                              std::to_string(pools_.context(target)) + ", the CPU nodes: " + std::to_string(cpu_ctx) +
                              " per sequence); shorten the input",
                          0, "context_length_exceeded");
    send_error(out, 503,
               "pool " + target + " is " + (reason == "full" ? "full" : "unavailable") + ", and the prompt's " +
                   std::to_string(f.prompt_tokens) + " tokens do not fit the CPU nodes (" + std::to_string(cpu_ctx) +
                   " per sequence); retry shortly",
               2, "pool_unavailable");
}

}  // namespace armada::gateway
