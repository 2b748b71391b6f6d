#include "cli/cluster_node.h"

#include "cluster/etcd.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace armada::cli {

using json = nlohmann::json;

void NodeEvents::ended(const std::string & session, const std::string & state) {
    push(json{{"op", "ended"}, {"session", session}, {"node", node_}, {"state", state}}.dump(), session + ":ended");
}

void NodeEvents::draining() {
    push(json{{"op", "draining"}, {"node", node_}}.dump(), {});
}

void NodeEvents::movable(const std::string & session, int64_t epoch, const std::string & traceparent, uint64_t kv_bytes,
                         int64_t now_ms) {
    // One a session and epoch per 10 s: JetStream drops the repeats in between, and a brain that
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
    if (!cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return !q_.empty(); })) return false;
    out = std::move(q_.front());
    q_.pop_front();
    return true;
}

ClusterNode::ClusterNode(const cluster::ClusterConfig & cfg, std::string cell, std::string node,
                         agent::SessionManager & sm, std::function<cluster::NodeLoad()> load,
                         std::shared_ptr<NodeEvents> events, FetchKv fetch_kv)
    : cfg_(cfg),
      cell_(std::move(cell)),
      node_(std::move(node)),
      sm_(sm),
      load_(std::move(load)),
      events_(events ? std::move(events) : std::make_shared<NodeEvents>(node_)),
      fetch_kv_(std::move(fetch_kv)) {}

ClusterNode::~ClusterNode() {
    stop();
}

std::string ClusterNode::start() {
    std::string err;
    js_ = cluster::JetStream::connect(cfg_.nats, err, cfg_.nats_auth);
    if (!js_) return "NATS at " + cfg_.nats + ": " + err;
    // One durable consumer per node on its own subject: a command sent while the node was away
    // waits for it; a command not acked in 30 s (the node hung) comes again.
    cmds_ = js_->consumer("ARMADA_CMD", "node-" + node_, cluster::command_subject(node_), 30000, 5, err);
    if (!cmds_) return "NATS consumer for " + node_ + ": " + err;
    membership_ = std::make_unique<cluster::NodeMembership>(
        cluster::make_etcd(cfg_), cluster::node_key(cfg_, cell_, node_), cfg_.lease_ttl_s, cfg_.report_ms, [this] {
            auto l = load_();
            l.node = node_;
            return l;
        });
    if (lease_clock_) membership_->share_clock(lease_clock_);
    membership_->start();
    thread_ = std::thread([this] { run_commands(); });
    events_thread_ = std::thread([this] { publish_events(); });
    // Sessions moving here fetch their KV on threads of their own: one large journal does not
    // hold up the commands, nor the next move.
    for (int i = 0; i < 2; ++i)
        fetchers_.emplace_back([this] { take_arrivals(); });
    return {};
}

void ClusterNode::stop() {
    if (stop_.exchange(true)) return;
    arrivals_cv_.notify_all();
    for (auto & t : fetchers_)
        if (t.joinable()) t.join();
    if (thread_.joinable()) thread_.join();
    if (events_thread_.joinable()) events_thread_.join();
    if (membership_) membership_->stop();
}

void ClusterNode::leave_now() {
    if (membership_) membership_->stop();
}

void ClusterNode::publish_events() {
    const std::string subject = cluster::event_subject(cell_);
    std::pair<std::string, std::string> ev;
    for (;;) {
        // At a stop, what is queued still goes out (a drain's event comes just before it), once.
        const bool stopping = stop_.load();
        if (!events_->pop(ev, stopping ? 0 : 200)) {
            if (stopping) return;
            continue;
        }
        // A few tries while NATS reconnects; then the event is dropped (the brain's reconcile
        // learns the same from the store).
        std::string e;
        int pause_ms = 300;
        for (int attempt = 0; attempt < (stopping ? 1 : 3); ++attempt) {
            e = js_->publish(subject, ev.first, ev.second);
            if (e.empty()) break;
            // A random pause that doubles: nodes that lost NATS together do not retry in step.
            std::this_thread::sleep_for(std::chrono::milliseconds(cluster::jittered_ms(pause_ms)));
            pause_ms *= 2;
        }
        if (!e.empty()) spdlog::warn("cluster: event {} not sent: {}", ev.first.substr(0, 200), e);
    }
}

std::optional<size_t> ClusterNode::peers_taking_work() const {
    std::vector<cluster::EtcdKv> kvs;
    int64_t rev = 0;
    const std::string prefix = cluster::nodes_prefix(cfg_, cell_);
    if (auto e = cluster::make_etcd(cfg_).list(prefix, kvs, rev); !e.empty()) return std::nullopt;
    size_t n = 0;
    for (const auto & kv : kvs) {
        const std::string name = kv.key.substr(prefix.size());
        if (name == node_ || name.find('/') != std::string::npos) continue;
        if (auto l = cluster::decode_load(name, kv.value); l && !l->draining) ++n;
    }
    return n;
}

void ClusterNode::offer_movable() {
    const int64_t now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    for (const auto & m : sm_.movable()) {
        events_->movable(m.id, m.epoch, m.trace ? m.trace->traceparent() : std::string(), m.kv_bytes, now_ms);
        std::lock_guard lk(offered_mu_);
        offered_.insert(m.id);
    }
}

std::set<std::string> ClusterNode::offered() const {
    std::lock_guard lk(offered_mu_);
    return offered_;
}

void ClusterNode::take_arrivals() {
    for (;;) {
        Arrival a;
        {
            std::unique_lock lk(arrivals_mu_);
            arrivals_cv_.wait(lk, [&] { return stop_.load() || !arrivals_.empty(); });
            if (stop_.load()) return;  // what is left is adopted from the store at the next start
            a = std::move(arrivals_.front());
            arrivals_.pop_front();
        }
        const obs::LogScope log_scope(a.session, a.trace);
        // Where the node it comes from answers: its load report in etcd, under a lease etcd says
        // is live (none: it is gone, or the key was not written by a member of this cell).
        std::string why;
        cluster::EtcdClient etcd = cluster::make_etcd(cfg_);
        const std::string url = cluster::member_url(etcd, cluster::node_key(cfg_, cell_, a.from), a.from, why);
        if (url.empty()) spdlog::info("cluster: session {}: no KV from {}: {}", a.session, a.from, why);
        agent::MoveNote note;
        if (fetch_kv_) {
            note = fetch_kv_(a.session, a.from, url, a.kv_bytes);
        } else {
            note.from = a.from;
            note.kv_source = "none";
            note.error = "this node does not fetch KV";
        }
        if (sm_.adopt(a.session, a.epoch, a.trace, note))
            spdlog::info("cluster: session {} moved here from {} (epoch {}, KV: {}{})", a.session, a.from, a.epoch,
                         note.kv_source,
                         note.kv_source == "transfer" ? ", " + std::to_string(note.bytes) + " bytes" : "");
        else
            spdlog::info("cluster: move of session {} at epoch {} is stale; ignored", a.session, a.epoch);
        sm_.incoming(a.session, false);
        --arriving_;
    }
}

void ClusterNode::run_commands() {
    auto last_check = std::chrono::steady_clock::now();
    auto last_offer = last_check;
    bool commands_idle = true;  // the last fetch found no command waiting
    while (!stop_.load()) {
        if (std::chrono::steady_clock::now() - last_offer > std::chrono::seconds(1)) {
            last_offer = std::chrono::steady_clock::now();
            if (!draining_.load()) {
                // A rebalance: while the KV is past its watermark, two more sessions a second
                // stop before their next step and are offered; those no node took in 10 s (or
                // all, once the pressure passed) go on here.
                // (Only while another node takes work: else no move can happen.)
                const bool high = kv_high_ && kv_high_() && peers_taking_work().value_or(0) > 0;
                if (high) sm_.offer_to_move(2);
                sm_.stay_unmoved(high ? 10000 : 0);
            }
            offer_movable();
        }
        // Level-triggered: what the store assigns to this node runs here, command or not. The
        // commands waiting go first (a failover's carries where the session came from): the pass
        // waits for a fetch that finds none, up to 30 s.
        const auto since_check = std::chrono::steady_clock::now() - last_check;
        if (since_check > std::chrono::seconds(5) && (commands_idle || since_check > std::chrono::seconds(30))) {
            last_check = std::chrono::steady_clock::now();
            sm_.adopt_assigned();
        }
        std::string err;
        auto msgs = cmds_->fetch(16, 500, err);
        commands_idle = msgs.empty();
        if (!err.empty()) {
            spdlog::warn("cluster: fetching commands: {}", err);
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            continue;
        }
        for (auto & m : msgs) {
            ++commands_;
            const json j = json::parse(m.data(), nullptr, false);
            const std::string op = j.is_object() ? j.value("op", "") : "";
            if (op == "run" && j.contains("session") && j["session"].is_string() && j.contains("epoch") &&
                j["epoch"].is_number_integer()) {
                const std::string id = j["session"].get<std::string>();
                const int64_t epoch = j["epoch"].get<int64_t>();
                // The brain's `place` span, when it traces: the parent of the session's next turn.
                std::optional<obs::TraceContext> trace;
                if (j.contains("traceparent") && j["traceparent"].is_string())
                    trace = obs::TraceContext::parse(j["traceparent"].get<std::string>());
                const obs::LogScope log_scope(id, trace);
                const std::string from =
                    j.contains("from") && j["from"].is_string() ? j["from"].get<std::string>() : "";
                if (!from.empty() && from != node_) {
                    // A move between steps: its KV comes first, on a fetcher thread. The command
                    // is acked now (a large journal takes longer than the redelivery time).
                    sm_.incoming(id, true);
                    ++arriving_;
                    {
                        std::lock_guard lk(arrivals_mu_);
                        // The most its KV journal can be, as the node it leaves stated it.
                        const uint64_t kv_bytes = j.contains("kv_bytes") && j["kv_bytes"].is_number_unsigned()
                                                      ? j["kv_bytes"].get<uint64_t>()
                                                      : 0;
                        arrivals_.push_back({id, from, epoch, trace, kv_bytes});
                    }
                    arrivals_cv_.notify_one();
                    spdlog::info("cluster: session {} moves here from {} (epoch {}); fetching its KV", id, from, epoch);
                } else if (const std::string left =
                               j.contains("left") && j["left"].is_string() ? j["left"].get<std::string>() : "";
                           !left.empty() && left != node_) {
                    // A failover: its node was lost, so there is no KV to fetch. The move is
                    // still recorded, as a "moved" step (it shows in placement.moves).
                    agent::MoveNote note;
                    note.from = left;
                    note.kv_source = "none";
                    note.error = "failover: node " + left + " was lost";
                    if (sm_.adopt(id, epoch, trace, note))
                        spdlog::info("cluster: running session {} (epoch {}), lost with node {}", id, epoch, left);
                    else
                        spdlog::info("cluster: command for session {} at epoch {} is stale; ignored", id, epoch);
                } else if (sm_.adopt(id, epoch, trace))
                    spdlog::info("cluster: running session {} (epoch {})", id, epoch);
                else
                    spdlog::info("cluster: command for session {} at epoch {} is stale; ignored", id, epoch);
            } else {
                spdlog::warn("cluster: unknown command on {}: {}", m.subject(), m.data().substr(0, 200));
            }
            m.ack();
        }
    }
}

}  // namespace armada::cli
