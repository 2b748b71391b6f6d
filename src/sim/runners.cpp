#include "sim/runners.h"

#include "cluster/membership.h"
#include "cluster/queue.h"
#include "cluster/runtime/bus.h"
#include "cluster/runtime/cell_runner.h"
#include "cluster/runtime/clock.h"
#include "cluster/runtime/elected.h"
#include "cluster/runtime/election.h"
#include "cluster/runtime/global_runner.h"
#include "cluster/runtime/keys.h"
#include "cluster/runtime/kv.h"
#include "cluster/runtime/node_agent.h"
#include "store/memory_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>

namespace armada::sim {

namespace {

using namespace cluster;

class World;

//! A process's lease as etcd keeps it: renewed every TTL/3 while the process runs, gone a TTL
//! after the last renewal.
struct Lease {
    int64_t id = 0;
    int64_t renewed = 0;
};

// ---- a brain: an election, and a runner while it leads ----

class Brain final : public Leadership {
  public:
    Brain(World & w, std::string name, std::string election)
        : w_(w), name_(std::move(name)), election_(std::move(election)) {}

    const EtcdLeader & me() const override { return me_; }
    int64_t lease() const override { return lease_.id; }
    void beat() override;
    bool still_leader() override;
    bool claim_store(store::Store & st) override { return mark_leader(st, election_, me_.rev).ok; }
    bool wait_stop(int) override { return false; }

    //! One turn of the process: keep-alive, campaign, and the runner's turn while leading.
    void tick();
    void keepalive();
    void kill();
    const std::string & name() const { return name_; }

    std::function<bool()> begin_fn;  // the runner's begin (false: cannot lead)
    std::function<bool()> turn_fn;   // the runner's turn (false: the term is over)
    std::function<void()> end_fn;
    bool alive = true, stopped = false;
    int64_t stalled_until = 0;  // its loop is stuck (a call that hangs) until then
    bool leading = false;
    //! Stalls its loop from now until `until`. A leading loop must lose the lead within one TTL.
    void stall(int64_t now, int64_t until) {
        stalled_until = until;
        stall_began = now;
        stall_checked = !leading;
    }
    //! Whether its own key leads the election, as etcd says (false when it cannot say).
    bool holds_lead();
    int64_t stall_began = 0;
    bool stall_checked = true;  // the stall's check is done, or there is none to do

  private:
    World & w_;
    std::string name_, election_;
    Lease lease_;
    EtcdLeader me_;
    int64_t last_beat_ = 0;
};

// ---- a node: its lease and load, its agent, and the sessions it runs ----

class Node;

class Sessions final : public NodeSessions {
  public:
    Sessions(World & w, Node & n) : w_(w), n_(n) {}
    bool adopt(const std::string & id, int64_t epoch, const std::optional<obs::TraceContext> &,
               const std::optional<Arrived> & moved) override;
    void adopt_assigned() override;
    void incoming(const std::string &, bool) override {}
    std::vector<Movable> movable() override { return {}; }
    void offer_to_move(size_t) override {}
    void stay_unmoved(int64_t) override {}
    //! Each run's step that is due.
    void step();
    size_t running() const { return runs_.size(); }

  private:
    struct Run {
        int64_t epoch = 0;
        int64_t next_seq = 1;
        int64_t next_at = 0;
    };
    World & w_;
    Node & n_;
    std::map<std::string, Run> runs_;
    int64_t next_due_ = 0;  // the earliest step due among runs_ (nothing to do before then)
};

class Node {
  public:
    Node(World & w, int cell, std::string name);
    void start();  // a fresh process
    void tick();
    void kill();
    void report();

    World & w;
    int cell;
    std::string name;
    bool alive = false, stopped = false;
    Lease lease;
    int64_t last_report = 0;
    int64_t seq = 0;
    std::unique_ptr<Inbox> commands;
    std::unique_ptr<Sessions> sessions;
    std::shared_ptr<NodeEvents> events;
    std::unique_ptr<NodeAgent> agent;
};

//! The store as the world sees it: every assignment that moves a session to another cell is
//! checked against the node leases of the cell it leaves.
class WatchedStore final : public store::ForwardingStore {
  public:
    WatchedStore(store::Store & inner, World & w) : ForwardingStore(inner), w_(w) {}
    void commit(store::Batch batch, std::function<void(store::Status)> done) override;

  private:
    World & w_;
};

class World {
  public:
    World(const RunnerScenario & s, uint64_t seed) : s(s), rng(seed), keys("/armada"), store(mem, *this) {
        bus.keep_sent(false);     // counted, not kept: a run at scale publishes millions
        kv.set_retention(60000);  // as `cluster up` runs etcd: periodic auto-compaction, 1 minute
    }

    RunnerResult run();

    const RunnerScenario & s;
    std::mt19937_64 rng;
    ClusterKeys keys;
    ManualClock clock{1'000'000};
    MemoryKv kv{&clock};
    MemoryBus bus;
    store::MemoryStore mem;
    WatchedStore store;
    obs::Registry metrics;
    RunnerResult r;
    int64_t t0 = 0;

    int64_t now() const { return clock.now_ms(); }
    double at_s() const { return double(now() - t0) / 1000.0; }
    void violation(const std::string & what) {
        if (r.violations.size() < 50) r.violations.push_back("t=" + std::to_string(at_s()) + "s " + what);
    }
    //! Grants or renews `l` for a process that runs now: a lease found gone is taken anew (false:
    //! etcd cannot be reached). A process that does not run renews nothing, and etcd ends its
    //! lease a TTL after the last renewal.
    bool renew(Lease & l) {
        if (kv_down) return false;
        const int k = l.id == 0 ? 0 : kv.keepalive(l.id);
        if (k < 0) return false;
        if (k == 0) l.id = kv.grant(s.lease_ttl_ms);
        l.renewed = now();
        return true;
    }

    // The run log: which nodes started a session at which epoch, and when a node died.
    std::map<std::pair<std::string, int64_t>, std::string> ran_on;
    std::map<std::string, int64_t> died_at;  // node → when it died or stopped (0: alive)
    std::map<std::string, std::string> last_node;
    std::set<std::string> completed;
    bool kv_down = false;
    int64_t kv_up_since = 0;  // when etcd last came back (a lease cannot be given up while it hangs)
    std::vector<std::unique_ptr<Node>> nodes;
    std::vector<std::unique_ptr<Brain>> brains;

  private:
    void nemesis();
    void gateway(int i);
    //! A leader whose loop has stalled for a lease TTL (and a tick) while etcd answered must no
    //! longer lead: its keep-alive gave the lease up. Checked once per stall.
    void check_stalled_leaders() {
        for (auto & b : brains) {
            if (b->stall_checked || !b->alive || kv_down || now() >= b->stalled_until) continue;
            const int64_t quiet = now() - std::max(b->stall_began, kv_up_since);
            if (quiet <= s.lease_ttl_ms + s.tick_ms) continue;
            b->stall_checked = true;
            if (b->holds_lead())
                violation(b->name() + " still leads " + std::to_string(quiet) + " ms into a stall of its loop");
        }
    }
    std::vector<std::unique_ptr<CellRunner>> cell_runners_;
    std::vector<std::unique_ptr<GlobalRunner>> global_runners_;
    std::vector<std::unique_ptr<Inbox>> inboxes_;
    struct Undo {
        int64_t at;
        std::function<void()> fn;
    };
    std::vector<Undo> undo_;
    std::optional<MemoryKv::Snapshot> snapshot_;
    int64_t snapshot_at_ = 0;
    //! The operator's forget-leaders, again until the store takes it.
    void forget_again() {
        store::Batch forget;
        forget.probe = true;
        forget.forget_leaders = true;
        if (!store.commit_sync(std::move(forget)).ok) undo_.push_back({now() + 1000, [this] { forget_again(); }});
    }
    int64_t next_fault_ = 0;
    int created_ = 0;
    int64_t shares_rev_ = -1;
    std::optional<Shares> shares_;
};

// ---- Brain ----

void Brain::beat() {
    last_beat_ = w_.now();
}

bool Brain::still_leader() {
    if (!leading || lease_.id == 0 || lease_.id != me_.lease) return false;
    EtcdLeader now;
    if (!election_leader(w_.kv, election_, now).empty()) return false;  // etcd cannot say: not leading
    return now.key == me_.key;
}

bool Brain::holds_lead() {
    if (me_.key.empty()) return false;
    EtcdLeader now;
    return election_leader(w_.kv, election_, now).empty() && now.key == me_.key;
}

void Brain::keepalive() {
    // Elected's keep-alive thread, asking the same `lease_step`: it runs while the loop is stuck,
    // and gives the lease up when a leading loop has not beaten for the stall limit.
    if (!alive || stopped || lease_.id == 0) return;
    switch (lease_step(w_.now(), lease_.renewed, last_beat_, leading, w_.s.lease_ttl_ms)) {
        case LeaseStep::Wait:
            return;
        case LeaseStep::Lost:  // no renewal for a TTL (etcd hung): it stops leading and stands again anew
            lease_.id = 0;
            me_ = {};
            return;
        case LeaseStep::GiveUp:
            if (!w_.kv_down) {
                w_.kv.revoke(lease_.id);
                lease_.id = 0;
            }
            return;
        case LeaseStep::Renew: {
            const int64_t had = lease_.id;
            if (w_.renew(lease_) && lease_.id != had) me_ = {};  // its lease went: stand again
            return;
        }
    }
}

void Brain::kill() {
    alive = false;
    if (leading && end_fn) end_fn();
    leading = false;
    // The process is gone; its lease (and candidacy) goes a TTL later. Started again, it is a new
    // process with a lease of its own.
    lease_ = {};
    me_ = {};
}

void Brain::tick() {
    if (!alive || stopped || w_.now() < stalled_until) return;
    if (leading) {
        beat();
        if (!turn_fn()) {
            end_fn();
            leading = false;
        }
        return;
    }
    // A standby: a lease and a candidacy, then it leads once its key is the oldest.
    if (lease_.id == 0 || lease_.id != me_.lease) {
        if (lease_.id == 0 && !w_.renew(lease_)) return;
        me_ = {};
    }
    if (me_.key.empty() && !stand(w_.kv, election_, name_, lease_.id, me_).empty()) {
        me_ = {};
        return;
    }
    leading = true;
    if (!still_leader()) {
        leading = false;
        return;
    }
    beat();
    ++w_.r.leader_changes;
    if (!begin_fn()) {
        leading = false;
        return;
    }
}

// ---- Sessions (what a node runs) ----

bool Sessions::adopt(const std::string & id, int64_t epoch, const std::optional<obs::TraceContext> &,
                     const std::optional<Arrived> &) {
    const auto row = w_.store.session(id);
    if (!row || row->node != n_.name || row->epoch != epoch || row->state == "completed") return false;
    if (auto it = runs_.find(id); it != runs_.end()) {
        it->second.epoch = std::max(it->second.epoch, epoch);
        return true;
    }
    if (int(runs_.size()) >= w_.s.capacity) w_.violation(n_.name + " placed past its capacity");
    // The check the world exists for: one node per session and epoch.
    auto [at, fresh] = w_.ran_on.try_emplace({id, epoch}, n_.name);
    if (!fresh && at->second != n_.name)
        w_.violation("session " + id + " ran on " + at->second + " and " + n_.name + " in epoch " +
                     std::to_string(epoch));
    // A failover's end: the first run elsewhere of a session whose node died.
    if (auto last = w_.last_node.find(id); last != w_.last_node.end() && last->second != n_.name) {
        if (auto d = w_.died_at.find(last->second); d != w_.died_at.end() && d->second > 0) {
            w_.r.failover_ms.push_back(w_.now() - d->second);
            d->second = -d->second;  // counted once per death
        }
    }
    w_.last_node[id] = n_.name;
    ++w_.r.runs;
    const int64_t done = int64_t(w_.store.steps(id).size());
    runs_[id] = {epoch, done + 1, w_.now() + w_.s.step_ms};
    next_due_ = std::min(next_due_, w_.now() + w_.s.step_ms);
    return true;
}

void Sessions::adopt_assigned() {
    const auto rows = w_.store.open_sessions(std::to_string(n_.cell), n_.name, kEndedStates);
    if (!rows) return;
    for (const auto & r : *rows)
        if (!runs_.count(r.id)) adopt(r.id, r.epoch, std::nullopt, std::nullopt);
}

void Sessions::step() {
    if (w_.now() < next_due_) return;
    next_due_ = INT64_MAX;
    for (auto it = runs_.begin(); it != runs_.end();) {
        Run & run = it->second;
        const std::string & id = it->first;
        if (w_.now() < run.next_at) {
            next_due_ = std::min(next_due_, run.next_at);
            ++it;
            continue;
        }
        store::Batch b;
        store::StepRecord st;
        st.session_id = id;
        st.seq = run.next_seq;
        st.kind = "tool_result";
        // Who made the call is in its result: the same call made again elsewhere is a different
        // entry at the same index, which the store refuses and the world reports.
        st.payload = "{\"call\":" + std::to_string(run.next_seq) + ",\"node\":\"" + n_.name +
                     "\",\"epoch\":" + std::to_string(run.epoch) + "}";
        st.idempotency = id + ":" + std::to_string(run.next_seq);
        b.steps.push_back(st);
        const bool last = run.next_seq >= w_.s.steps;
        if (last) {
            store::SessionRecord rec;
            rec.id = id;
            rec.agent_id = "worker";
            rec.state = "completed";
            rec.updated_ms = w_.clock.wall_ms();
            b.sessions.push_back(rec);
        }
        b.fences.push_back({id, n_.name, run.epoch});
        const store::Status s = w_.store.commit_sync(std::move(b));
        if (s.fenced) {
            ++w_.r.fenced;  // moved on: this node's copy stops
            it = runs_.erase(it);
            continue;
        }
        if (!s.ok) {
            if (s.error.find("different entry") != std::string::npos)
                w_.violation("a finished step of " + id + " ran again on " + n_.name + ": " + s.error);
            run.next_at = w_.now() + w_.s.tick_ms;  // the store is away: try again
            next_due_ = std::min(next_due_, run.next_at);
            ++it;
            continue;
        }
        ++w_.r.steps_acked;
        if (last) {
            if (!w_.completed.insert(id).second) w_.violation("session " + id + " completed twice");
            n_.events->ended(id, "completed");
            it = runs_.erase(it);
            continue;
        }
        ++run.next_seq;
        run.next_at = w_.now() + w_.s.step_ms;
        next_due_ = std::min(next_due_, run.next_at);
        ++it;
    }
}

// ---- Node ----

Node::Node(World & world, int c, std::string n) : w(world), cell(c), name(std::move(n)) {}

void Node::start() {
    alive = true;
    stopped = false;
    lease = {};
    last_report = 0;
    seq = int64_t(w.rng() & 0x3fffffff) << 20;  // a new process counts from a random start
    commands = w.bus.inbox(command_subject(name));
    sessions = std::make_unique<Sessions>(w, *this);
    events = std::make_shared<NodeEvents>(name);
    NodeAgentConfig c;
    c.cell = std::to_string(cell);
    c.node = name;
    c.command_wait_ms = 0;
    c.seed = w.rng();
    agent = std::make_unique<NodeAgent>(c, w.kv, w.bus, *commands, *sessions, events, w.clock);
    w.died_at[name] = 0;
}

void Node::kill() {
    alive = false;
    agent.reset();
    sessions.reset();
    lease = {};  // etcd ends it a TTL after its last renewal
    if (w.died_at[name] == 0) w.died_at[name] = w.now();
}

void Node::report() {
    NodeLoad l;
    l.node = name;
    const int n = sessions ? int(sessions->running()) : 0;
    l.sessions = n;
    l.free_seqs = std::max(0, w.s.capacity - n);
    l.kv_headroom = int64_t(1) << 32;
    l.url = "http://" + name;
    l.seq = ++seq;  // numbered, as NodeMembership does: a report read again is not news
    if (w.kv.put(w.keys.node(std::to_string(cell), name), encode_load(l), lease.id).empty()) last_report = w.now();
}

void Node::tick() {
    if (!alive || stopped) return;
    // NodeMembership: a lease, renewed every TTL/3; a lease found gone is taken again.
    if (lease.id == 0 || w.now() - lease.renewed >= w.s.lease_ttl_ms / 3) {
        const int64_t had = lease.id;
        if (w.renew(lease) && lease.id != had) last_report = 0;  // joined again: its key at once
    }
    if (lease.id != 0 && w.now() - last_report >= 1000) report();
    agent->command_turn(0);
    while (agent->event_turn(0, true)) {
    }
    sessions->step();
}

// ---- WatchedStore ----

void WatchedStore::commit(store::Batch batch, std::function<void(store::Status)> done) {
    for (const auto & a : batch.assign) {
        if (a.cell.empty()) continue;
        const auto row = static_cast<store::MemoryStore &>(inner_).peek(a.session_id);
        if (!row) continue;
        std::vector<EtcdKv> live;
        int64_t rev = 0;
        if (w_.kv.list(w_.keys.nodes(row->cell), live, rev).empty() && !live.empty())
            w_.violation("session " + a.session_id + " re-homed from cell " + row->cell + " while " +
                         std::to_string(live.size()) + " of its nodes hold live leases");
        ++w_.r.rehomes;
    }
    inner_.commit(std::move(batch), std::move(done));
}

// ---- the world ----

void World::gateway(int i) {
    // A session's row, then its place request (a gateway's order): in the cell the split names,
    // else round robin.
    const std::string id = "s" + std::to_string(i);
    std::string cell = std::to_string(i % s.cells);
    std::optional<EtcdKv> sk;
    if (kv.get(keys.shares(), sk).empty() && sk && sk->mod_revision != shares_rev_) {
        shares_rev_ = sk->mod_revision;  // decoded once per change, as a gateway's follower does
        shares_ = decode_shares(sk->value);
    }
    if (shares_)
        if (auto c = pick_cell(*shares_, "t" + std::to_string(i % 3)); !c.empty()) cell = c;
    store::Batch b;
    store::SessionRecord rec;
    rec.id = id;
    rec.agent_id = "worker";
    rec.owner = "t" + std::to_string(i % 3);
    rec.state = "queued";
    rec.cell = cell;
    rec.created_ms = clock.wall_ms();
    b.sessions.push_back(rec);
    if (!store.commit_sync(std::move(b)).ok) {
        --created_;  // refused: the client tries again at the next tick
        return;
    }
    bus.publish_async(place_subject(cell), "{\"session\":\"" + id + "\"}", id);
}

void World::nemesis() {
    // Undo what is due, then perhaps a new fault.
    std::vector<Undo> due;
    for (auto it = undo_.begin(); it != undo_.end();) {
        if (it->at <= now()) {
            due.push_back(std::move(*it));
            it = undo_.erase(it);
        } else {
            ++it;
        }
    }
    for (auto & u : due)
        u.fn();  // (it may schedule more)
    // A snapshot of etcd every 20 s, for a restore to go back to.
    if (now() - snapshot_at_ >= 20000) {
        snapshot_at_ = now();
        if (!kv_down) snapshot_ = kv.snapshot();
    }
    if (!s.faults || at_s() >= s.fault_s || now() < next_fault_) return;
    next_fault_ = now() + int64_t(std::exponential_distribution<double>(s.faults_per_s)(rng) * 1000.0);
    const auto pick = [&](size_t n) { return size_t(std::uniform_int_distribution<size_t>(0, n - 1)(rng)); };
    const auto ms = [&](int lo, int hi) { return int64_t(std::uniform_int_distribution<int>(lo, hi)(rng)); };
    const auto note = [&](const std::string & what) {
        char b[32];
        std::snprintf(b, sizeof b, "t=%.1fs ", at_s());
        r.faults.push_back(b + what);
    };
    switch (pick(10)) {
        case 0: {  // kill -9 a node; it is started again after 5-10 s
            Node & n = *nodes[pick(nodes.size())];
            if (!n.alive) return;
            note("kill -9 " + n.name);
            n.kill();
            undo_.push_back({now() + ms(5000, 10000), [&n] { n.start(); }});
            return;
        }
        case 1: {  // SIGSTOP a node, SIGCONT after 1-8 s
            Node & n = *nodes[pick(nodes.size())];
            if (!n.alive || n.stopped) return;
            note("SIGSTOP " + n.name);
            n.stopped = true;
            died_at[n.name] = now();
            undo_.push_back({now() + ms(1000, 8000), [this, &n] {
                                 if (!n.alive) return;  // killed while stopped: its restart wakes it
                                 n.stopped = false;
                                 died_at[n.name] = 0;
                             }});
            return;
        }
        case 2: {  // a brain's loop stalls on a call that hangs, for 1-6 s
            Brain & b = *brains[pick(brains.size())];
            if (!b.alive || b.stopped) return;
            note("stall " + b.name() + (b.leading ? " (leading)" : ""));
            b.stall(now(), now() + ms(1000, 6000));
            return;
        }
        case 3: {  // kill -9 a brain; back after 2-5 s
            Brain & b = *brains[pick(brains.size())];
            if (!b.alive) return;
            note("kill -9 " + b.name() + (b.leading ? " (leading)" : ""));
            b.kill();
            undo_.push_back({now() + ms(2000, 5000), [&b] { b.alive = true; }});
            return;
        }
        case 4: {  // etcd unreachable (it hangs) for 1-5 s
            if (kv_down) return;
            note("etcd hangs");
            kv_down = true;
            kv.set_down(true);
            undo_.push_back({now() + ms(1000, 5000), [this] {
                                 kv.set_down(false);  // every lease gets a fresh TTL
                                 kv_down = false;
                                 kv_up_since = now();
                             }});
            return;
        }
        case 5: {  // NATS hangs for 1-5 s
            note("NATS hangs");
            bus.set_down(true);
            undo_.push_back({now() + ms(1000, 5000), [this] { bus.set_down(false); }});
            return;
        }
        case 6: {  // PostgreSQL hangs for 1-5 s
            note("PostgreSQL hangs");
            mem.set_down(true);
            undo_.push_back({now() + ms(1000, 5000), [this] { mem.set_down(false); }});
            return;
        }
        case 8: {  // every brain of one cell hangs (its PostgreSQL hangs for them) for 16-25 s
            const std::string cell = std::to_string(pick(size_t(s.cells)));
            note("every brain of cell " + cell + " hangs");
            const int64_t until = now() + ms(16000, 25000);
            for (auto & b : brains)
                if (b->name().rfind("cell" + cell + "-", 0) == 0) b->stall(now(), until);
            return;
        }
        case 9: {  // etcd restored from a snapshot taken 10-30 s ago: its revision goes back
            if (!snapshot_ || kv_down) return;
            note("etcd restored to revision " + std::to_string(snapshot_->revision) + " (from " +
                 std::to_string(kv.revision()) + ")");
            kv.restore(*snapshot_);
            snapshot_.reset();
            // The documented recovery: stop every brain that led before, forget the leader marks
            // (`armada cluster forget-leaders`), start the brains again.
            for (auto & b : brains)
                if (b->alive) b->kill();
            store::Batch forget;
            forget.probe = true;
            forget.forget_leaders = true;
            if (!store.commit_sync(std::move(forget)).ok) undo_.push_back({now() + 1000, [this] { forget_again(); }});
            undo_.push_back({now() + ms(2000, 4000), [this] {
                                 for (auto & b : brains)
                                     b->alive = true;
                             }});
            return;
        }
        case 7: {  // a run command reaches a node that does not hold the session
            std::vector<std::string> open;
            for (int i = 0; i < created_; ++i)
                if (!completed.count("s" + std::to_string(i))) open.push_back("s" + std::to_string(i));
            if (open.empty()) return;
            const std::string id = open[pick(open.size())];
            const auto row = mem.peek(id);
            if (!row) return;
            Node & n = *nodes[pick(nodes.size())];
            if (n.name == row->node) return;
            note("run command for " + id + " (held by " + (row->node.empty() ? "none" : row->node) + ") sent to " +
                 n.name);
            bus.publish_async(
                command_subject(n.name),
                "{\"op\":\"run\",\"session\":\"" + id + "\",\"epoch\":" + std::to_string(row->epoch) + "}", "");
            return;
        }
    }
}

RunnerResult World::run() {
    t0 = now();
    for (int c = 0; c < s.cells; ++c)
        for (int i = 0; i < s.nodes_per_cell; ++i) {
            nodes.push_back(std::make_unique<Node>(*this, c, std::to_string(c) + "-n" + std::to_string(i)));
            nodes.back()->start();
        }
    for (int c = 0; c < s.cells; ++c) {
        const std::string cell = std::to_string(c);
        for (int b = 0; b < s.brains_per_cell; ++b) {
            inboxes_.push_back(bus.inbox(place_subject(cell)));
            Inbox & places = *inboxes_.back();
            inboxes_.push_back(bus.inbox(event_subject(cell)));
            Inbox & events = *inboxes_.back();
            CellRunnerConfig rc;
            rc.cell = cell;
            rc.fetch_wait_ms = 0;
            rc.reconcile_ms = s.reconcile_ms;
            rc.seed = rng();  // every draw from the world's seed: a seed replays
            cell_runners_.push_back(std::make_unique<CellRunner>(rc, kv, bus, places, events, store, clock, metrics));
            CellRunner & runner = *cell_runners_.back();
            brains.push_back(
                std::make_unique<Brain>(*this, "cell" + cell + "-b" + std::to_string(b), keys.cell_election(cell)));
            Brain & brain = *brains.back();
            brain.begin_fn = [&runner, &brain] { return runner.begin(brain); };
            brain.turn_fn = [&runner, &brain] { return runner.turn(brain); };
            brain.end_fn = [&runner] { runner.end(); };
        }
    }
    GlobalRunnerConfig gc;
    for (int c = 0; c < s.cells; ++c)
        gc.cells.push_back({std::to_string(c), "", 0.9});
    gc.lease_ttl_s = std::max(1, s.lease_ttl_ms / 1000);
    for (int g = 0; g < s.globals; ++g) {
        gc.seed = rng();
        global_runners_.push_back(std::make_unique<GlobalRunner>(gc, kv, bus, store, clock, metrics));
        GlobalRunner & runner = *global_runners_.back();
        brains.push_back(std::make_unique<Brain>(*this, "global-" + std::to_string(g), keys.global_election()));
        Brain & brain = *brains.back();
        int64_t last = 0;
        brain.begin_fn = [&runner, &brain] { return runner.begin(brain); };
        brain.turn_fn = [this, &runner, &brain, last]() mutable {
            if (now() - last < 1000) return true;  // the global brain turns once a second
            last = now();
            return runner.turn(brain);
        };
        brain.end_fn = [&runner] { runner.end(); };
    }
    const int64_t end = t0 + int64_t(s.duration_s * 1000);
    // Sessions arrive over the first half of the faults, unless the scenario says otherwise.
    const int64_t spread = int64_t((s.arrive_s >= 0 ? s.arrive_s : s.fault_s / 2) * 1000);
    int64_t sampled_at = now();
    while (now() < end) {
        clock.advance(s.tick_ms);
        nemesis();
        while (created_ < s.sessions && now() - t0 >= spread * created_ / std::max(1, s.sessions)) {
            const int before = created_;
            gateway(created_++);
            if (created_ == before) break;  // refused: the client tries again next tick
        }
        kv.expire_leases();
        for (auto & b : brains)
            b->keepalive();
        for (auto & n : nodes)
            n->tick();
        for (auto & b : brains)
            b->tick();
        check_stalled_leaders();
        if (now() - sampled_at >= 10000) {
            sampled_at = now();
            EtcdStatus st;
            bool alarms = false;
            if (!kv_down && kv.status(st, alarms).empty()) r.kv_db_bytes_max = std::max(r.kv_db_bytes_max, st.db_bytes);
        }
        if (int(completed.size()) == s.sessions && at_s() >= s.fault_s) break;
    }
    r.sim_s = at_s();
    r.complete = s.complete;
    r.kv_writes = kv.writes();
    r.bus_messages = bus.published();
    // Brains whose lease was never renewed: a killed one's lease goes too.
    r.sessions = s.sessions;
    r.completed = int(completed.size());
    const auto c = mem.counts();
    r.store_reads = c.reads;
    r.store_rows = c.rows_scanned;
    r.kv_calls = kv.calls();
    EtcdStatus st;
    bool alarms = false;
    if (kv.status(st, alarms).empty()) r.kv_db_bytes = st.db_bytes;
    for (int i = 0; i < s.sessions && s.complete; ++i)
        if (!completed.count("s" + std::to_string(i))) {
            const auto row = mem.peek("s" + std::to_string(i));
            violation("session s" + std::to_string(i) + " did not complete (" +
                      (row ? row->state + " on " + (row->node.empty() ? "no node" : row->node) + " in cell " +
                                 row->cell + " at epoch " + std::to_string(row->epoch)
                           : "no row") +
                      ")");
        }
    return std::move(r);
}

}  // namespace

RunnerResult run_runners(const RunnerScenario & s, uint64_t seed) {
    const auto level = spdlog::get_level();
    spdlog::set_level(spdlog::level::off);  // the runners' logs: thousands of lines per seed
    World w(s, seed);
    RunnerResult r = w.run();
    spdlog::set_level(level);
    return r;
}

}  // namespace armada::sim
