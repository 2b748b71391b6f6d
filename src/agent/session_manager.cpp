#include "agent/session_manager.h"

#include "common/json_fields.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <random>
#include <set>

namespace armada::agent {

using json = nlohmann::json;
namespace net = boost::asio;

namespace {
std::string dump(const json & j) {
    return common::json_text(j);
}

std::string new_session_id() {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng(std::random_device{}());
    std::string s = "sess_";
    for (int i = 0; i < 20; ++i)
        s += alphabet[rng() % (sizeof(alphabet) - 1)];
    return s;
}

const std::vector<std::string> kEnded = {"completed", "failed", "cancelled"};

int outcome_index(SessionState st) {
    return st == SessionState::Completed ? 0 : st == SessionState::Failed ? 1 : 2;
}
}  // namespace

std::string SessionManager::new_id() {
    return new_session_id();
}

struct SessionManager::PendingCall {
    tools::ToolCall call;
    bool started = false, done = false;
    int sent_before = 0;  // sent by this copy before a retry came back unsent (the lease wait)
};

struct SessionManager::Session {
    std::string id, agent_id, owner;  // owner: the tenant
    std::shared_ptr<const AgentSpec> agent;
    SessionState state = SessionState::Queued;
    std::string reason;
    SessionState logged = SessionState::Queued;  // the state the last state step recorded
    std::vector<common_chat_msg> transcript;     // without the system message
    int32_t model_steps = 0;
    int32_t engine_retries = 0;
    int64_t step_started_ms = 0;  // when this node began the model step under way (0: none)
    int64_t prompt_tokens = 0, completion_tokens = 0;
    int64_t created_ms = 0, next_seq = 1;
    std::vector<PendingCall> calls;  // calls of the current step
    int32_t tools_in_flight = 0;
    // session memory
    std::vector<SessionView::KvPoint> kv_history;
    int32_t dropped_tools = 0;  // oldest tool outputs left out of the prompt by compaction
    int32_t compactions = 0;
    // generation in flight
    uint64_t gen = 0;
    std::shared_ptr<engine::ChatTurn> turn;
    std::string gen_text;
    std::shared_ptr<std::atomic<bool>> gen_cancel;
    // GPU pools: the pool the step under way went to ("" : this node); `pool_local` keeps the
    // step here after its pool failed (`pool_fallback` says which and why).
    std::string step_pool;
    bool pool_local = false;
    std::string pool_fallback;
    int32_t pool_waits = 0;  // waits for a pool the step's prompt cannot leave
    // Traces: the context of the request that starts the next turn, the turn's span and the
    // spans of its model step and tool calls (by idempotency key) while they run.
    std::optional<obs::TraceContext> trace_parent;
    std::optional<obs::Span> turn_span, step_span;
    // The trace the session is in: its current or last turn's span (untraced here, the context
    // that turn came with). Kept in its record, so a brain that moves it continues that trace.
    std::optional<obs::TraceContext> trace_last;
    std::map<std::string, obs::Span> tool_spans;
    int64_t turn_prompt_tokens = 0, turn_completion_tokens = 0;  // the counts when the turn began
    // What readers see: the session as of its last durable batch, never ahead of the store.
    struct Durable {
        SessionState state = SessionState::Queued;
        std::string reason;
        size_t transcript_len = 0;
        int32_t model_steps = 0;
        int64_t prompt_tokens = 0, completion_tokens = 0;
    } durable;
    // durability: batches go to the store one at a time, in order
    struct Pending {
        store::Batch batch;
        std::function<void(Session &)> after;
        Durable snapshot;
        std::function<void(Outcome)> reply;  // a caller waiting for this batch
    };
    // Cluster mode: the assignment this node writes under. `claim` >= 0: the node takes the
    // session over with its next batch (assignment epoch `claim` + 1), as for a message to a
    // session whose node is gone.
    int64_t epoch = 0;
    int64_t claim = -1;
    // This node runs it (created, resumed, adopted or given a message here). A copy loaded only
    // to be read or streamed is not started: `adopt` replaces it with the store's state.
    bool started = false;
    // Offered to move to another node with its KV since this time (`offer_to_move`): its next
    // model step or tool call waits. 0: not offered.
    int64_t leaving_ms = 0;
    // Cluster mode: its tool calls wait for this node's lease to be current again (`run_tools`).
    bool lease_wait = false;
    std::deque<Pending> outbox;
    bool committing = false;
    int commit_failures = 0;
    EventStream stream;  // its recent events and subscribers
    bool erased = false;

    bool busy() const { return gen_cancel || tools_in_flight > 0 || committing || !outbox.empty(); }
    Durable snapshot() const {
        return {state, reason, transcript.size(), model_steps, prompt_tokens, completion_tokens};
    }
};

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
      kv_hold_(opt.kv_hold),
      agents_(store, clock, !opt.node.empty()) {
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
        if (s->gen_cancel) s->gen_cancel->store(true);
    }
}

void SessionManager::post(std::function<void()> fn, const net::any_io_executor & on) {
    net::post(on ? on : io_, [alive = alive_, fn = std::move(fn)] {
        if (*alive) fn();
    });
}

void SessionManager::after_ms(int ms, std::function<void()> fn) {
    auto t = std::make_shared<net::steady_timer>(io_, std::chrono::milliseconds(ms));
    t->async_wait([t, alive = alive_, fn = std::move(fn)](boost::system::error_code ec) {
        if (!ec && *alive) fn();
    });
}

// ---- agents -------------------------------------------------------------------------------

void SessionManager::put_operator_agent(AgentSpec spec) {
    std::lock_guard lk(mu_);
    std::erase_if(prefixes_, [&](const auto & kv) { return kv.first.rfind("|" + spec.id + "|", 0) == 0; });
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
                std::erase_if(prefixes_,
                              [&](const auto & kv) { return kv.first.rfind(tenant + "|" + id + "|", 0) == 0; });
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

int32_t SessionManager::shared_prefix(const Session & s, const AgentSpec & a,
                                      const std::vector<common_chat_tool> & tools, common_chat_tool_choice choice) {
    // The agent's instructions and tool schemas render the same way for every session: find
    // those tokens once per agent and tool_choice, by rendering two different user messages and
    // keeping what they share.
    const std::string ck =
        (a.from_operator ? std::string() : a.tenant) + "|" + a.id + "|" + std::to_string(int(choice));
    auto it = prefixes_.find(ck);
    if (it == prefixes_.end()) {
        engine::Tokens common;
        try {
            auto with_user = [&](const char * text) {
                std::vector<common_chat_msg> m;
                if (auto sys = system_message(a)) m.push_back(*sys);
                common_chat_msg u;
                u.role = "user";
                u.content = text;
                m.push_back(u);
                return format_.render(m, tools, choice, a.parallel_tool_calls).prompt;
            };
            common = common_prefix(with_user("Alpha"), with_user("Omega"));
        } catch (const std::exception &) {
            common.clear();
        }
        it = prefixes_.emplace(ck, std::move(common)).first;
    }
    // The engine's prompt cache keys it by content and tenant (req->tenant): never shared across
    // tenants, since a hit would tell one tenant, by timing, what another sent.
    return s.turn ? shared_prefix_length(it->second, s.turn->prompt) : 0;
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

SessionManager::Session * SessionManager::find(const std::string & id, const std::string & tenant) {
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

SessionManager::Session * SessionManager::find_or_load(std::unique_lock<std::mutex> & lk, const std::string & id,
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
    auto sp = rebuild(*rec, steps);
    if (!sp) return nullptr;
    sp->agent = agents_.lookup(rec->owner, rec->agent_id);
    if (!opt_.node.empty()) {
        // Cluster mode: written under this node's assignment, or taken over with the next batch
        // (the node it had is gone, or it ended elsewhere).
        if (rec->node == opt_.node && rec->epoch > 0)
            sp->epoch = rec->epoch;
        else
            sp->claim = rec->epoch;
    }
    Session * s = sp.get();
    count_state(s->state, +1);
    sessions_[id] = std::move(sp);
    sync_memory_gauge();
    return s;
}

std::unique_ptr<SessionManager::Session> SessionManager::rebuild(const store::SessionRecord & r,
                                                                 const std::vector<store::StepRecord> & steps) {
    const auto st = parse_state(r.state);
    if (!st) {
        spdlog::warn("session {}: unknown state '{}' in the store", r.id, r.state);
        return nullptr;
    }
    auto sp = std::make_unique<Session>();
    Session & s = *sp;
    s.id = r.id;
    s.agent_id = r.agent_id;
    s.owner = r.owner;
    s.state = s.logged = *st;
    s.reason = r.reason;
    s.created_ms = r.created_ms;
    const json data = json::parse(r.data, nullptr, false);
    if (data.is_object()) {
        s.model_steps = data.value("model_steps", 0);
        s.prompt_tokens = data.value("prompt_tokens", int64_t(0));
        s.completion_tokens = data.value("completion_tokens", int64_t(0));
        s.compactions = data.value("compactions", 0);
        s.dropped_tools = data.value("dropped_tools", 0);
    }
    s.trace_last = record_trace(r.data);
    // The context, rebuilt from the log: every durable step, in order, once.
    for (const auto & step : steps) {
        s.next_seq = step.seq + 1;
        const json p = json::parse(step.payload, nullptr, false);
        if (!p.is_object()) continue;
        if (step.kind == "user_input") {
            common_chat_msg m;
            m.role = "user";
            m.content = p.value("content", "");
            s.transcript.push_back(m);
        } else if (step.kind == "model_output") {
            s.transcript.push_back(assistant_message(p));
            s.calls.clear();
            const int32_t step_no = p.value("step", 0);
            const int64_t kvt = p.value("kv_tokens", int64_t(0));
            s.kv_history.push_back({step_no, kvt, uint64_t(kvt) * engine_.kv_bytes_per_token()});
        } else if (step.kind == "tool_call") {
            tools::ToolCall tc{
                s.id, p.value("id", ""), p.value("name", ""), p.value("arguments", ""), step.idempotency, s.owner, {},
                {}};
            s.calls.push_back({tc, false, false});
        } else if (step.kind == "tool_result") {
            common_chat_msg m;
            m.role = "tool";
            m.tool_call_id = p.value("call_id", "");
            m.tool_name = p.value("name", "");
            m.content = p.value("content", "");
            s.transcript.push_back(m);
            for (auto & c : s.calls) {
                if (c.call.idempotency_key == step.idempotency) c.done = true;
            }
        }
    }
    s.stream.start_at({s.next_seq - 1, 0});
    s.durable = s.snapshot();
    return sp;
}

// ---- durability ---------------------------------------------------------------------------

store::SessionRecord SessionManager::record(const Session & s) const {
    store::SessionRecord r;
    r.id = s.id;
    r.agent_id = s.agent_id;
    r.owner = s.owner;
    r.state = state_name(s.state);
    r.reason = s.reason;
    json data = {{"model_steps", s.model_steps},
                 {"prompt_tokens", s.prompt_tokens},
                 {"completion_tokens", s.completion_tokens},
                 {"compactions", s.compactions},
                 {"dropped_tools", s.dropped_tools}};
    if (s.trace_last) data["traceparent"] = s.trace_last->traceparent();
    r.data = dump(data);
    r.created_ms = s.created_ms;
    r.updated_ms = clock_.now_ms();
    r.cell = opt_.cell;  // kept by the store only when the row is first written
    return r;
}

store::StepRecord SessionManager::step_record(Session & s, const std::string & kind, const std::string & payload,
                                              const std::string & key) {
    store::StepRecord r;
    r.session_id = s.id;
    r.seq = s.next_seq++;
    r.kind = kind;
    r.payload = payload;
    r.idempotency = key;
    r.ts_ms = clock_.now_ms();
    return r;
}

void SessionManager::checkpoint(Session & s, store::Batch b, std::function<void(Session &)> after,
                                std::function<void(Outcome)> reply) {
    // Every change of state is a step too, so the log alone replays the session's events.
    if (s.state != s.logged) {
        json d = {{"state", state_name(s.state)}};
        if (has_ended(s.state) && !s.reason.empty()) d["reason"] = s.reason;
        b.steps.push_back(step_record(s, "state", dump(d)));
        s.logged = s.state;
    }
    b.sessions.push_back(record(s));
    persist(s, std::move(b), std::move(after), std::move(reply));
}

void SessionManager::persist(Session & s, store::Batch b, std::function<void(Session &)> after,
                             std::function<void(Outcome)> reply) {
    s.outbox.push_back({std::move(b), std::move(after), s.snapshot(), std::move(reply)});
    send_next(s);
}

void SessionManager::send_next(Session & s) {
    if (s.committing || s.outbox.empty()) return;
    s.committing = true;
    store::Batch b = s.outbox.front().batch;
    if (!opt_.node.empty()) {
        // Fencing: written only while the session is still this node's, under its epoch.
        if (s.claim >= 0)
            b.assign.push_back({s.id, opt_.node, s.claim + 1, opt_.cell});  // the row moves to this cell too
        else
            b.fences.push_back({s.id, opt_.node, s.epoch});
    }
    store_.commit(std::move(b), [this, alive = alive_, id = s.id](store::Status st) {
        // The store's thread: hand over, never touch sessions here.
        if (*alive) post([this, id, st] { on_committed(id, st); });
    });
}

void SessionManager::on_committed(const std::string & id, store::Status st) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    Session & s = *it->second;
    const obs::LogScope log_scope(s.id, s.turn_span ? std::optional(s.turn_span->context()) : s.trace_parent);
    s.committing = false;
    if (st.fenced && !opt_.node.empty()) return drop_fenced(s, st.error);
    if (!st.ok) {
        // Nothing was acknowledged: say so, and write the same batch again after a pause.
        ++s.commit_failures;
        metrics_.counter("armada_store_write_failures_total", "Checkpoint writes that failed and were retried").inc();
        sig_store_errors_++;
        s.stream.transient("error", dump(json{{"message", "checkpoint write failed, retrying: " + st.error}}));
        // Jittered, so that the sessions a restart of the store stopped together do not all try
        // again at the same instants.
        const int base = std::min(5000, 100 << std::min(s.commit_failures, 6));
        thread_local std::mt19937 rng(std::random_device{}());
        const int delay = std::uniform_int_distribution<int>(base / 2, base + base / 2)(rng);
        after_ms(delay, [this, id] {
            store_.recover();
            std::lock_guard lk2(mu_);
            auto it2 = sessions_.find(id);
            if (it2 != sessions_.end()) send_next(*it2->second);
        });
        return;
    }
    s.commit_failures = 0;
    if (s.claim >= 0) {
        s.epoch = s.claim + 1;
        s.claim = -1;
        // Said for checks that read the logs (the chaos test's "one node per session and epoch").
        spdlog::info("session {}: runs here under epoch {} (claimed by this node)", s.id, s.epoch);
    }
    auto done = std::move(s.outbox.front());
    s.outbox.pop_front();
    s.durable = std::move(done.snapshot);
    // The batch is on disk: its steps become events, in order, with their step numbers as ids.
    if (!s.erased) {
        for (const auto & step : done.batch.steps) {
            if (auto ev = step_event(step)) s.stream.deliver(std::move(*ev));
        }
    }
    if (done.after) done.after(s);
    send_next(s);
    if (s.erased && s.outbox.empty() && !s.committing) {
        count_state(s.state, -1);
        sessions_.erase(it);
        sync_memory_gauge();
        return;
    }
    maybe_evict(s);
}

void SessionManager::begin_turn(Session & s) {
    if (s.turn_span) return;
    const std::string agent = s.agent ? s.agent->id : s.agent_id;
    s.turn_span = obs::Span::start("invoke_agent " + agent, obs::SpanKind::internal, s.trace_parent);
    s.trace_last = obs::tracer()->enabled() ? std::optional(s.turn_span->context()) : s.trace_parent;
    s.trace_parent.reset();
    obs::Span & sp = *s.turn_span;
    sp.set("gen_ai.operation.name", std::string("invoke_agent"));
    sp.set("gen_ai.agent.id", agent);
    sp.set("gen_ai.agent.name", agent);
    sp.set("gen_ai.conversation.id", s.id);
    sp.set("armada.tenant", s.owner);
    if (!opt_.node.empty()) sp.set("armada.node", opt_.node);
    if (s.epoch > 0) sp.set("armada.epoch", s.epoch);
    s.turn_prompt_tokens = s.prompt_tokens;
    s.turn_completion_tokens = s.completion_tokens;
}

void SessionManager::end_turn(Session & s, const std::string & error) {
    auto tracer = obs::tracer();
    const std::string why = error.empty() ? std::string("the turn ended") : error;
    if (s.step_span) {
        s.step_span->fail(why);
        tracer->end(std::move(*s.step_span));
        s.step_span.reset();
    }
    for (auto & [key, sp] : s.tool_spans) {
        sp.fail(why);
        tracer->end(std::move(sp));
    }
    s.tool_spans.clear();
    if (!s.turn_span) return;
    spdlog::debug("session {}: turn ended ({}){}", s.id, state_name(s.state), error.empty() ? "" : ": " + error);
    obs::Span & sp = *s.turn_span;
    sp.set("gen_ai.usage.input_tokens", s.prompt_tokens - s.turn_prompt_tokens);
    sp.set("gen_ai.usage.output_tokens", s.completion_tokens - s.turn_completion_tokens);
    sp.set("armada.state", std::string(state_name(s.state)));
    if (!error.empty()) sp.fail(error);
    tracer->end(std::move(sp));
    s.turn_span.reset();
}

void SessionManager::drop_fenced(Session & s, const std::string & why) {
    spdlog::warn("session {}: fenced ({}); another node holds it now, so it stops here", s.id, why);
    ++fenced_;
    metrics_.counter("armada_sessions_fenced_total", "Sessions stopped because another node took them over").inc();
    if (s.gen_cancel) {
        s.gen_cancel->store(true);
        engine_.wake();
    }
    // Draining, the session moved away between steps: its KV journal stays until the node that
    // took it has fetched it.
    engine_.release(s.id, !draining_ && s.leaving_ms == 0);
    for (auto & p : s.outbox) {
        if (p.reply) p.reply({409, "session '" + s.id + "' moved to another node; retry the request", s.id, 1});
    }
    s.outbox.clear();
    // A move this node offered (or a drain) hands the turn on: the next node continues it, under
    // the brain's `migrate` span. Anything else is a fence.
    if (draining_ || s.leaving_ms > 0) {
        if (s.turn_span) s.turn_span->set("armada.handed_off", true);
        end_turn(s, {});
    } else {
        end_turn(s, "fenced: another node holds the session now");
    }
    s.stream.end();
    count_state(s.state, -1);
    const std::string id = s.id;
    sessions_.erase(id);
    sync_memory_gauge();
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

// ---- events -------------------------------------------------------------------------------

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
    if (is_final(s->state) && s->outbox.empty()) {
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

// ---- state --------------------------------------------------------------------------------

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
    g.steps = sig_steps_.load();
    g.step_s = double(sig_step_us_.load()) / 1e6;
    g.completed = sig_completed_.load();
    g.failed = sig_failed_.load();
    g.model_errors = sig_model_errors_.load();
    g.tool_errors = sig_tool_errors_.load();
    g.store_errors = sig_store_errors_.load();
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
    end_turn(s, s.state == SessionState::Cancelled ? std::string() : reason);
    if (s.gen_cancel) s.gen_cancel->store(true);
    s.gen_cancel.reset();
    s.step_started_ms = 0;
    ++s.gen;  // late engine events of the old generation are ignored
    checkpoint(s, {}, [this](Session & ss) {
        count_outcome(ss);
        ss.stream.end();
    });
}

// ---- the loop -----------------------------------------------------------------------------

void SessionManager::model_step(Session & s) {
    // Draining: the session is checkpointed between steps and goes on at the next start (or on
    // the node it moves to). Offered to move: it waits for the move, or for `stay_unmoved`.
    if (draining_ || s.leaving_ms > 0) return;
    begin_turn(s);
    if (!s.agent) return fail(s, SessionEvent::Error, "its agent '" + s.agent_id + "' no longer exists");
    const AgentSpec & a = *s.agent;
    if (s.model_steps >= a.limits.max_steps) {
        return fail(s, SessionEvent::LimitReached, "max_steps (" + std::to_string(a.limits.max_steps) + ") reached");
    }
    if (a.limits.token_budget > 0 && s.prompt_tokens + s.completion_tokens >= a.limits.token_budget) {
        return fail(s, SessionEvent::LimitReached,
                    "token budget (" + std::to_string(a.limits.token_budget) + ") spent");
    }
    if (a.limits.deadline_s > 0 && clock_.now_ms() - s.created_ms > int64_t(a.limits.deadline_s) * 1000) {
        return fail(s, SessionEvent::LimitReached, "deadline (" + std::to_string(a.limits.deadline_s) + " s) passed");
    }
    // The prompt (agent/prompt_builder.h): instructions, then the transcript with the oldest
    // `dropped` tool outputs replaced by a note (compaction; the stored transcript keeps them).
    std::vector<common_chat_tool> tools = prompt_tools(a);
    const common_chat_tool_choice choice = step_tool_choice(a, s.model_steps);

    // Per-session memory cap: the context of one sequence (or of the pool the step goes to), and
    // the agent's own token/byte caps.
    const uint64_t bpt = engine_.kv_bytes_per_token();
    int64_t cap = memory_cap(a.limits, engine_.n_ctx_seq(), bpt);

    std::unique_ptr<engine::GenRequest> req;
    std::string pool;
    engine::SamplingOptions so = a.sampling;
    so.max_tokens = a.limits.max_tokens_per_step;
    so.seed = a.sampling.seed ? std::optional<uint32_t>(*a.sampling.seed + uint32_t(s.model_steps)) : std::nullopt;
    try {
        s.turn = std::make_shared<engine::ChatTurn>(
            format_.render(prompt_messages(a, s.transcript, s.dropped_tools), tools, choice, a.parallel_tool_calls));
        if (opt_.pool && !s.pool_local) {
            // A step reading the output of a tool the agent marks (long_after_tools) is long.
            const bool long_step = reads_long_tool_output(a, s.transcript);
            pool = opt_.pool->route({int64_t(s.turn->prompt.size()), so.max_tokens, long_step, s.owner, a.model,
                                     int64_t(engine_.n_ctx_seq())});
            if (!pool.empty()) {
                const int64_t ctx = opt_.pool->context(pool);
                cap = memory_cap(a.limits, ctx > 0 ? ctx - so.max_tokens : std::numeric_limits<int32_t>::max(), bpt);
            }
        }
        if (int64_t(s.turn->prompt.size()) > cap && a.limits.keep_tool_outputs >= 0) {
            const int32_t want = tool_outputs_to_drop(s.transcript, a.limits.keep_tool_outputs);
            if (want > s.dropped_tools) {
                const size_t before = s.turn->prompt.size();
                s.dropped_tools = want;
                s.turn = std::make_shared<engine::ChatTurn>(format_.render(
                    prompt_messages(a, s.transcript, s.dropped_tools), tools, choice, a.parallel_tool_calls));
                ++s.compactions;
                metrics_.counter("armada_session_compactions_total", "Prompts compacted at a session's memory cap")
                    .inc();
                s.stream.transient("compaction", dump(json{{"dropped_tool_outputs", s.dropped_tools},
                                                           {"prompt_tokens_before", before},
                                                           {"prompt_tokens_after", s.turn->prompt.size()},
                                                           {"cap_tokens", cap}}));
            }
        }
        if (int64_t(s.turn->prompt.size()) > cap) {
            std::string why = "session memory cap reached: the next step's prompt has " +
                              std::to_string(s.turn->prompt.size()) + " tokens (" +
                              std::to_string(uint64_t(s.turn->prompt.size()) * bpt) + " bytes of KV) but the cap is " +
                              std::to_string(cap) + " tokens";
            why += a.limits.keep_tool_outputs >= 0
                       ? " even with tool outputs older than the newest " + std::to_string(a.limits.keep_tool_outputs) +
                             " removed"
                       : "; set limits.keep_tool_outputs to compact old tool outputs instead of failing";
            return fail(s, SessionEvent::LimitReached, why);
        }
        if (!s.step_span) {
            const std::string model = !a.model.empty() ? a.model : opt_.model;
            s.step_span =
                obs::Span::start("chat " + model, pool.empty() ? obs::SpanKind::internal : obs::SpanKind::client,
                                 s.turn_span ? std::optional(s.turn_span->context()) : std::nullopt);
            s.step_span->set("gen_ai.operation.name", std::string("chat"));
            s.step_span->set("gen_ai.request.model", model);
            s.step_span->set("gen_ai.conversation.id", s.id);
            s.step_span->set("gen_ai.request.max_tokens", int64_t(so.max_tokens));
            s.step_span->set("armada.step", int64_t(s.model_steps + 1));
            if (!opt_.node.empty()) s.step_span->set("armada.node", opt_.node);
        }
        if (!pool.empty()) return delegate_step(s, pool, std::move(tools), so);
        req = format_.request(*s.turn, so, engine_.n_ctx_seq(), engine::choice_seed(so, 0));
    } catch (const std::exception & e) {
        return fail(s, SessionEvent::Error, std::string("cannot run the model step: ") + e.what());
    }
    req->session = s.id;
    req->account = s.owner;
    req->tenant = s.owner;
    req->prefix_len = shared_prefix(s, a, tools, choice);
    const uint64_t gen = ++s.gen;
    s.gen_text.clear();
    s.gen_cancel = req->cancelled;
    if (s.step_started_ms == 0) s.step_started_ms = clock_.now_ms();  // a retry keeps the first try's time
    // The engine thread hands events over by posting. They go through one strand per step: on
    // the plain I/O pool, two pieces of text (or the last piece and Done) could run on two
    // threads in either order, and the step's text would be scrambled.
    req->sink = [this, alive = alive_, id = s.id, gen,
                 strand = net::any_io_executor(net::make_strand(io_))](engine::GenEvent && ev) {
        if (!*alive) return;
        if (ev.kind == engine::GenEvent::Kind::Text) {
            post([this, id, gen, t = std::move(ev.text)]() mutable { on_model_text(id, gen, std::move(t)); }, strand);
        } else {
            post([this, id, gen, ev = std::move(ev)]() mutable { on_model_done(id, gen, std::move(ev)); }, strand);
        }
    };
    const auto st = engine_.submit(std::move(req));
    if (st == engine::SubmitStatus::QueueFull) {
        // The engine is full: the step waits and tries again; the session keeps its place.
        s.gen_cancel.reset();
        after_ms(200, [this, id = s.id, gen] {
            std::lock_guard lk(mu_);
            auto it = sessions_.find(id);
            if (it != sessions_.end() && it->second->gen == gen && it->second->state == SessionState::Running) {
                model_step(*it->second);
            }
        });
    } else if (st == engine::SubmitStatus::Stopped) {
        s.gen_cancel.reset();
    }
}

void SessionManager::delegate_step(Session & s, const std::string & pool, std::vector<common_chat_tool> tools,
                                   const engine::SamplingOptions & so) {
    const uint64_t gen = ++s.gen;
    s.gen_text.clear();
    s.gen_cancel = std::make_shared<std::atomic<bool>>(false);
    s.step_pool = pool;
    if (s.step_started_ms == 0) s.step_started_ms = clock_.now_ms();
    // While the pool works the session waits as it does on a tool: its KV leaves the sequences.
    engine_.release(s.id, false);
    metrics_.counter("armada_session_pool_steps_total", "Agent steps sent to a GPU pool", {{"pool", pool}}).inc();
    s.stream.transient("delegated", dump(json{{"pool", pool}, {"prompt_tokens", s.turn->prompt.size()}}));
    PoolStep step;
    step.pool = pool;
    step.turn = s.turn;
    step.tools = std::move(tools);
    step.sampling = so;
    step.seed = engine::choice_seed(so, 0);
    step.tenant = s.owner;
    if (s.step_span) step.traceparent = s.step_span->context().traceparent();
    step.cancelled = s.gen_cancel;
    auto strand = net::any_io_executor(net::make_strand(io_));
    opt_.pool->run(
        std::move(step),
        [this, alive = alive_, id = s.id, gen, strand](std::string text) {
            if (*alive)
                post([this, id, gen, t = std::move(text)]() mutable { on_model_text(id, gen, std::move(t), true); },
                     strand);
        },
        [this, alive = alive_, id = s.id, gen, strand](PoolStepResult r) {
            if (*alive)
                post([this, id, gen, r = std::move(r)]() mutable { on_pool_done(id, gen, std::move(r)); }, strand);
        });
}

void SessionManager::on_pool_done(const std::string & id, uint64_t gen, PoolStepResult r) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->gen != gen || it->second->state != SessionState::Running) return;
    Session & s = *it->second;
    const obs::LogScope log_scope(s.id, s.turn_span ? std::optional(s.turn_span->context()) : s.trace_parent);
    s.gen_cancel.reset();
    if (r.cancelled) return;
    if (!r.ran) {
        // The pool could not take it: the step runs here if it fits (or can be compacted to fit:
        // model_step then applies the node's cap), else waits for the pool.
        const bool compacts = s.agent && s.agent->limits.keep_tool_outputs >= 0;
        const bool fits = compacts || int64_t(s.turn->prompt.size()) < int64_t(engine_.n_ctx_seq()) - 1;
        metrics_
            .counter("armada_session_pool_fallbacks_total", "Pool steps that the pool could not run",
                     {{"pool", s.step_pool}, {"to", fits ? "cpu" : "retry"}})
            .inc();
        spdlog::warn("session {}: pool '{}' did not run the step ({}); {}", s.id, s.step_pool, r.error,
                     fits ? "running it on this node" : "the prompt does not fit this node, trying the pool again");
        s.stream.transient("pool_fallback", dump(json{{"pool", s.step_pool}, {"to", fits ? "cpu" : "retry"}}));
        if (fits) {
            s.pool_local = true;
            s.pool_fallback = s.step_pool + "-unavailable";
            return model_step(s);
        }
        if (++s.pool_waits > 3) {
            return fail(s, SessionEvent::Error,
                        "pool '" + s.step_pool + "' is unavailable and the step's prompt (" +
                            std::to_string(s.turn->prompt.size()) + " tokens) does not fit this node's context (" +
                            std::to_string(engine_.n_ctx_seq()) + ")");
        }
        s.gen_cancel = std::make_shared<std::atomic<bool>>(false);  // busy while it waits
        after_ms(1000 * s.pool_waits, [this, id = s.id, gen] {
            std::lock_guard lk2(mu_);
            auto it2 = sessions_.find(id);
            if (it2 == sessions_.end() || it2->second->gen != gen) return;
            it2->second->gen_cancel.reset();
            if (it2->second->state == SessionState::Running) model_step(*it2->second);
        });
        return;
    }
    s.gen_text = std::move(r.text);
    engine::GenEvent ev;
    ev.kind = engine::GenEvent::Kind::Done;
    ev.finish = r.finish;
    ev.n_prompt = r.n_prompt;
    ev.n_generated = r.n_generated;
    ev.ttft_s = r.ttft_s;
    finish_step(s, ev, s.step_pool, r.upstream, std::move(r.call));
}

void SessionManager::on_model_text(const std::string & id, uint64_t gen, std::string text, bool from_pool) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->gen != gen) return;
    Session & s = *it->second;
    if (text.empty() && from_pool) {
        // A pool's upstream failed midway: the step starts again, and its tokens so far are void.
        s.gen_text.clear();
        s.stream.transient("retract", dump(json{{"reason", "the upstream failed midway; the step starts again"}}));
        return;
    }
    s.gen_text += text;
    s.stream.transient("token", dump(json{{"text", text}}));
}

void SessionManager::on_model_done(const std::string & id, uint64_t gen, engine::GenEvent ev) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->gen != gen || it->second->state != SessionState::Running) return;
    Session & s = *it->second;
    const obs::LogScope log_scope(s.id, s.turn_span ? std::optional(s.turn_span->context()) : s.trace_parent);
    s.gen_cancel.reset();
    if (ev.finish == engine::FinishReason::Cancelled) return;
    thread_local std::mt19937 test_rng(std::random_device{}());
    if (opt_.test_step_errors > 0 && ev.finish != engine::FinishReason::Error &&
        std::uniform_real_distribution<double>(0, 1)(test_rng) < opt_.test_step_errors) {
        ev.finish = engine::FinishReason::Error;
        ev.error = "injected by --test-step-errors";
    }
    if (ev.finish == engine::FinishReason::Error) {
        sig_steps_++;  // counted, timed with its retry (which keeps the first try's start)
        sig_model_errors_++;
        if (++s.engine_retries > 2) return fail(s, SessionEvent::Error, "the model failed: " + ev.error);
        return model_step(s);
    }
    finish_step(s, ev, "cpu", {}, std::nullopt);
}

void SessionManager::finish_step(Session & s, const engine::GenEvent & ev, const std::string & where,
                                 const std::string & upstream, std::optional<common_chat_msg> call) {
    // A copy: `where` may be the session's `step_pool`, which is cleared below.
    const std::string ran_on = where;  // NOLINT(performance-unnecessary-copy-initialization)
    common_chat_msg msg = call ? std::move(*call) : format_.parse(*s.turn, s.gen_text, false);
    // A call cut off by max_tokens has arguments that are not JSON: it is not a call. A step that
    // had to call a tool and produced no whole call is run again (twice at most).
    std::erase_if(msg.tool_calls, [](const common_chat_tool_call & c) {
        const json args = json::parse(c.arguments, nullptr, false);
        return !args.is_object();
    });
    if (msg.tool_calls.empty() && s.turn->require_call) {
        spdlog::warn("session {}: a step that must call a tool produced no whole call ({}, {} tokens): {}", s.id,
                     engine::finish_reason_name(ev.finish), ev.n_generated, s.gen_text.substr(0, 300));
        if (++s.engine_retries > 2) {
            return fail(s, SessionEvent::Error, "the model produced no complete tool call in a step that requires one");
        }
        return model_step(s);
    }
    s.engine_retries = 0;
    const int32_t step = ++s.model_steps;
    s.prompt_tokens += ev.n_prompt;
    if (opt_.on_tokens) opt_.on_tokens(s.owner, int64_t(ev.n_prompt) + ev.n_generated);
    s.completion_tokens += ev.n_generated;
    if (ran_on == "cpu") {
        s.kv_history.push_back({step, ev.kv_tokens, uint64_t(ev.kv_tokens) * engine_.kv_bytes_per_token()});
    }
    metrics_.counter("armada_session_steps_total", "Model steps taken by agent sessions").inc();

    json out = {{"step", step},
                {"content", msg.content},
                {"tool_calls", json::array()},
                {"prompt_tokens", ev.n_prompt},
                {"completion_tokens", ev.n_generated},
                {"finish_reason", engine::finish_reason_name(ev.finish)},
                {"cached_tokens", ev.n_cached},
                {"ttft_ms", ev.ttft_s * 1000},
                {"started_ms", s.step_started_ms},
                {"kv_tokens", ev.kv_tokens},
                {"ran_on", ran_on}};
    if (!upstream.empty()) out["upstream"] = upstream;
    if (ran_on == "cpu" && !s.pool_fallback.empty()) out["pool_fallback"] = s.pool_fallback;
    s.pool_local = false;
    s.pool_waits = 0;
    s.pool_fallback.clear();
    s.step_pool.clear();
    if (s.step_started_ms > 0) {
        // A moving average over about the last 20 steps (queueing included: what a session waits).
        const double took = double(clock_.now_ms() - s.step_started_ms), was = step_ms_.load();
        step_ms_.store(was == 0 ? took : was + (took - was) / 20);
        sig_steps_++;
        sig_step_us_ += int64_t(took * 1000);
    }
    s.step_started_ms = 0;
    if (!ev.kv_source.empty()) out["kv_source"] = ev.kv_source;
    if (s.step_span) {
        obs::Span & sp = *s.step_span;
        sp.set("gen_ai.usage.input_tokens", int64_t(ev.n_prompt));
        sp.set("gen_ai.usage.output_tokens", int64_t(ev.n_generated));
        sp.set("armada.cached_tokens", int64_t(ev.n_cached));
        sp.set("armada.finish_reason", std::string(engine::finish_reason_name(ev.finish)));
        sp.set("armada.ran_on", ran_on);
        if (!upstream.empty()) sp.set("gen_ai.response.model", upstream);
        sp.set("armada.tool_calls", int64_t(msg.tool_calls.size()));
        obs::tracer()->end(std::move(sp));
        s.step_span.reset();
    }
    s.calls.clear();
    for (size_t i = 0; i < msg.tool_calls.size(); ++i) {
        auto & c = msg.tool_calls[i];
        c.id = "call_" + std::to_string(step) + "_" + std::to_string(i);
        tools::ToolCall tc{
            s.id,    c.id, c.name, c.arguments, s.id + ":" + std::to_string(step) + ":" + std::to_string(i),
            s.owner, {},   {}};
        out["tool_calls"].push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
        s.calls.push_back({tc, false, false});
    }
    s.transcript.push_back(msg);

    store::Batch b;
    b.steps.push_back(step_record(s, "model_output", dump(out)));
    for (const auto & pc : s.calls) {
        b.steps.push_back(step_record(
            s, "tool_call",
            dump(json{
                {"step", step}, {"id", pc.call.call_id}, {"name", pc.call.name}, {"arguments", pc.call.arguments}}),
            pc.call.idempotency_key));
    }
    const bool calls = !s.calls.empty();
    apply(s, calls ? SessionEvent::ToolsCalled : SessionEvent::Answered);
    checkpoint(s, std::move(b), [this, calls](Session & ss) {
        if (calls) {
            run_tools(ss);
        } else {
            end_turn(ss, {});
            count_outcome(ss);
        }
    });
}

void SessionManager::run_tools(Session & s) {
    if (draining_ || s.leaving_ms > 0) return;  // the calls are in the log; the next start sends them
    if (opt_.lease_current && !opt_.lease_current()) {
        // A call is an effect outside the store, which fencing cannot take back. A node whose
        // lease may have lapsed (stopped or starved past its TTL) may have lost this session to
        // another node, which has sent these calls already. So the calls wait until the lease
        // is current again, and then until the store confirms, by a fenced write of nothing,
        // that this node still holds the session; a node that lost it is fenced and stops it.
        if (s.lease_wait) return;
        s.lease_wait = true;
        spdlog::info("session {}: tool calls wait for this node's lease to be current", s.id);
        wait_for_lease(s.id);
        return;
    }
    send_tools(s);
}

void SessionManager::wait_for_lease(const std::string & id) {
    after_ms(100, [this, id] {
        std::lock_guard lk(mu_);
        auto it = sessions_.find(id);
        if (it == sessions_.end()) return;
        Session & s = *it->second;
        if (!s.lease_wait) return;
        if (s.state != SessionState::WaitingTool || !s.started || draining_ || s.leaving_ms > 0) {
            s.lease_wait = false;
            return;
        }
        if (!opt_.lease_current()) return wait_for_lease(id);
        persist(s, {}, [this](Session & ss) {
            ss.lease_wait = false;
            if (ss.state == SessionState::WaitingTool && !draining_ && ss.leaving_ms == 0) send_tools(ss);
        });
    });
}

std::string SessionManager::hold_key(const Session & s, const std::string & tool) {
    // Latencies are learned per tenant and agent: another tenant's tool of the same name, or its
    // calls, say nothing about this one's.
    return s.owner + '\x1f' + s.agent_id + '\x1f' + tool;
}

void SessionManager::send_tools(Session & s) {
    std::vector<std::string> sent;  // the hold keys of the tools called now
    for (auto & pc : s.calls) {
        if (pc.started || pc.done) continue;
        pc.started = true;
        ++s.tools_in_flight;
        const HttpToolSpec * spec = nullptr;
        if (s.agent) {
            for (const auto & t : s.agent->tools) {
                if (t.name == pc.call.name) spec = &t;
            }
        }
        if (!spec) {
            tools::ToolResult r;
            r.is_error = true;
            r.content = "tool error: there is no tool named '" + pc.call.name + "'";
            post([this, id = s.id, key = pc.call.idempotency_key, r] { on_tool_done(id, key, r); });
            continue;
        }
        sent.push_back(hold_key(s, pc.call.name));
        HttpToolSpec capped = *spec;
        capped.timeout_ms = std::min(capped.timeout_ms, s.agent->limits.tool_timeout_ms);
        obs::Span sp = obs::Span::start("execute_tool " + pc.call.name, obs::SpanKind::client,
                                        s.turn_span ? std::optional(s.turn_span->context()) : std::nullopt);
        sp.set("gen_ai.operation.name", std::string("execute_tool"));
        sp.set("gen_ai.tool.name", pc.call.name);
        sp.set("gen_ai.tool.call.id", pc.call.call_id);
        sp.set("gen_ai.tool.type", std::string(spec->mcp_url.empty() ? "function" : "extension"));
        sp.set("gen_ai.conversation.id", s.id);
        pc.call.traceparent = sp.context().traceparent();
        s.tool_spans[pc.call.idempotency_key] = std::move(sp);
        // Its retries check this node's lease too (the first attempt went through run_tools): a
        // retry due while the lease is not current comes back unsent, and goes out again the way
        // the first did (on_tool_done).
        tools::ToolCall call = pc.call;
        call.may_send = opt_.lease_current;
        tools_.call(capped, call,
                    [this, alive = alive_, id = s.id, key = pc.call.idempotency_key](tools::ToolResult r) {
                        if (*alive) post([this, id, key, r = std::move(r)] { on_tool_done(id, key, r); });
                    });
    }
    // The session's KV waits in its sequence for as long as these tools usually take, and is
    // parked at once when they usually take too long for that to be worth a sequence.
    if (opt_.hold_tools && !sent.empty()) engine_.hold(s.id, kv_hold_.hold_ms(sent));
}

void SessionManager::on_tool_done(const std::string & id, const std::string & key, tools::ToolResult r) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    Session & s = *it->second;
    const obs::LogScope log_scope(s.id, s.turn_span ? std::optional(s.turn_span->context()) : s.trace_parent);
    if (s.tools_in_flight > 0) --s.tools_in_flight;
    if (s.state != SessionState::WaitingTool) return maybe_evict(s);
    PendingCall * pc = nullptr;
    for (auto & c : s.calls) {
        if (c.call.idempotency_key == key) pc = &c;
    }
    if (!pc || pc->done) return;
    if (r.not_sent) {
        // A retry fell due while this node's lease was not current: it goes out again only once
        // the lease is, and a fenced write has confirmed the session is still this node's.
        pc->started = false;
        pc->sent_before += r.attempts;
        if (auto sp = s.tool_spans.find(key); sp != s.tool_spans.end()) {
            sp->second.set("armada.tool.attempts", int64_t(r.attempts));
            sp->second.fail("not sent again: the node's lease was not current");
            obs::tracer()->end(std::move(sp->second));
            s.tool_spans.erase(sp);
        }
        spdlog::info("session {}: a retry of tool call {} waits for this node's lease", s.id, key);
        if (!s.lease_wait && !draining_ && s.leaving_ms == 0) {
            s.lease_wait = true;
            wait_for_lease(s.id);
        }
        return;
    }
    pc->done = true;
    // Only calls that reached a tool of the agent teach the hold (a name the model made up is
    // answered at once, and would teach it nothing true).
    if (s.agent && std::any_of(s.agent->tools.begin(), s.agent->tools.end(),
                               [&](const HttpToolSpec & t) { return t.name == pc->call.name; }))
        kv_hold_.observe(hold_key(s, pc->call.name), int64_t(r.latency_s * 1000));
    const std::string outcome = r.is_error ? "error" : "ok";
    if (r.is_error) sig_tool_errors_++;
    if (auto sp = s.tool_spans.find(key); sp != s.tool_spans.end()) {
        sp->second.set("armada.tool.attempts", int64_t(r.attempts));
        if (r.http_status > 0) sp->second.set("http.response.status_code", int64_t(r.http_status));
        if (r.is_error) sp->second.fail("the tool call failed");  // its output may hold data: not copied
        obs::tracer()->end(std::move(sp->second));
        s.tool_spans.erase(sp);
    }
    metrics_
        .counter("armada_tool_calls_total", "Tool calls by tool and result",
                 {{"tool", pc->call.name}, {"result", outcome}})
        .inc();
    metrics_
        .histogram("armada_tool_call_seconds", "Tool call latency by tool", obs::latency_buckets(),
                   {{"tool", pc->call.name}})
        .observe(r.latency_s);

    common_chat_msg tm;
    tm.role = "tool";
    tm.tool_call_id = pc->call.call_id;
    tm.tool_name = pc->call.name;
    tm.content = r.content;
    s.transcript.push_back(tm);

    store::Batch b;
    b.steps.push_back(step_record(s, "tool_result",
                                  dump(json{{"call_id", pc->call.call_id},
                                            {"name", pc->call.name},
                                            {"content", r.content},
                                            {"is_error", r.is_error},
                                            {"http_status", r.http_status},
                                            {"attempts", pc->sent_before + r.attempts}}),
                                  key));
    const bool all = std::all_of(s.calls.begin(), s.calls.end(), [](const PendingCall & c) { return c.done; });
    if (all) apply(s, SessionEvent::ToolsDone);
    checkpoint(s, std::move(b), [this, all](Session & ss) {
        if (all && ss.state == SessionState::Running) model_step(ss);
    });
}

// ---- requests -----------------------------------------------------------------------------

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
    s.id = new_session_id();
    s.agent_id = agent_id;
    s.agent = std::move(agent);
    s.owner = tenant;
    s.created_ms = clock_.now_ms();
    s.trace_parent = std::move(trace);
    const obs::LogScope log_scope(s.id, s.turn_span ? std::optional(s.turn_span->context()) : s.trace_parent);
    if (!opt_.node.empty()) s.claim = 0;  // cluster mode: the new row is assigned to this node
    s.started = true;
    sessions_[s.id] = std::move(sp);
    sync_memory_gauge();
    count_state(s.state, +1);
    store::Batch b;
    if (!input.empty()) {
        common_chat_msg m;
        m.role = "user";
        m.content = input;
        s.transcript.push_back(m);
        b.steps.push_back(step_record(s, "user_input", dump(json{{"content", input}})));
        apply(s, SessionEvent::Start);
    } else {
        apply(s, SessionEvent::AwaitInput);
    }
    checkpoint(
        s, std::move(b),
        [this, done](Session & ss) {
            done({200, {}, ss.id});
            if (ss.state == SessionState::Running) model_step(ss);
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
    s->started = true;
    s->trace_parent = std::move(trace);
    const obs::LogScope log_scope(s->id, s->trace_parent);
    common_chat_msg m;
    m.role = "user";
    m.content = text;
    s->transcript.push_back(m);
    store::Batch b;
    b.steps.push_back(step_record(*s, "user_input", dump(json{{"content", text}})));
    checkpoint(
        *s, std::move(b),
        [this, done](Session & ss) {
            done({200, {}, ss.id});
            model_step(ss);
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
            const Session::Durable & d = s->durable;
            v.id = s->id;
            v.agent_id = s->agent_id;
            v.state = state_name(d.state);
            v.reason = d.reason;
            json t = json::array();
            for (size_t i = 0; i < d.transcript_len && i < s->transcript.size(); ++i)
                t.push_back(message_json(s->transcript[i]));
            v.transcript = dump(t);
            v.model_steps = d.model_steps;
            v.prompt_tokens = d.prompt_tokens;
            v.completion_tokens = d.completion_tokens;
            v.created_ms = s->created_ms;
            for (const auto & p : s->kv_history) {
                if (p.step <= d.model_steps) v.kv_history.push_back(p);
            }
            v.compactions = s->compactions;
            if (!opt_.node.empty() && s->claim < 0) {
                v.node = opt_.node;
                v.epoch = s->epoch;
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
        auto s = rebuild(*rec, steps);
        if (!s) return std::nullopt;
        v.id = s->id;
        v.agent_id = s->agent_id;
        v.state = rec->state;
        v.reason = rec->reason;
        json t = json::array();
        for (const auto & m : s->transcript)
            t.push_back(message_json(m));
        v.transcript = dump(t);
        v.model_steps = s->model_steps;
        v.prompt_tokens = s->prompt_tokens;
        v.completion_tokens = s->completion_tokens;
        v.created_ms = s->created_ms;
        v.kv_history = s->kv_history;
        v.compactions = s->compactions;
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
    if (s->gen_cancel) {
        s->gen_cancel->store(true);
        engine_.wake();
    }
    fail(*s, SessionEvent::Cancel, "cancelled by the client");
    persist(
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
        if (s->gen_cancel) {
            s->gen_cancel->store(true);
            engine_.wake();
        }
        fail(*s, SessionEvent::Cancel, "deleted by the client");
    }
    engine_.release(id, true);
    s->erased = true;  // from now on it is not found; the delete below is the last batch
    store::Batch b;
    b.erase.push_back(id);
    persist(
        *s, std::move(b),
        [this, done](Session & ss) {
            ss.stream.end();
            done({200, {}, ss.id});
        },
        done);
}

// ---- recovery -----------------------------------------------------------------------------

size_t SessionManager::resume_all() {
    // Only open sessions: ended ones stay in the store until someone asks for them.
    const auto records = store_.sessions_not_in(kEnded);
    size_t resumed = 0;
    for (const auto & r : records) {
        if (r.agent_id.rfind('@', 0) == 0) continue;  // stored by another service (e.g. @response)
        // Cluster mode: the others are other nodes' (the cell brain moves them if theirs died).
        if (!opt_.node.empty() && (r.node != opt_.node || r.epoch <= 0)) continue;
        const auto steps = store_.steps(r.id);
        if (steps.empty()) {
            spdlog::warn("session {}: no steps could be read; not resumed now", r.id);
            continue;
        }
        std::lock_guard lk(mu_);
        if (sessions_.count(r.id)) continue;
        auto sp = rebuild(r, steps);
        if (!sp) continue;
        sp->agent = agents_.lookup(r.owner, r.agent_id);
        sp->epoch = r.epoch;
        Session * ps = sp.get();
        sessions_[r.id] = std::move(sp);
        sync_memory_gauge();
        count_state(ps->state, +1);
        ++resumed;
        resume_loaded(*ps);
    }
    return resumed;
}

bool SessionManager::adopt(const std::string & id, int64_t epoch, std::optional<obs::TraceContext> trace,
                           std::optional<MoveNote> moved) {
    auto rec = store_.session(id);
    if (!rec || rec->node != opt_.node || rec->epoch != epoch || rec->agent_id.rfind('@', 0) == 0) return false;
    const auto st = parse_state(rec->state);
    if (!st || has_ended(*st)) return false;
    {
        std::lock_guard lk(mu_);
        if (running_here(id, epoch)) return true;
    }
    // (A copy in memory that is not running here is replaced below, from the store.) An agent
    // declared through another node since this one started is read from the store.
    if (!agents_.lookup(rec->owner, rec->agent_id)) agents_.load(agents_.prepare());
    const auto steps = store_.steps(id);
    // Every stored session has at least its first step: none means the read failed (the store
    // is restarting). Rebuilding from nothing would write over step 1; the periodic
    // `adopt_assigned` tries again.
    if (steps.empty()) return false;
    if (moved && moved->from.empty()) {
        // Adopted without its command: where it ran last is where its last move took it, if it
        // moved before; otherwise the store does not say.
        for (auto s = steps.rbegin(); s != steps.rend(); ++s) {
            if (s->kind != "moved") continue;
            const auto d = json::parse(s->payload, nullptr, false);
            if (auto to = common::string_field(d, "to")) moved->from = *to;
            break;
        }
        if (moved->from == opt_.node) moved.reset();  // it was here last: no move
    }
    std::lock_guard lk(mu_);
    if (running_here(id, epoch)) return true;  // started meanwhile
    auto sp = rebuild(*rec, steps);
    if (!sp) return false;
    sp->agent = agents_.lookup(rec->owner, rec->agent_id);
    sp->epoch = epoch;
    // A session that has not taken a turn yet is in the trace of the `place` that brought it.
    if (!sp->trace_last) sp->trace_last = trace;
    sp->trace_parent = std::move(trace);
    Session * ps = sp.get();
    if (auto it = sessions_.find(id); it != sessions_.end()) {
        // A copy loaded to be read or streamed (or one that ran here before the session moved
        // away): the store is newer. Its subscribers stay, and get the steps written since.
        Session & old = *it->second;
        if (old.gen_cancel) {
            old.gen_cancel->store(true);
            engine_.wake();
        }
        ps->gen = old.gen + 1;  // late engine events of the old copy are ignored
        ps->stream.take_over(old.stream, steps);
        count_state(old.state, -1);
        it->second = std::move(sp);
    } else {
        sessions_[id] = std::move(sp);
    }
    sync_memory_gauge();
    count_state(ps->state, +1);
    if (!moved) {
        resume_loaded(*ps);
        return true;
    }
    // The move is written first, under the new epoch: a node that lost the session meanwhile is
    // fenced here, before any work.
    json d = {{"to", opt_.node},       {"epoch", epoch},          {"kv_source", moved->kv_source},
              {"bytes", moved->bytes}, {"tokens", moved->tokens}, {"ms", moved->ms}};
    if (!moved->from.empty()) d["from"] = moved->from;  // unknown for a first move adopted without its command
    if (!moved->error.empty()) d["error"] = moved->error;
    metrics_
        .counter("armada_kv_migrations_total", "Sessions that moved here from another node, by how their KV came",
                 {{"kv_source", moved->kv_source}})
        .inc();
    metrics_.counter("armada_kv_migration_bytes_total", "KV journal bytes received with sessions that moved here")
        .inc(double(moved->bytes));
    ps->started = true;  // written to from here on; a repeated command finds it running
    store::Batch b;
    b.steps.push_back(step_record(*ps, "moved", dump(d)));
    checkpoint(*ps, std::move(b), [this](Session & s) { resume_loaded(s); });
    return true;
}

size_t SessionManager::offer_to_move(size_t n) {
    if (opt_.node.empty() || n == 0) return 0;
    std::lock_guard lk(mu_);
    if (draining_) return 0;
    // Waiting for tools first (their next step is a while off), then by KV held, largest first.
    std::vector<std::tuple<bool, int64_t, Session *>> c;
    for (auto & [id, s] : sessions_) {
        if (s->leaving_ms > 0 || !s->started || s->epoch <= 0 || has_ended(s->state) ||
            s->state == SessionState::WaitingInput || incoming_.count(id))
            continue;
        const int64_t kv = s->kv_history.empty() ? 0 : s->kv_history.back().tokens;
        c.emplace_back(s->state == SessionState::WaitingTool, kv, s.get());
    }
    std::sort(c.begin(), c.end(), [](const auto & a, const auto & b) {
        return std::make_pair(std::get<0>(a), std::get<1>(a)) > std::make_pair(std::get<0>(b), std::get<1>(b));
    });
    const int64_t now = clock_.now_ms();
    size_t picked = 0;
    for (auto & [waiting, kv, s] : c) {
        if (picked == n) break;
        s->leaving_ms = now;
        ++picked;
        spdlog::info("session {}: offered for a move (this node's KV is past its watermark)", s->id);
    }
    return picked;
}

size_t SessionManager::stay_unmoved(int64_t after_ms) {
    std::lock_guard lk(mu_);
    const int64_t now = clock_.now_ms();
    size_t n = 0;
    for (auto & [id, sp] : sessions_) {
        Session & s = *sp;
        if (s.leaving_ms == 0 || now - s.leaving_ms < after_ms || s.busy() || s.claim >= 0) continue;
        // The offer is withdrawn through the fence: the session is taken again under the next
        // epoch before it goes on. If the brain moved it first, that write is refused and the
        // session stops here (`drop_fenced`); if this one wins, the brain's move is refused.
        s.claim = s.epoch;
        checkpoint(s, {}, [this](Session & ss) {
            ss.leaving_ms = 0;
            resume_loaded(ss);
        });
        ++n;
    }
    return n;
}

void SessionManager::incoming(const std::string & id, bool on) {
    std::lock_guard lk(mu_);
    if (on)
        incoming_.insert(id);
    else
        incoming_.erase(id);
}

std::optional<obs::TraceContext> SessionManager::record_trace(std::string_view data) {
    return obs::TraceContext::in_record(data);
}

std::vector<SessionManager::Movable> SessionManager::movable() {
    std::vector<Movable> out = movable_sessions();
    // A session's journal holds its live KV, and is rewritten once it reaches twice that; each
    // record also carries its tokens and llama.cpp's own cell metadata. (The engine is asked
    // outside the table's lock.)
    for (auto & m : out) {
        if (const auto u = engine_.kv_usage(m.id); u && u->tokens > 0)
            m.kv_bytes = 2 * u->bytes + uint64_t(u->tokens) * 64 + (1u << 20);
    }
    return out;
}

std::vector<SessionManager::Movable> SessionManager::movable_sessions() {
    std::vector<Movable> out;
    if (opt_.node.empty()) return out;
    {
        std::lock_guard lk(mu_);
        if (!draining_) {
            for (const auto & [id, s] : sessions_)
                if (s->leaving_ms > 0 && s->started && s->epoch > 0 && !has_ended(s->state) && !s->busy())
                    out.push_back({id, s->epoch, s->trace_last, 0});
            return out;
        }
    }
    const auto rows = store_.open_sessions(opt_.cell, opt_.node, kEnded);
    for (const auto & r : rows ? *rows : std::vector<store::SessionRecord>{}) {
        if (r.node != opt_.node || r.epoch <= 0 || r.agent_id.rfind('@', 0) == 0) continue;
        std::lock_guard lk(mu_);
        auto it = sessions_.find(r.id);
        if (it != sessions_.end() && it->second->busy()) continue;
        out.push_back({r.id, r.epoch, it != sessions_.end() ? it->second->trace_last : record_trace(r.data), 0});
    }
    return out;
}

std::optional<size_t> SessionManager::open_here() {
    if (opt_.node.empty()) return 0;
    const auto open = store_.open_sessions(opt_.cell, opt_.node, kEnded);
    if (!open) return std::nullopt;
    size_t n = 0;
    for (const auto & r : *open)
        n += r.node == opt_.node;
    // An empty list may be a read that failed: the store is asked whether it can be read.
    if (n == 0 && !store_.has_session("-").has_value()) return std::nullopt;
    return n;
}

std::optional<bool> SessionManager::held_elsewhere(const std::string & id) {
    const auto r = store_.session(id);
    if (!r) {
        const auto exists = store_.has_session(id);
        if (!exists) return std::nullopt;
        return false;
    }
    return !r->node.empty() && r->node != opt_.node;
}

bool SessionManager::busy(const std::string & id) const {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    return it != sessions_.end() && it->second->busy();
}

bool SessionManager::running_here(const std::string & id, int64_t epoch) {
    auto it = sessions_.find(id);
    // Not running here, or it ran here before another node held it (the epoch went past
    // this node's next one): the store is newer than this copy.
    if (it == sessions_.end() || !it->second->started || it->second->epoch + 1 < epoch) return false;
    // Already here (a repeated command, or it came back to this node): it goes on under the
    // newer epoch.
    Session & s = *it->second;
    if (s.epoch < epoch) {
        s.epoch = epoch;
        s.claim = -1;
    }
    return true;
}

size_t SessionManager::adopt_assigned() {
    if (opt_.node.empty()) return 0;
    size_t n = 0;
    std::set<std::string> assigned;
    std::map<std::string, int64_t> unrun;
    const auto rows = store_.open_sessions(opt_.cell, opt_.node, kEnded);
    if (!rows) return 0;  // the store cannot be read: nothing is taken up, and nothing dropped
    for (const auto & r : *rows) {
        if (r.node != opt_.node || r.epoch <= 0 || r.agent_id.rfind('@', 0) == 0) continue;
        assigned.insert(r.id);
        {
            std::lock_guard lk(mu_);
            auto it = sessions_.find(r.id);
            // Running here under this epoch (or the one before it: a command that moves it on
            // is on its way). A copy older than that ran here before the session went away and
            // came back: `adopt` replaces it from the store.
            if ((it != sessions_.end() && it->second->started && it->second->epoch + 1 >= r.epoch) || draining_ ||
                incoming_.count(r.id))
                continue;
        }
        // New since the last call: its command is likely on its way (see the header).
        unrun[r.id] = r.epoch;
        const auto seen = unrun_assigned_.find(r.id);
        if (adopt_scanned_ && (seen == unrun_assigned_.end() || seen->second != r.epoch)) continue;
        unrun.erase(r.id);
        // Its command did not come (NATS lost it, or it waits there): a session past its first
        // assignment moved here all the same, without its KV, and its log says so.
        std::optional<MoveNote> note;
        if (r.epoch > 1) {
            note.emplace();
            note->kv_source = "none";
            note->error = "its move's command did not come; taken up from the store";
        }
        if (adopt(r.id, r.epoch, std::nullopt, note)) {
            spdlog::info("session {}: assigned to this node (epoch {}) but not running here; started", r.id, r.epoch);
            ++n;
        }
    }
    unrun_assigned_ = std::move(unrun);
    adopt_scanned_ = true;
    drop_moved(assigned);
    return n;
}

void SessionManager::drop_moved(const std::set<std::string> & assigned) {
    // Open sessions running here that the store did not list for this node. Each is read again
    // (it may have been placed here after the list was read) before it goes.
    // A busy one (a step, a tool call or a write under way) is left alone: its next write is
    // fenced by the store, and it stops then.
    std::vector<std::pair<std::string, int64_t>> unlisted;
    {
        std::lock_guard lk(mu_);
        for (const auto & [id, s] : sessions_) {
            if (s->started && s->epoch > 0 && !has_ended(s->state) && !assigned.count(id) && !s->busy())
                unlisted.emplace_back(id, s->epoch);
        }
    }
    for (const auto & [id, epoch] : unlisted) {
        const auto r = store_.session(id);
        if (!r) {
            // Deleted, or the store cannot be read now: one more read tells which. While it
            // cannot be read the rest wait for the next round (not one failing read after another).
            const auto exists = store_.has_session(id);
            if (!exists) break;
            if (*exists) continue;  // read again next round
        }
        // Still this node's, at its epoch or the next; or placed back here at a newer one, which
        // adopt_assigned takes up from the store in its next round.
        if (r && r->node == opt_.node) continue;
        std::lock_guard lk(mu_);
        auto it = sessions_.find(id);
        if (it == sessions_.end() || !it->second->started || it->second->epoch != epoch || it->second->busy()) continue;
        drop_fenced(*it->second, !r ? std::string("the store no longer has it")
                                    : "the store gives it to " + (r->node.empty() ? std::string("no node") : r->node) +
                                          " at epoch " + std::to_string(r->epoch) + ", this node ran it at epoch " +
                                          std::to_string(epoch));
    }
}

void SessionManager::resume_loaded(Session & s) {
    const obs::LogScope log_scope(s.id, s.turn_span ? std::optional(s.turn_span->context()) : s.trace_parent);
    s.started = true;
    Session * ps = &s;
    const std::string & agent_id = s.agent_id;
    ps->stream.transient("resumed", dump(json{{"state", state_name(ps->state)}}));
    if (!ps->agent) {
        spdlog::warn("session {}: its agent '{}' no longer exists", s.id, agent_id);
        fail(*ps, SessionEvent::Error, "its agent '" + agent_id + "' no longer exists");
        return;
    }
    {
        if (ps->state == SessionState::WaitingTool) {
            // Completed calls keep their recorded results; the rest go out again with the same key.
            const bool all =
                std::all_of(ps->calls.begin(), ps->calls.end(), [](const PendingCall & c) { return c.done; });
            if (all) {
                apply(*ps, SessionEvent::ToolsDone);
                checkpoint(*ps, {}, [this](Session & ss) { model_step(ss); });
            } else {
                run_tools(*ps);
            }
        } else if (ps->state == SessionState::Queued) {
            apply(*ps, SessionEvent::Start);
            checkpoint(*ps, {}, [this](Session & ss) { model_step(ss); });
        } else if (ps->state == SessionState::Running) {
            model_step(*ps);
        }
    }
}

// ---- lifecycle ----------------------------------------------------------------------------

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
