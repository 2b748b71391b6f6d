#include "gateway/relay.h"

#include "gateway/checks.h"
#include "gateway/pool_request.h"
#include "gateway/replies.h"

#include <spdlog/spdlog.h>
#include <strings.h>

#include <cctype>
#include <chrono>
#include <cstdlib>

namespace armada::gateway {

void UsageScan::feed(std::string_view chunk) {
    for (char ch : chunk) {
        if (ch == '\n' && newline_) ++events_;  // an event of a stream ends with a blank line
        newline_ = ch == '\n';
    }
    tail_.append(chunk);
    static const std::string kKey = "\"total_tokens\":";
    for (size_t at = 0; (at = tail_.find(kKey, at)) != std::string::npos; at += kKey.size()) {
        size_t i = at + kKey.size();
        while (i < tail_.size() && tail_[i] == ' ')
            ++i;
        const size_t start = i;
        while (i < tail_.size() && std::isdigit(static_cast<unsigned char>(tail_[i])))
            ++i;
        if (i == tail_.size()) break;  // the number may go on in the next piece
        if (i > start) total_ = std::strtoll(tail_.c_str() + start, nullptr, 10);
    }
    if (tail_.size() > 64) tail_.erase(0, tail_.size() - 64);
}

Relayed relay_to(const RelayTarget & t, const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                 UsageScan * usage) {
    Relayed res;
    bool streaming = false;
    PoolStreamScrubber scrubber;
    auto cancel = std::make_shared<routing::CancelToken>();
    out->on_close([cancel] { cancel->cancel(); });
    const auto t0 = std::chrono::steady_clock::now();
    auto r = routing::forward(
        t.base, req.method, target_of(req), t.headers, *t.body, t.timeout_ms,
        [&](const routing::UpstreamReply & head) {
            res.head_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            for (const auto & [k, val] : head.headers) {
                if (k.size() == 12 && strcasecmp(k.c_str(), "content-type") == 0 &&
                    val.rfind("text/event-stream", 0) == 0)
                    streaming = true;
            }
            if (streaming) {
                api::Headers h = t.extra;
                for (const auto & [k, val] : head.headers) {
                    if (strcasecmp(k.c_str(), "content-type") != 0) h.emplace_back(k, val);
                }
                out->start_stream(head.status, std::move(h));
            }
            return streaming;
        },
        [&](std::string_view chunk) {
            if (out->closed()) return false;
            if (usage) usage->feed(chunk);
            if (t.scrub) {
                if (std::string s = scrubber.feed(chunk); !s.empty()) out->write(std::move(s));
            } else {
                out->write(std::string(chunk));
            }
            return true;
        },
        cancel, t.idle_ms);
    if (streaming && t.scrub && !out->closed()) {
        if (std::string s = scrubber.flush(); !s.empty()) out->write(std::move(s));
    }
    if (!streaming) res.head_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.invalid) {
        // Checked before routing, so this is a last guard: nothing went to the upstream.
        send_error(out, 400, "the request holds bytes the gateway does not pass on: " + r.error);
        res.delivered = true;
        return res;
    }
    res.status = r.status;
    res.reached = r.sent;
    res.client_gone = cancel->cancelled() || out->closed();
    if (usage) usage->status = r.status != 0 ? r.status : (streaming ? 200 : 0);
    if (r.status == 0) {
        if (streaming) {
            out->end();  // the upstream went away mid-stream: the client sees the stream end
            res.delivered = true;
            return res;
        }
        if (res.client_gone) {
            res.delivered = true;  // nobody to answer, and nothing to send elsewhere
            return res;
        }
        spdlog::warn("gateway: {} did not answer {} {}: {}", t.base, req.method, req.path, r.error);
        if (r.sent && req.method != "GET" && !t.may_resend) {
            // It may have acted on it: sending it to another node could do it twice.
            send_error(out, 502,
                       "the node did not answer; the request may or may not have taken effect (check before "
                       "retrying)",
                       0, "upstream_failed");
            res.delivered = true;
        }
        return res;
    }
    if (r.streamed) {
        out->end();
        res.delivered = true;
        res.cut = !r.error.empty() && !res.client_gone;
        return res;
    }
    // Held: busy (429), failed (5xx), or refusing the upstream's own key or model name
    // (401, 403, 404: a fault of the pool's settings, not of the client's request).
    if (t.hold_errors && (r.status == 429 || r.status >= 500 || r.status == 401 || r.status == 403 || r.status == 404))
        return res;
    std::string ctype = "application/json";
    api::Headers h = t.extra;
    for (const auto & [k, val] : r.headers) {
        if (strcasecmp(k.c_str(), "content-type") == 0)
            ctype = val;
        else
            h.emplace_back(k, val);
    }
    if (usage) usage->feed(r.body);
    if (t.scrub) r.body = scrub_pool_json(r.body);
    out->send(r.status, ctype, std::move(r.body), std::move(h));
    res.delivered = true;
    return res;
}

Relayed NodeRelay::relay(const std::string & node_name, const api::HttpRequest & req,
                         const std::shared_ptr<api::Responder> & out, UsageScan * usage, int timeout_ms,
                         const api::Headers & extra) {
    auto v = view_.node(node_name);
    if (!v) return {};
    RelayTarget t;
    t.base = v->load.url;
    t.headers = pass_headers(req);
    t.body = &req.body;
    t.timeout_ms = timeout_ms;
    t.extra = extra;
    return relay_to(t, req, out, usage);
}
void NodeRelay::by_load(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                        std::optional<std::string> first, UsageScan * usage, const api::Headers & extra) {
    std::set<std::string> tried;  // a third attempt must not go back to a node that failed
    for (int attempt = 0; attempt < 3; ++attempt) {
        auto n = attempt == 0 && first ? first : view_.by_load({}, tried);
        if (!n) break;
        const Relayed r = relay(*n, req, out, usage, 600000, extra);
        if (r.delivered) return;
        tried.insert(*n);
        // A node that took the request and said nothing may be hung, not gone: it keeps its
        // sessions (forgetting it would route them around a live holder).
        if (!r.reached) view_.forget(*n);
    }
    send_error(out, 503, "no node of the cluster is ready to take this request; retry shortly", 2, "no_node");
}

}  // namespace armada::gateway
