#include "gateway/session_api.h"

#include "cluster/cluster_config.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "gateway/checks.h"
#include "gateway/replies.h"
#include "gateway/session_lookup.h"
#include "net/sse.h"
#include "store/new_session.h"

#include <spdlog/spdlog.h>
#include <strings.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

namespace armada::gateway {

namespace {

using json = nlohmann::json;

//! Session reads and changes answer at once on a node: one that says nothing for this long is
//! taken as hung (a relay's default waits 10 minutes, for generations).
constexpr int kSessionRelayMs = 10000;

//! A node's event stream says something at least every 5 s (a comment when quiet): one
//! silent for this long comes from a hung node, and the gateway looks up the holder again.
constexpr int kEventsIdleMs = 15000;

std::string route_key(const api::Caller & caller, const std::string & id) {
    return "armada:t:" + caller.tenant + ":session:" + id + ":route";
}

}  // namespace

SessionApi::StreamSlot::StreamSlot(SessionApi & a, std::string t) : api(a), tenant(std::move(t)) {
    std::lock_guard lk(api.streams_mu_);
    auto & n = api.streams_[tenant];
    if (n < api.o_.max_streams_per_tenant) {
        ++n;
        held = true;
    }
}

SessionApi::StreamSlot::~StreamSlot() {
    std::lock_guard lk(api.streams_mu_);
    auto it = api.streams_.find(tenant);
    if (it == api.streams_.end()) return;
    if (held) --it->second;
    if (it->second == 0) api.streams_.erase(it);
}

void SessionApi::create(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                        const Authed & authed, const std::string & agent_id) {
    const api::Caller & caller = authed.caller;
    std::string input;
    if (!req.body.empty()) {
        const json body = json::parse(req.body, nullptr, false);
        if (!body.is_object()) return send_error(out, 400, "the body must be a JSON object");
        for (const char * k : {"input", "content"}) {
            if (body.contains(k) && !body[k].is_null()) {
                if (!body[k].is_string()) return send_error(out, 400, std::string("'") + k + "' must be a string");
                input = body[k].get<std::string>();
                break;
            }
        }
    }
    // The agent must exist for this caller: a node answers that as it would for itself.
    api::HttpRequest probe;
    probe.method = "GET";
    probe.path = "/v1/agents/" + agent_id;
    probe.headers = req.headers;
    std::optional<routing::UpstreamReply> seen, last_refusal;
    std::set<std::string> tried;
    for (int attempt = 0; attempt < 3 && !seen; ++attempt) {
        auto n = view_.by_load({}, tried);
        if (!n) break;
        auto v = view_.node(*n);
        if (!v) break;
        auto r = routing::forward(v->load.url, "GET", probe.path, pass_headers(probe), "", 10000);
        if (r.status == 0) {
            tried.insert(*n);
            if (!r.sent) view_.forget(*n);  // unreachable; a hung node keeps its sessions
            continue;
        }
        // A node that began draining (or is still loading) since its last report refuses
        // with 503: another node answers for the cluster.
        if (r.status == 503) {
            tried.insert(*n);
            last_refusal = std::move(r);
            continue;
        }
        seen = std::move(r);
    }
    if (!seen && last_refusal) seen = std::move(last_refusal);
    if (!seen) return send_error(out, 503, "no node of the cluster is ready; retry shortly", 2, "no_node");
    if (seen->status == 404) return send_error(out, 404, "no agent with id '" + agent_id + "'");
    if (seen->status != 200) {
        // The node's answer as it gave it, with its Retry-After.
        std::string ctype = "application/json";
        api::Headers h;
        for (const auto & [k, val] : seen->headers) {
            if (strcasecmp(k.c_str(), "content-type") == 0)
                ctype = val;
            else
                h.emplace_back(k, val);
        }
        out->send(seen->status, ctype, seen->body, std::move(h));
        return;
    }
    const std::string cell = o_.cell.empty() ? view_.pick_cell(caller.tenant) : o_.cell;
    if (cell.empty()) {
        ++counts_.refused_full;
        return send_error(out, 503,
                          "every cell is at its water level (the room above it is kept for the sessions of a cell "
                          "that fails); retry shortly",
                          5, "cluster_full");
    }
    const std::string id = store::new_session_id();
    // A tenant whose tokens of the minute are spent (its sessions' model steps count) gets no
    // new session; the one token taken here stands for the request.
    if (authed.quota.tpm > 0) {
        cluster::Quotas::TokenHold hold;
        if (auto r = quotas_.reserve_tokens(caller.tenant, authed.quota.tpm, 1, hold))
            return refuse(out, caller, *r, counts_);
    }
    if (auto r = quotas_.live_session(caller.tenant, id, authed.quota.live_sessions,
                                      [&] { return store_.open_ids_of(caller.tenant, ended_states()); }))
        return refuse(out, caller, *r, counts_);
    auto b = store::new_session_batch(id, agent_id, caller.tenant, input, cell, common::wall_ms());
    if (auto st = commit(std::move(b)); !st.ok) {
        quotas_.forget_session(caller.tenant, id);
        return send_error(out, 503, "could not store the session: " + st.error, 2);
    }
    // The row is durable: the brain finds it at its next reconcile even if this is lost.
    json place = {{"session", id}};
    if (const std::string tp = req.header("traceparent"); !tp.empty()) place["traceparent"] = tp;
    // Acknowledged before the 201 while NATS answers (the brain takes it at once, even if
    // NATS then restarts); while it has not answered a publish in time lately, sent without
    // waiting, so a NATS that hangs does not hold every create.
    const int64_t slow_at = nats_slow_at_.load();
    std::string e;
    if (slow_at > 0 && common::steady_ms() - slow_at < 10000) {
        e = js_.publish_async(cluster::place_subject(cell), place.dump(), id);
    } else {
        e = js_.publish(cluster::place_subject(cell), place.dump(), id, 1000);
        if (!e.empty()) nats_slow_at_ = common::steady_ms();
    }
    if (!e.empty())
        spdlog::warn("gateway: place request for {} to {}: {} (the cell's reconcile places it)", id, cell, e);
    out->send(201, "application/json", json{{"id", id}, {"object", "session"}}.dump());
}

//! Writes `b`, clearing an earlier failure of the store first (PostgreSQL restarted), and
//! tries once more after a pause if the write fails.
store::Status SessionApi::commit(store::Batch b) {
    store::Status st;
    for (int attempt = 0; attempt < 2; ++attempt) {
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(common::jittered_ms(500)));
        if (!store_.writable().ok) store_.recover();
        st = store_.commit_sync(b);
        if (st.ok || st.fenced) return st;
    }
    return st;
}
//! The session's row; nullopt with `unavailable` set when the store cannot be read now (so
//! that a client is told to retry, not that its session does not exist).
std::optional<store::SessionRecord> SessionApi::lookup(const std::string & id, bool & unavailable) {
    return lookup_session(
        store_, id,
        [this] {
            store::Batch probe;
            probe.probe = true;
            return commit(std::move(probe)).ok;
        },
        unavailable);
}

void SessionApi::route(api::HttpRequest & req, const std::shared_ptr<api::Responder> & out, const api::Caller & caller,
                       const std::string & id, const std::string & sub) {
    // Reads go to the node the route cache names (written after a PostgreSQL lookup for this
    // tenant); changes always ask PostgreSQL, so a stale route never moves a session.
    if (redis_ && req.method == "GET" && sub.empty()) {
        if (auto n = redis_->get(route_key(caller, id)); n && view_.node(*n)) {
            ++counts_.route_hits;
            if (relay_.relay(*n, req, out, nullptr, kSessionRelayMs).delivered) return;
            redis_->del(route_key(caller, id));
        }
    }
    bool unavailable = false;
    auto rec = lookup(id, unavailable);
    if (unavailable)
        return send_error(out, 503, "the cluster's state store cannot be reached; retry shortly", 2,
                          "store_unavailable");
    if (!rec || rec->owner != caller.tenant || rec->agent_id.rfind('@', 0) == 0)
        return send_error(out, 404, "no session with id '" + id + "'");
    if (sub == "events" && req.method == "GET") {
        // Each open stream holds a worker thread and two descriptors: a tenant has its cap.
        StreamSlot slot(*this, caller.tenant);
        if (!slot.held) {
            ++counts_.refused_streams;
            return send_error(out, 429,
                              "this tenant has " + std::to_string(o_.max_streams_per_tenant) +
                                  " event streams open through this gateway, its limit; close one or retry later",
                              5, "too_many_streams");
        }
        return events(req, out, id);
    }
    // A request to a session goes to its node; one not placed yet, or whose node is gone
    // (its lease ended), goes to any node, which answers from the store (or takes the session
    // over). A node that holds its lease but does not answer keeps the session: another node
    // taking it would fence a live owner behind its cell's back. The client retries.
    std::string silent;
    for (int attempt = 0; attempt < 3; ++attempt) {
        silent.clear();  // what the last attempt found decides the error
        auto h = view_.holder(*rec);
        if (h && redis_) redis_->set(route_key(caller, id), *h, 30000);
        auto n = h ? h : view_.by_load(rec->cell);
        if (!n) n = view_.by_load();
        if (!n) break;
        const Relayed r = relay_.relay(*n, req, out, nullptr, kSessionRelayMs);
        if (r.delivered) return;
        if (h) {
            silent = *h;
        } else if (!r.reached) {
            view_.forget(*n);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        auto again = lookup(id, unavailable);
        if (again) rec = again;
    }
    if (!silent.empty())
        return send_error(out, 503,
                          "the node holding session '" + id +
                              "' does not answer; retry shortly (if it is gone, the session moves once its "
                              "lease ends)",
                          2, "node_unavailable");
    send_error(out, 503, "no node of the cluster is ready to take this request; retry shortly", 2, "no_node");
}

//! The session's event stream, from whichever node holds it; when it moves (its node died,
//! hung or was fenced) the stream goes on from the new node with Last-Event-ID. Only whole
//! events reach the client, so a reconnect never repeats or splits one.
void SessionApi::events(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                        const std::string & id) {
    std::string last = req.header("last-event-id");
    if (last.empty()) last = req.param("last_event_id");
    bool started = false;
    int64_t waiting_since = 0;
    for (;;) {
        if (out->closed()) return;
        bool unavailable = false;
        auto rec = lookup(id, unavailable);
        if (unavailable) {
            // The store is restarting: the stream waits for it.
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
            continue;
        }
        if (!rec) {
            if (started)
                out->end();
            else
                send_error(out, 404, "no session with id '" + id + "'");
            return;
        }
        const bool ended = std::find(ended_states().begin(), ended_states().end(), rec->state) != ended_states().end();
        auto n = view_.holder(*rec);
        if (!n && ended) n = view_.by_load();
        if (!n) {
            // Not placed yet, or its node died and the brain has not moved it yet.
            if (waiting_since == 0) waiting_since = common::steady_ms();
            if (common::steady_ms() - waiting_since > 120000) {
                if (started)
                    out->end();
                else
                    send_error(out, 503, "the session has no node yet; retry shortly", 2, "no_node");
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            continue;
        }
        waiting_since = 0;
        auto v = view_.node(*n);
        if (!v) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            continue;
        }
        routing::HeaderList h = pass_headers(req);
        if (!last.empty()) h.emplace_back("Last-Event-ID", last);
        std::string target = "/v1/sessions/" + id + "/events";
        net::SseReader reader({.every_block = true});  // each whole event passes as it came
        bool refused = false;
        // The client going away ends the node's stream too (even while it is quiet).
        auto cancel = std::make_shared<routing::CancelToken>();
        out->on_close([cancel] { cancel->cancel(); });
        auto r = routing::forward(
            v->load.url, "GET", target, h, "", 10000,
            [&](const routing::UpstreamReply & head) {
                if (head.status != 200) {
                    refused = true;
                    return false;
                }
                if (!started) {
                    out->start_stream(200);
                    out->long_lived();
                    started = true;
                }
                return true;
            },
            [&](std::string_view chunk) {
                if (out->closed()) return false;
                return reader.feed(chunk, [&](net::SseEvent & ev) {
                    // Its id, if it has one, is where a reconnect starts from.
                    if (ev.has_id) last = ev.id;
                    out->write(std::move(ev.raw));
                    return true;
                });
            },
            cancel, kEventsIdleMs);
        if (out->closed()) return;
        if (r.invalid) {
            // A last guard (the request was checked): nothing went to the node.
            if (started)
                out->end();
            else
                send_error(out, 400, "the request holds bytes the gateway does not pass on: " + r.error);
            return;
        }
        if (refused && !started) {
            // The node's own answer (404 after a delete, 400 for a bad Last-Event-ID…).
            std::string ctype = "application/json";
            for (const auto & [k, val] : r.headers) {
                if (strcasecmp(k.c_str(), "content-type") == 0) ctype = val;
            }
            if (r.status == 404 || r.status == 400 || r.status == 401 || r.status == 403) {
                out->send(r.status, ctype, r.body);
                return;
            }
        }
        // A holder that took the request and then said nothing is hung, not gone: it keeps
        // the session (and the lookup above goes on naming it) until its lease ends.
        if (r.status == 0 && !r.sent) view_.forget(*n);
        if (!r.error.empty())
            spdlog::warn("gateway: the event stream of session {} from {} broke: {}; following it", id, *n, r.error);
        // The node ended the stream. If the session ended, so does the stream; otherwise it
        // moved (or its node died): follow it.
        bool gone = false;
        auto now = lookup(id, gone);
        if (gone) {
            // The store is restarting: look again in a moment.
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
            continue;
        }
        const bool over =
            !now || std::find(ended_states().begin(), ended_states().end(), now->state) != ended_states().end();
        // Only a stream the node ended itself is whole: one cut short (the node died or hung)
        // is taken up again from Last-Event-ID, wherever the session is now, for its last events.
        if (over && r.status == 200 && !refused && r.error.empty()) {
            out->end();
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

}  // namespace armada::gateway
