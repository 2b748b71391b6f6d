#include "cluster/runtime/node_agent.h"

#include "cluster/membership.h"
#include "cluster/queue.h"
#include "common/backoff.h"
#include "common/json_fields.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <thread>

namespace armada::cluster {

namespace {

using json = nlohmann::json;

}  // namespace

// ---- NodeEvents ----

void NodeEvents::ended(const std::string & session, const std::string & state) {
    push(json{{"op", "ended"}, {"session", session}, {"node", node_}, {"state", state}}.dump(), session + ":ended");
}

void NodeEvents::draining() {
    push(json{{"op", "draining"}, {"node", node_}}.dump(), {});
}

void NodeEvents::movable(const std::string & session, int64_t epoch, const std::string & traceparent, uint64_t kv_bytes,
                         int64_t now_ms) {
    // One a session and epoch per 10 s: the stream drops the repeats in between, and a brain that
    // took over meanwhile still hears of it soon.
    json ev = {{"op", "movable"}, {"session", session}, {"node", node_}, {"epoch", epoch}};
    if (!traceparent.empty()) ev["traceparent"] = traceparent;
    if (kv_bytes > 0) ev["kv_bytes"] = kv_bytes;
    push(ev.dump(), session + ":" + std::to_string(epoch) + ":movable:" + std::to_string(now_ms / 10000));
}

void NodeEvents::push(std::string data, std::string msg_id) {
    {
        std::lock_guard lk(mu_);
        if (q_.size() >= kMax) {
            ++dropped_;
            return;
        }
        q_.emplace_back(std::move(data), std::move(msg_id));
    }
    cv_.notify_one();
}

bool NodeEvents::pop(std::pair<std::string, std::string> & out, int wait_ms) {
    std::unique_lock lk(mu_);
    if (wait_ms <= 0 ? q_.empty() : !cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return !q_.empty(); }))
        return false;
    out = std::move(q_.front());
    q_.pop_front();
    return true;
}

// ---- NodeAgent ----

NodeAgent::NodeAgent(NodeAgentConfig cfg, KvStore & kv, Bus & bus, Inbox & commands, NodeSessions & sessions,
                     std::shared_ptr<NodeEvents> events, Clock & clock, FetchKv fetch_kv, MemberUrl member_url)
    : cfg_(std::move(cfg)),
      keys_(cfg_.prefix),
      kv_(kv),
      bus_(bus),
      commands_in_(commands),
      sessions_(sessions),
      events_(events ? std::move(events) : std::make_shared<NodeEvents>(cfg_.node)),
      clock_(clock),
      fetch_kv_(std::move(fetch_kv)),
      member_url_(std::move(member_url)),
      draws_(cfg_.seed ? cfg_.seed : std::random_device{}()) {
    last_offer_ = last_check_ = clock_.now_ms();
}

NodeAgent::~NodeAgent() {
    stop();
}

void NodeAgent::start() {
    commands_thread_ = std::thread([this] {
        while (!stop_.load())
            command_turn(cfg_.command_wait_ms);
    });
    events_thread_ = std::thread([this] {
        // At a stop, what is queued still goes out (a drain's event comes just before it), once.
        for (;;) {
            const bool stopping = stop_.load();
            if (!event_turn(stopping ? 0 : 200, stopping) && stopping) return;
        }
    });
    // Sessions moving here fetch their KV on threads of their own: one large journal does not
    // hold up the commands, nor the next move.
    for (int i = 0; i < cfg_.fetchers; ++i)
        fetchers_.emplace_back([this] {
            while (arrival_turn()) {
            }
        });
}

void NodeAgent::stop() {
    if (stop_.exchange(true)) return;
    arrivals_cv_.notify_all();
    for (auto & t : fetchers_)
        if (t.joinable()) t.join();
    if (commands_thread_.joinable()) commands_thread_.join();
    if (events_thread_.joinable()) events_thread_.join();
}

bool NodeAgent::event_turn(int wait_ms, bool last_try) {
    std::pair<std::string, std::string> ev;
    if (!events_->pop(ev, wait_ms)) return false;
    // A few tries while the bus reconnects; then the event is dropped (the brain's reconcile
    // learns the same from the store).
    const std::string subject = event_subject(cfg_.cell);
    std::string e;
    common::Backoff pause(300, 1200, draws_++);  // nodes that lost the bus together do not retry in step
    const int attempts = last_try ? 1 : 3;
    for (int attempt = 0; attempt < attempts; ++attempt) {
        e = bus_.publish(subject, ev.first, ev.second, 5000);
        if (e.empty() || attempt + 1 == attempts) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(pause.next_ms()));
    }
    if (!e.empty()) spdlog::warn("cluster: event {} not sent: {}", ev.first.substr(0, 200), e);
    return true;
}

std::optional<size_t> NodeAgent::peers_taking_work() const {
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    if (auto e = kv_.list(keys_.nodes(cfg_.cell), kvs, rev); !e.empty()) return std::nullopt;
    size_t n = 0;
    for (const auto & kv : kvs) {
        const auto k = keys_.parse(kv.key);
        if (k.kind != ClusterKeys::Parsed::Kind::Node || k.name == cfg_.node) continue;
        if (auto l = decode_load(k.name, kv.value); l && !l->draining) ++n;
    }
    return n;
}

void NodeAgent::offer_movable() {
    const int64_t now_ms = clock_.wall_ms();
    for (const auto & m : sessions_.movable()) {
        events_->movable(m.id, m.epoch, m.trace ? m.trace->traceparent() : std::string(), m.kv_bytes, now_ms);
        std::lock_guard lk(offered_mu_);
        offered_.insert(m.id);
    }
}

std::set<std::string> NodeAgent::offered() const {
    std::lock_guard lk(offered_mu_);
    return offered_;
}

bool NodeAgent::arrival_turn(bool wait) {
    Arrival a;
    {
        std::unique_lock lk(arrivals_mu_);
        if (!wait && arrivals_.empty()) return false;
        arrivals_cv_.wait(lk, [&] { return stop_.load() || !arrivals_.empty(); });
        if (stop_.load()) return false;  // what is left is adopted from the store at the next start
        a = std::move(arrivals_.front());
        arrivals_.pop_front();
    }
    const obs::LogScope log_scope(a.session, a.trace);
    // Where the node it comes from answers, while it is a live member (none: it is gone, or the
    // key was not written by a member of this cell).
    std::string why = "no way to find members";
    const std::string url = member_url_ ? member_url_(a.from, why) : std::string();
    if (url.empty()) spdlog::info("cluster: session {}: no KV from {}: {}", a.session, a.from, why);
    Arrived note;
    if (fetch_kv_) {
        note = fetch_kv_(a.session, a.from, url, a.kv_bytes);
    } else {
        note.from = a.from;
        note.kv_source = "none";
        note.error = "this node does not fetch KV";
    }
    if (sessions_.adopt(a.session, a.epoch, a.trace, note))
        spdlog::info("cluster: session {} moved here from {} (epoch {}, KV: {}{})", a.session, a.from, a.epoch,
                     note.kv_source, note.kv_source == "transfer" ? ", " + std::to_string(note.bytes) + " bytes" : "");
    else
        spdlog::info("cluster: move of session {} at epoch {} is stale; ignored", a.session, a.epoch);
    sessions_.incoming(a.session, false);
    --arriving_;
    return true;
}

void NodeAgent::command_turn(int wait_ms) {
    const int64_t now = clock_.now_ms();
    if (now - last_offer_ > 1000) {
        last_offer_ = now;
        if (!draining_.load()) {
            // A rebalance: while the KV is past its watermark, two more sessions a second stop
            // before their next step and are offered; those no node took in 10 s (or all, once
            // the pressure passed) go on here. (Only while another node takes work: else no move
            // can happen.)
            const bool high = kv_high_ && kv_high_() && peers_taking_work().value_or(0) > 0;
            if (high) sessions_.offer_to_move(2);
            sessions_.stay_unmoved(high ? 10000 : 0);
        }
        offer_movable();
    }
    // Level-triggered: what the store assigns to this node runs here, command or not. The
    // commands waiting go first (a failover's carries where the session came from): the pass
    // waits for a fetch that finds none, up to 30 s.
    const int64_t since_check = now - last_check_;
    if (since_check > 5000 && (commands_idle_ || since_check > 30000)) {
        last_check_ = now;
        sessions_.adopt_assigned();
    }
    std::string err;
    auto msgs = commands_in_.fetch(16, wait_ms, err);
    commands_idle_ = msgs.empty();
    if (!err.empty()) {
        spdlog::warn("cluster: fetching commands: {}", err);
        if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
        return;
    }
    for (auto & m : msgs) {
        ++commands_;
        run(m.data);
        m.ack();
    }
}

void NodeAgent::run(const std::string & data) {
    const json j = json::parse(data, nullptr, false);
    const auto session = common::string_field(j, "session");
    const auto run_epoch = common::int_field(j, "epoch");
    if (common::string_field(j, "op") != "run" || !session || !run_epoch) {
        spdlog::warn("cluster: unknown command for {}: {}", cfg_.node, data.substr(0, 200));
        return;
    }
    const std::string & id = *session;
    const int64_t epoch = *run_epoch;
    const auto str = [&](const char * k) { return common::string_field(j, k).value_or(""); };
    // The brain's `place` span, when it traces: the parent of the session's next turn.
    std::optional<obs::TraceContext> trace;
    if (const std::string tp = str("traceparent"); !tp.empty()) trace = obs::TraceContext::parse(tp);
    const obs::LogScope log_scope(id, trace);
    const std::string from = str("from"), left = str("left");
    if (!from.empty() && from != cfg_.node) {
        // A move between steps: its KV comes first, on a fetcher thread. The command is acked
        // now (a large journal takes longer than the redelivery time).
        sessions_.incoming(id, true);
        ++arriving_;
        {
            std::lock_guard lk(arrivals_mu_);
            // The most its KV journal can be, as the node it leaves stated it.
            const uint64_t kv_bytes = common::uint_field(j, "kv_bytes").value_or(0);
            arrivals_.push_back({id, from, epoch, trace, kv_bytes});
        }
        arrivals_cv_.notify_one();
        spdlog::info("cluster: session {} moves here from {} (epoch {}); fetching its KV", id, from, epoch);
    } else if (!left.empty() && left != cfg_.node) {
        // A failover: its node was lost, so there is no KV to fetch. The move is still recorded,
        // as a "moved" step (it shows in placement.moves).
        Arrived note;
        note.from = left;
        note.kv_source = "none";
        note.error = "failover: node " + left + " was lost";
        if (sessions_.adopt(id, epoch, trace, note))
            spdlog::info("cluster: running session {} (epoch {}), lost with node {}", id, epoch, left);
        else
            spdlog::info("cluster: command for session {} at epoch {} is stale; ignored", id, epoch);
    } else if (sessions_.adopt(id, epoch, trace, std::nullopt)) {
        spdlog::info("cluster: running session {} (epoch {})", id, epoch);
    } else {
        spdlog::info("cluster: command for session {} at epoch {} is stale; ignored", id, epoch);
    }
}

}  // namespace armada::cluster
