// The session manager: the table of sessions, its lock, the public requests (create, message,
// read, cancel, delete, subscribe, and the cluster's, which its placement carries out), the
// state counts and retention. What it does as the host of its parts is in session_host.cpp.

#include "agent/session_manager.h"

#include "agent/session.h"
#include "common/json_fields.h"
#include "obs/log.h"
#include "store/new_session.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace armada::agent {

using json = nlohmann::json;
namespace net = boost::asio;

namespace {
int outcome_index(SessionState st) {
    return st == SessionState::Completed ? 0 : st == SessionState::Failed ? 1 : 2;
}
}  // namespace

std::string SessionManager::new_id() {
    return store::new_session_id();
}

SessionManager::SessionManager(engine::ChatFormat & format, GenerationPort & engine, store::Store & store,
                               tools::ToolTransport & tools, net::any_io_executor io, obs::Registry & metrics,
                               const Clock & clock, SessionOptions opt)
    : format_(format),
      engine_(engine),
      store_(store),
      tools_(tools),
      io_(std::move(io)),
      metrics_(metrics),
      clock_(clock),
      opt_(opt),
      agents_(store, clock, !opt.node.empty()),
      log_(*this, store, metrics, clock, alive_, SessionLog::Options{opt.node, opt.cell}),
      step_runner_(*this, format, engine, metrics, clock, io_, alive_,
                   StepRunner::Options{opt.node, opt.model, opt.pool, opt.test_step_errors, opt.on_tokens}),
      tool_runner_(*this, tools, engine, metrics, alive_,
                   ToolRunner::Options{opt.lease_current, opt.hold_tools, opt.kv_hold}),
      placement_(*this, store, engine, log_, agents_, metrics, clock, Placement::Options{opt.node, opt.cell}) {
    for (const char * o : {"completed", "failed", "cancelled"}) {
        metrics_.counter("armada_sessions_total", "Agent sessions that ended, by outcome", {{"outcome", o}});
        metrics_.gauge("armada_sessions_ended_window", "Agent sessions that ended within the survival window",
                       {{"outcome", o}});
    }
    for (auto st : {SessionState::Queued, SessionState::Running, SessionState::WaitingTool, SessionState::WaitingInput})
        metrics_.gauge("armada_sessions_live", "Open agent sessions by state", {{"state", state_name(st)}});
    metrics_.gauge("armada_chain_survival_window_seconds", "Window of armada_chain_survival_ratio")
        .set(double(opt_.survival_window_ms) / 1000);
    // The window survives restarts: it starts from what the store says ended within it.
    const int64_t now = clock_.now_ms();
    for (const auto & c : store_.count_since(kEnded, now - opt_.survival_window_ms)) {
        const auto st = parse_state(c.state);
        if (!st) continue;
        auto it = std::find_if(window_.begin(), window_.end(), [&](const Minute & m) { return m.minute == c.minute; });
        if (it == window_.end()) it = window_.insert(window_.end(), Minute{c.minute, {}});
        it->n[size_t(outcome_index(*st))] += c.count;
    }
    std::sort(window_.begin(), window_.end(), [](const Minute & a, const Minute & b) { return a.minute < b.minute; });
    update_survival();
}

SessionManager::~SessionManager() {
    std::lock_guard lk(mu_);
    *alive_ = false;
    for (auto & [id, s] : sessions_) {
        if (s->gen.cancel) s->gen.cancel->store(true);
    }
}

// ---- placement's requests (placement.h) ----

size_t SessionManager::resume_all() {
    return placement_.resume_all();
}

bool SessionManager::adopt(const std::string & id, int64_t epoch, std::optional<obs::TraceContext> trace,
                           std::optional<MoveNote> moved) {
    return placement_.adopt(id, epoch, std::move(trace), std::move(moved));
}

size_t SessionManager::adopt_assigned() {
    return placement_.adopt_assigned();
}

void SessionManager::incoming(const std::string & id, bool on) {
    placement_.incoming(id, on);
}

std::vector<Movable> SessionManager::movable() {
    return placement_.movable();
}

size_t SessionManager::offer_to_move(size_t n) {
    return placement_.offer_to_move(n);
}

size_t SessionManager::stay_unmoved(int64_t after_ms) {
    return placement_.stay_unmoved(after_ms);
}

std::optional<size_t> SessionManager::open_here() {
    return placement_.open_here();
}

std::optional<bool> SessionManager::held_elsewhere(const std::string & id) {
    return placement_.held_elsewhere(id);
}

bool SessionManager::busy(const std::string & id) const {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    return it != sessions_.end() && it->second->busy();
}

void SessionManager::put_operator_agent(AgentSpec spec) {
    std::lock_guard lk(mu_);
    step_runner_.forget_agent({}, spec.id);
    agents_.put_operator(std::move(spec));
}

bool SessionManager::is_operator_agent(const std::string & id) const {
    return agents_.is_operator(id);
}

std::optional<AgentSpec> SessionManager::agent(const std::string & tenant, const std::string & id) {
    agents_.sync(false);
    if (auto a = agents_.lookup(tenant, id)) return *a;
    if (opt_.node.empty()) return std::nullopt;
    agents_.sync(true);
    auto a = agents_.lookup(tenant, id);
    if (!a) return std::nullopt;
    return *a;
}

std::vector<AgentSpec> SessionManager::agents(const std::string & tenant, bool all_tenants) {
    agents_.sync(false);
    return agents_.visible(tenant, all_tenants);
}

void SessionManager::declare_agent(AgentSpec spec, const std::string & tenant, std::function<void(Outcome)> done) {
    if (agents_.is_operator(spec.id)) {
        return done({403,
                     "agent '" + spec.id + "' is declared by the operator (--agents) and is read-only over the API",
                     spec.id});
    }
    spec.tenant = tenant;
    spec.from_operator = false;
    store::Batch b;
    store::AgentRecord r;
    r.tenant = tenant;
    r.id = spec.id;
    r.spec = spec.source;
    r.tools = mcp_tools_json(spec);
    r.created_ms = r.updated_ms = clock_.now_ms();
    b.agents.push_back(r);
    store_.commit(std::move(b), [this, alive = alive_, spec = std::move(spec), done](store::Status st) mutable {
        if (!*alive) return;
        post([this, spec = std::move(spec), done, st]() mutable {
            if (!st.ok) return done({503, "could not store the agent: " + st.error, {}});
            const std::string id = spec.id, tenant = spec.tenant;
            {
                std::lock_guard lk(mu_);
                step_runner_.forget_agent(tenant, id);
                agents_.put_declared(std::move(spec));
            }
            done({200, {}, id});
        });
    });
}

void SessionManager::delete_agent(const std::string & tenant, const std::string & id,
                                  std::function<void(Outcome)> done) {
    if (agents_.is_operator(id)) {
        return done(
            {403, "agent '" + id + "' is declared by the operator (--agents) and is read-only over the API", id});
    }
    if (!agents_.has_declared(tenant, id)) return done({404, "no agent with id '" + id + "'", id});
    store::Batch b;
    b.erase_agents.emplace_back(tenant, id);
    store_.commit(std::move(b), [this, alive = alive_, tenant, id, done](store::Status st) {
        if (!*alive) return;
        post([this, tenant, id, done, st] {
            if (!st.ok) return done({503, "could not delete the agent: " + st.error, {}});
            agents_.erase(tenant, id);
            done({200, {}, id});
        });
    });
}

size_t SessionManager::load_declared_agents(const std::function<std::string(AgentSpec &)> & prepare,
                                            std::set<std::pair<std::string, std::string>> * present, bool * read_ok) {
    return agents_.load(prepare, present, read_ok);
}

size_t SessionManager::live_sessions() const {
    std::lock_guard lk(mu_);
    size_t n = 0;
    for (const auto & [id, s] : sessions_)
        n += has_ended(s->state) ? 0 : 1;
    return n;
}

std::map<std::string, int> SessionManager::live_by_state() const {
    std::lock_guard lk(mu_);
    std::map<std::string, int> out;
    for (const auto & [id, s] : sessions_) {
        if (!has_ended(s->state)) ++out[state_name(s->state)];
    }
    return out;
}

std::vector<std::pair<std::string, std::string>> SessionManager::live_owners() const {
    std::lock_guard lk(mu_);
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto & [id, s] : sessions_) {
        if (!has_ended(s->state)) out.emplace_back(id, s->owner);
    }
    return out;
}

size_t SessionManager::sessions_in_memory() const {
    std::lock_guard lk(mu_);
    return sessions_.size();
}

Session * SessionManager::find(const std::string & id, const std::string & tenant) {
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->erased || it->second->owner != tenant) return nullptr;
    return it->second.get();
}

Outcome SessionManager::HeldElsewhere::outcome(const std::string & id) const {
    if (unknown)
        return {503,
                "session '" + id + "' is held by node " + node +
                    ", and whether that node is alive cannot be told now (" + why + "); retry",
                {},
                1};
    return {409, "session '" + id + "' is held by node " + node + ", which is alive: send the request there", {}};
}

bool SessionManager::held_by_other(const store::SessionRecord & rec, HeldElsewhere & held) const {
    if (opt_.node.empty() || !opt_.holder_live || rec.node.empty() || rec.node == opt_.node) return false;
    const auto st = parse_state(rec.state);
    if (!st || has_ended(*st)) return false;
    const int live = opt_.holder_live(rec.cell, rec.node);
    if (live == 0) {
        spdlog::info("session {}: its node {} is gone; this node may take it over", rec.id, rec.node);
        return false;
    }
    held.node = rec.node;
    held.unknown = live < 0;
    held.why = live < 0 ? "etcd does not answer" : "";
    return true;
}

std::optional<Outcome> SessionManager::held_elsewhere(const std::string & id, const std::string & tenant) {
    {
        std::lock_guard lk(mu_);
        if (sessions_.count(id)) return std::nullopt;  // here
    }
    auto rec = store_.session(id);
    HeldElsewhere h;
    if (!rec || rec->owner != tenant || !held_by_other(*rec, h)) return std::nullopt;
    return h.outcome(id);
}

Session * SessionManager::find_or_load(std::unique_lock<std::mutex> & lk, const std::string & id,
                                       const std::string & tenant, HeldElsewhere * held) {
    if (sessions_.count(id)) return find(id, tenant);
    // Not in memory: an ended session, one another node holds, or none. Read it without holding
    // the lock.
    lk.unlock();
    auto rec = store_.session(id);
    std::vector<store::StepRecord> steps;
    if (rec && rec->owner == tenant && rec->agent_id.rfind('@', 0) != 0) steps = store_.steps(id);
    // Held by another node: not taken over while that node lives (its lease is what says so).
    if (rec && rec->owner == tenant) {
        HeldElsewhere h;
        if (held_by_other(*rec, h)) {
            if (held) *held = h;
            lk.lock();
            return sessions_.count(id) ? find(id, tenant) : nullptr;
        }
    }
    lk.lock();
    if (sessions_.count(id)) return find(id, tenant);  // loaded meanwhile
    if (!rec || rec->owner != tenant || rec->agent_id.rfind('@', 0) == 0 || expiring_.count(id)) return nullptr;
    auto sp = SessionLog::rebuild(*rec, steps, engine_.kv_bytes_per_token());
    if (!sp) return nullptr;
    sp->agent = agents_.lookup(rec->owner, rec->agent_id);
    if (!opt_.node.empty()) {
        // Cluster mode: written under this node's assignment, or taken over with the next batch
        // (the node it had is gone, or it ended elsewhere).
        if (rec->node == opt_.node && rec->epoch > 0)
            sp->place.epoch = rec->epoch;
        else
            sp->place.claim = rec->epoch;
    }
    Session * s = sp.get();
    count_state(s->state, +1);
    sessions_[id] = std::move(sp);
    sync_memory_gauge();
    return s;
}

void SessionManager::maybe_evict(Session & s) {
    // An ended session stays in the store; memory keeps only what is in use.
    if (!has_ended(s.state) || s.busy() || s.stream.watched() || s.erased) return;
    const std::string id = s.id;
    sessions_.erase(id);
    sync_memory_gauge();
}

void SessionManager::sync_memory_gauge() {
    metrics_.gauge("armada_sessions_in_memory", "Agent sessions held in memory (open ones, and ended ones in use)")
        .set(double(sessions_.size()));
}

uint64_t SessionManager::subscribe(const std::string & id, const std::string & tenant, EventId after,
                                   std::function<void(const SessionEventRecord &)> fn, std::function<void()> end) {
    // The log's durable events come from the store, read before the lock is taken; events
    // delivered since then are in memory. Together they cover everything after `after`.
    auto rec = store_.session(id);
    std::vector<store::StepRecord> steps;
    if (rec && rec->owner == tenant) steps = store_.steps(id);
    std::unique_lock lk(mu_);
    HeldElsewhere held;  // another live node holds it: not loaded here (its stream is there)
    Session * s = find_or_load(lk, id, tenant, &held);
    if (!s) return 0;
    for (const auto & ev : s->stream.missed(steps, after))
        fn(ev);
    const uint64_t h = next_sub_++;
    if (is_final(s->state) && s->log.outbox.empty()) {
        if (end) end();
        maybe_evict(*s);
        return h;
    }
    s->stream.subscribe(h, std::move(fn), std::move(end));
    return h;
}

void SessionManager::unsubscribe(const std::string & id, uint64_t handle) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    it->second->stream.unsubscribe(handle);
    maybe_evict(*it->second);
}

void SessionManager::count_state(SessionState st, int delta) {
    if (has_ended(st)) return;
    const int64_t n = live_counts_[st] += delta;
    metrics_.gauge("armada_sessions_live", "", {{"state", state_name(st)}}).set(double(n));
}

bool SessionManager::apply(Session & s, SessionEvent ev, const std::string & reason) {
    const auto next = transition(s.state, ev);
    if (!next) {
        spdlog::warn("session {}: event {} not allowed in state {}", s.id, int(ev), state_name(s.state));
        return false;
    }
    if (sessions_.count(s.id)) {
        count_state(s.state, -1);
        count_state(*next, +1);
    }
    s.state = *next;
    if (!reason.empty()) s.reason = reason;
    return true;
}

void SessionManager::note_ended(SessionState st, int64_t at_ms) {
    const int64_t minute = at_ms / 60000;
    if (window_.empty() || window_.back().minute < minute) window_.push_back({minute, {}});
    window_.back().n[size_t(outcome_index(st))]++;
    update_survival();
}

void SessionManager::update_survival() {
    const int64_t oldest = (clock_.now_ms() - opt_.survival_window_ms) / 60000;
    std::erase_if(window_, [&](const Minute & m) { return m.minute < oldest; });
    std::array<int64_t, 3> sum{};
    for (const auto & m : window_) {
        for (size_t i = 0; i < 3; ++i)
            sum[i] += m.n[i];
    }
    const char * names[] = {"completed", "failed", "cancelled"};
    for (size_t i = 0; i < 3; ++i)
        metrics_.gauge("armada_sessions_ended_window", "", {{"outcome", names[i]}}).set(double(sum[i]));
    // A client's cancel is the client's choice, not a lost chain: it counts on neither side.
    const int64_t decided = sum[0] + sum[1];
    metrics_
        .gauge("armada_chain_survival_ratio",
               "Share of agent sessions that ended within the window which completed; client cancels excluded")
        .set(decided > 0 ? double(sum[0]) / double(decided) : std::nan(""));
}

StepSignals SessionManager::signals() const {
    StepSignals g;
    g.steps = step_runner_.steps();
    g.step_s = double(step_runner_.step_us()) / 1e6;
    g.completed = sig_completed_.load();
    g.failed = sig_failed_.load();
    g.model_errors = step_runner_.errors();
    g.tool_errors = tool_runner_.errors();
    g.store_errors = log_.failures();
    return g;
}

void SessionManager::count_outcome(const Session & s) {
    if (!has_ended(s.state)) return;
    // A completed session may get another message: its KV is kept, spilled first. An ended one
    // will not be back.
    engine_.release(s.id, s.state != SessionState::Completed);
    metrics_
        .counter("armada_sessions_total", "Agent sessions that ended, by outcome", {{"outcome", state_name(s.state)}})
        .inc();
    note_ended(s.state, clock_.now_ms());
    if (s.state == SessionState::Completed)
        sig_completed_++;
    else if (s.state != SessionState::Cancelled)
        sig_failed_++;
    if (opt_.on_ended) opt_.on_ended(s.id, state_name(s.state));
}

void SessionManager::fail(Session & s, SessionEvent ev, const std::string & reason) {
    if (!apply(s, ev, reason)) return;
    step_runner_.end_turn(s, s.state == SessionState::Cancelled ? std::string() : reason);
    if (s.gen.cancel) s.gen.cancel->store(true);
    s.gen.cancel.reset();
    s.gen.started_ms = 0;
    ++s.gen.id;  // late engine events of the old generation are ignored
    log_.checkpoint(s, {}, [this](Session & ss) {
        count_outcome(ss);
        ss.stream.end();
    });
}

namespace {
Outcome draining_outcome() {
    return {503, "the node is shutting down (draining); retry on another node or after its restart", {}, 1};
}
}  // namespace

void SessionManager::create(const std::string & agent_id, const std::string & tenant, const std::string & input,
                            std::function<void(Outcome)> done, std::optional<obs::TraceContext> trace) {
    std::lock_guard lk(mu_);
    if (draining_) return done(draining_outcome());
    auto agent = agents_.lookup(tenant, agent_id);
    if (!agent) return done({404, "no agent with id '" + agent_id + "'", {}});
    if (engine_.kv_pressure()) {
        metrics_.counter("armada_sessions_refused_total", "New sessions refused at the KV high watermark").inc();
        return done({429, "the node's KV memory is at its high watermark; retry later", {}, 2});
    }
    auto sp = std::make_unique<Session>();
    Session & s = *sp;
    s.id = store::new_session_id();
    s.agent_id = agent_id;
    s.agent = std::move(agent);
    s.owner = tenant;
    s.created_ms = clock_.now_ms();
    s.trace.parent = std::move(trace);
    const obs::LogScope log_scope(s.id, s.trace.context());
    if (!opt_.node.empty()) s.place.claim = 0;  // cluster mode: the new row is assigned to this node
    s.place.started = true;
    sessions_[s.id] = std::move(sp);
    sync_memory_gauge();
    count_state(s.state, +1);
    store::Batch b;
    if (!input.empty()) {
        common_chat_msg m;
        m.role = "user";
        m.content = input;
        s.transcript.messages.push_back(m);
        b.steps.push_back(log_.step(s, "user_input", common::json_text(json{{"content", input}})));
        apply(s, SessionEvent::Start);
    } else {
        apply(s, SessionEvent::AwaitInput);
    }
    log_.checkpoint(
        s, std::move(b),
        [this, done](Session & ss) {
            done({200, {}, ss.id});
            if (ss.state == SessionState::Running) step_runner_.run(ss);
        },
        done);
}

void SessionManager::add_message(const std::string & id, const std::string & tenant, const std::string & text,
                                 std::function<void(Outcome)> done, std::optional<obs::TraceContext> trace) {
    std::unique_lock lk(mu_);
    if (draining_) return done(draining_outcome());
    HeldElsewhere held;
    Session * s = find_or_load(lk, id, tenant, &held);
    if (!s && held.any()) return done(held.outcome(id));
    if (!s) return done({404, "no session with id '" + id + "'", {}});
    if (text.empty()) return done({400, "the message is empty", {}});
    if (!transition(s->state, SessionEvent::UserMessage)) {
        return done({409,
                     std::string("the session is ") + state_name(s->state) + "; it takes a message only when " +
                         "completed or waiting for input",
                     {}});
    }
    if (!s->agent) s->agent = agents_.lookup(s->owner, s->agent_id);
    apply(*s, SessionEvent::UserMessage);
    s->place.started = true;
    s->trace.parent = std::move(trace);
    const obs::LogScope log_scope(s->id, s->trace.parent);
    common_chat_msg m;
    m.role = "user";
    m.content = text;
    s->transcript.messages.push_back(m);
    store::Batch b;
    b.steps.push_back(log_.step(*s, "user_input", common::json_text(json{{"content", text}})));
    log_.checkpoint(
        *s, std::move(b),
        [this, done](Session & ss) {
            done({200, {}, ss.id});
            step_runner_.run(ss);
        },
        done);
}

std::optional<SessionView> SessionManager::get(const std::string & id, const std::string & tenant) {
    SessionView v;
    std::vector<store::StepRecord> steps;
    bool in_memory = false;
    {
        std::lock_guard lk(mu_);
        if (Session * s = find(id, tenant)) {
            in_memory = true;
            // Readers see the last durable state only: nothing that could still be lost.
            const Session::Durable & d = s->log.durable;
            v.id = s->id;
            v.agent_id = s->agent_id;
            v.state = state_name(d.state);
            v.reason = d.reason;
            json t = json::array();
            for (size_t i = 0; i < d.transcript_len && i < s->transcript.messages.size(); ++i)
                t.push_back(message_json(s->transcript.messages[i]));
            v.transcript = common::json_text(t);
            v.model_steps = d.model_steps;
            v.prompt_tokens = d.prompt_tokens;
            v.completion_tokens = d.completion_tokens;
            v.created_ms = s->created_ms;
            for (const auto & p : s->transcript.kv_history) {
                if (p.step <= d.model_steps) v.kv_history.push_back(p);
            }
            v.compactions = s->transcript.compactions;
            if (!opt_.node.empty() && s->place.claim < 0) {
                v.node = opt_.node;
                v.epoch = s->place.epoch;
            }
        } else if (sessions_.count(id)) {
            return std::nullopt;  // another tenant's, or being deleted
        }
    }
    if (!in_memory) {
        // Not in memory: an ended session, read from the store as it is there.
        auto rec = store_.session(id);
        if (!rec || rec->owner != tenant || rec->agent_id.rfind('@', 0) == 0) return std::nullopt;
        steps = store_.steps(id);
        auto s = SessionLog::rebuild(*rec, steps, engine_.kv_bytes_per_token());
        if (!s) return std::nullopt;
        v.id = s->id;
        v.agent_id = s->agent_id;
        v.state = rec->state;
        v.reason = rec->reason;
        json t = json::array();
        for (const auto & m : s->transcript.messages)
            t.push_back(message_json(m));
        v.transcript = common::json_text(t);
        v.model_steps = s->transcript.model_steps;
        v.prompt_tokens = s->transcript.prompt_tokens;
        v.completion_tokens = s->transcript.completion_tokens;
        v.created_ms = s->created_ms;
        v.kv_history = s->transcript.kv_history;
        v.compactions = s->transcript.compactions;
        v.node = rec->node;
        v.epoch = rec->epoch;
        v.steps = std::move(steps);
    } else {
        v.steps = store_.steps(id);
    }
    v.kv = engine_.kv_usage(id);
    return v;
}

void SessionManager::cancel(const std::string & id, const std::string & tenant, std::function<void(Outcome)> done) {
    std::unique_lock lk(mu_);
    HeldElsewhere held;
    Session * s = find_or_load(lk, id, tenant, &held);
    if (!s && held.any()) return done(held.outcome(id));
    if (!s) return done({404, "no session with id '" + id + "'", {}});
    if (!transition(s->state, SessionEvent::Cancel)) {
        const std::string st = state_name(s->state);
        maybe_evict(*s);
        return done({409, "the session has already ended (" + st + ")", {}});
    }
    if (s->gen.cancel) {
        s->gen.cancel->store(true);
        engine_.wake();
    }
    fail(*s, SessionEvent::Cancel, "cancelled by the client");
    log_.persist(
        *s, {},
        [done](Session & ss) {
            done({200, {}, ss.id});
        },
        done);
}

void SessionManager::erase(const std::string & id, const std::string & tenant, std::function<void(Outcome)> done) {
    std::unique_lock lk(mu_);
    HeldElsewhere held;
    Session * s = find_or_load(lk, id, tenant, &held);
    if (!s && held.any()) return done(held.outcome(id));
    if (!s) return done({404, "no session with id '" + id + "'", {}});
    if (!has_ended(s->state)) {
        if (s->gen.cancel) {
            s->gen.cancel->store(true);
            engine_.wake();
        }
        fail(*s, SessionEvent::Cancel, "deleted by the client");
    }
    engine_.release(id, true);
    s->erased = true;  // from now on it is not found; the delete below is the last batch
    store::Batch b;
    b.erase.push_back(id);
    log_.persist(
        *s, std::move(b),
        [this, done](Session & ss) {
            ss.stream.end();
            done({200, {}, ss.id});
        },
        done);
}

void SessionManager::drain() {
    std::lock_guard lk(mu_);
    draining_ = true;
}

bool SessionManager::quiet() const {
    std::lock_guard lk(mu_);
    return std::none_of(sessions_.begin(), sessions_.end(), [](const auto & kv) { return kv.second->busy(); });
}

size_t SessionManager::expire_old(size_t limit) {
    if (opt_.ttl_ms <= 0) return 0;
    auto ids = store_.expired(kEnded, clock_.now_ms() - opt_.ttl_ms, limit);
    // Stored responses have a table of their own and the same retention.
    auto responses = store_.expired_responses(clock_.now_ms() - opt_.ttl_ms, limit);
    if (ids.empty() && responses.empty()) return 0;
    store::Batch b;
    b.erase_responses = std::move(responses);
    {
        // A session someone is using right now (a stream, a new message) waits for the next sweep.
        std::lock_guard lk(mu_);
        for (auto & id : ids) {
            if (sessions_.count(id) || !expiring_.insert(id).second) continue;
            b.erase.push_back(std::move(id));
        }
    }
    const size_t n = b.erase.size() + b.erase_responses.size();
    if (n == 0) return 0;
    std::vector<std::string> gone = b.erase;
    const size_t responses_gone = b.erase_responses.size();
    store_.commit(std::move(b), [this, alive = alive_, gone, responses_gone](store::Status st) {
        if (!*alive) return;
        post([this, gone, responses_gone, st] {
            std::lock_guard lk(mu_);
            for (const auto & id : gone)
                expiring_.erase(id);
            if (!st.ok) {
                spdlog::warn("retention: could not delete {} expired sessions and responses: {}",
                             gone.size() + responses_gone, st.error);
                return;
            }
            for (const auto & id : gone)
                engine_.release(id, true);  // their KV journals go too
            metrics_
                .counter("armada_sessions_expired_total", "Ended sessions and stored responses deleted after the TTL")
                .inc(gone.size() + responses_gone);
        });
    });
    return n;
}

}  // namespace armada::agent
