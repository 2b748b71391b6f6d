// Placement: where a session runs. Resuming after a restart, a brain's assignment (adopt), a
// move offered with its KV, the level-triggered catch-up, and a session fenced by another node.

#include "agent/placement.h"

#include "agent/session.h"

#include "common/json_fields.h"
#include "obs/log.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace armada::agent {

using json = nlohmann::json;

Placement::Placement(Host & host, store::Store & store, GenerationPort & engine, SessionLog & log,
                     AgentRegistry & agents, obs::Registry & metrics, const Clock & clock, Options opt)
    : host_(host),
      store_(store),
      engine_(engine),
      log_(log),
      agents_(agents),
      metrics_(metrics),
      clock_(clock),
      opt_(std::move(opt)) {}

void Placement::drop_fenced(Session & s, const std::string & why) {
    spdlog::warn("session {}: fenced ({}); another node holds it now, so it stops here", s.id, why);
    ++fenced_;
    metrics_.counter("armada_sessions_fenced_total", "Sessions stopped because another node took them over").inc();
    if (s.gen.cancel) {
        s.gen.cancel->store(true);
        engine_.wake();
    }
    // A move this node offered (or a drain) hands the turn on: the next node continues it, under
    // the brain's `migrate` span. Anything else is a fence.
    const bool handed_on = host_.draining() || s.place.leaving_ms > 0;
    // Handed on between steps, its KV journal stays until the node that took it has fetched it.
    engine_.release(s.id, !handed_on);
    for (auto & p : s.log.outbox) {
        if (p.reply) p.reply({409, "session '" + s.id + "' moved to another node; retry the request", s.id, 1});
    }
    s.log.outbox.clear();
    if (handed_on && s.trace.turn) s.trace.turn->set("armada.handed_off", true);
    host_.drop(s, handed_on ? std::string() : "fenced: another node holds the session now");
}

void Placement::go_on(Session & s) {
    s.place.started = true;
    host_.resume(s);
}

std::unique_ptr<Session> Placement::rebuilt(const store::SessionRecord & r,
                                            const std::vector<store::StepRecord> & steps, int64_t epoch) {
    auto sp = SessionLog::rebuild(r, steps, engine_.kv_bytes_per_token());
    if (!sp) return nullptr;
    sp->agent = agents_.lookup(r.owner, r.agent_id);
    sp->place.epoch = epoch;
    return sp;
}

size_t Placement::resume_all() {
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
        auto lk = host_.lock();
        if (host_.session(r.id)) continue;
        auto sp = rebuilt(r, steps, r.epoch);
        if (!sp) continue;
        Session & s = *sp;
        host_.install(std::move(sp));
        ++resumed;
        go_on(s);
    }
    return resumed;
}

bool Placement::adopt(const std::string & id, int64_t epoch, std::optional<obs::TraceContext> trace,
                      std::optional<MoveNote> moved) {
    auto rec = store_.session(id);
    if (!rec || rec->node != opt_.node || rec->epoch != epoch || rec->agent_id.rfind('@', 0) == 0) return false;
    const auto st = parse_state(rec->state);
    if (!st || has_ended(*st)) return false;
    {
        auto lk = host_.lock();
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
    auto lk = host_.lock();
    if (running_here(id, epoch)) return true;  // started meanwhile
    auto sp = rebuilt(*rec, steps, epoch);
    if (!sp) return false;
    // A session that has not taken a turn yet is in the trace of the `place` that brought it.
    if (!sp->trace.last) sp->trace.last = trace;
    sp->trace.parent = std::move(trace);
    Session & s = *sp;
    if (Session * old = host_.session(id)) {
        // A copy loaded to be read or streamed (or one that ran here before the session moved
        // away): the store is newer. Its subscribers stay, and get the steps written since.
        if (old->gen.cancel) {
            old->gen.cancel->store(true);
            engine_.wake();
        }
        s.gen.id = old->gen.id + 1;  // late engine events of the old copy are ignored
        s.stream.take_over(old->stream, steps);
    }
    host_.install(std::move(sp));
    if (!moved) {
        go_on(s);
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
    s.place.started = true;  // written to from here on; a repeated command finds it running
    store::Batch b;
    b.steps.push_back(log_.step(s, "moved", common::json_text(d)));
    log_.checkpoint(s, std::move(b), [this](Session & ss) { go_on(ss); });
    return true;
}

size_t Placement::offer_to_move(size_t n) {
    if (opt_.node.empty() || n == 0) return 0;
    auto lk = host_.lock();
    if (host_.draining()) return 0;
    // Waiting for tools first (their next step is a while off), then by KV held, largest first.
    std::vector<std::tuple<bool, int64_t, Session *>> c;
    for (Session * s : host_.all_sessions()) {
        if (s->place.leaving_ms > 0 || !s->place.started || s->place.epoch <= 0 || has_ended(s->state) ||
            s->state == SessionState::WaitingInput || incoming_.count(s->id))
            continue;
        const int64_t kv = s->transcript.kv_history.empty() ? 0 : s->transcript.kv_history.back().tokens;
        c.emplace_back(s->state == SessionState::WaitingTool, kv, s);
    }
    std::sort(c.begin(), c.end(), [](const auto & a, const auto & b) {
        return std::make_pair(std::get<0>(a), std::get<1>(a)) > std::make_pair(std::get<0>(b), std::get<1>(b));
    });
    const int64_t now = clock_.now_ms();
    size_t picked = 0;
    for (auto & [waiting, kv, s] : c) {
        if (picked == n) break;
        s->place.leaving_ms = now;
        ++picked;
        spdlog::info("session {}: offered for a move (this node's KV is past its watermark)", s->id);
    }
    return picked;
}

size_t Placement::stay_unmoved(int64_t after_ms) {
    auto lk = host_.lock();
    const int64_t now = clock_.now_ms();
    size_t n = 0;
    for (Session * sp : host_.all_sessions()) {
        Session & s = *sp;
        if (s.place.leaving_ms == 0 || now - s.place.leaving_ms < after_ms || s.busy() || s.place.claim >= 0) continue;
        // The offer is withdrawn through the fence: the session is taken again under the next
        // epoch before it goes on. If the brain moved it first, that write is refused and the
        // session stops here (`drop_fenced`); if this one wins, the brain's move is refused.
        s.place.claim = s.place.epoch;
        log_.checkpoint(s, {}, [this](Session & ss) {
            ss.place.leaving_ms = 0;
            go_on(ss);
        });
        ++n;
    }
    return n;
}

void Placement::incoming(const std::string & id, bool on) {
    auto lk = host_.lock();
    if (on)
        incoming_.insert(id);
    else
        incoming_.erase(id);
}

std::vector<Movable> Placement::movable() {
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

std::vector<Movable> Placement::movable_sessions() {
    std::vector<Movable> out;
    if (opt_.node.empty()) return out;
    {
        auto lk = host_.lock();
        if (!host_.draining()) {
            for (const Session * s : host_.all_sessions())
                if (s->place.leaving_ms > 0 && s->place.started && s->place.epoch > 0 && !has_ended(s->state) &&
                    !s->busy())
                    out.push_back({s->id, s->place.epoch, s->trace.last, 0});
            return out;
        }
    }
    const auto rows = store_.open_sessions(opt_.cell, opt_.node, kEnded);
    for (const auto & r : rows ? *rows : std::vector<store::SessionRecord>{}) {
        if (r.node != opt_.node || r.epoch <= 0 || r.agent_id.rfind('@', 0) == 0) continue;
        auto lk = host_.lock();
        const Session * s = host_.session(r.id);
        if (s && s->busy()) continue;
        out.push_back({r.id, r.epoch, s ? s->trace.last : obs::TraceContext::in_record(r.data), 0});
    }
    return out;
}

std::optional<size_t> Placement::open_here() {
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

std::optional<bool> Placement::held_elsewhere(const std::string & id) {
    const auto r = store_.session(id);
    if (!r) {
        const auto exists = store_.has_session(id);
        if (!exists) return std::nullopt;
        return false;
    }
    return !r->node.empty() && r->node != opt_.node;
}

bool Placement::running_here(const std::string & id, int64_t epoch) {
    Session * found = host_.session(id);
    // Not running here, or it ran here before another node held it (the epoch went past
    // this node's next one): the store is newer than this copy.
    if (!found || !found->place.started || found->place.epoch + 1 < epoch) return false;
    // Already here (a repeated command, or it came back to this node): it goes on under the
    // newer epoch.
    Session & s = *found;
    if (s.place.epoch < epoch) {
        s.place.epoch = epoch;
        s.place.claim = -1;
    }
    return true;
}

size_t Placement::adopt_assigned() {
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
            auto lk = host_.lock();
            const Session * s = host_.session(r.id);
            // Running here under this epoch (or the one before it: a command that moves it on
            // is on its way). A copy older than that ran here before the session went away and
            // came back: `adopt` replaces it from the store.
            if ((s && s->place.started && s->place.epoch + 1 >= r.epoch) || host_.draining() || incoming_.count(r.id))
                continue;
        }
        // New since the last call: its command is likely on its way (a brain writes the row
        // before it sends the command, which may be a move whose KV comes first).
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

void Placement::drop_moved(const std::set<std::string> & assigned) {
    // Open sessions running here that the store did not list for this node. Each is read again
    // (it may have been placed here after the list was read) before it goes.
    // A busy one (a step, a tool call or a write under way) is left alone: its next write is
    // fenced by the store, and it stops then.
    std::vector<std::pair<std::string, int64_t>> unlisted;
    {
        auto lk = host_.lock();
        for (const Session * s : host_.all_sessions()) {
            if (s->place.started && s->place.epoch > 0 && !has_ended(s->state) && !assigned.count(s->id) && !s->busy())
                unlisted.emplace_back(s->id, s->place.epoch);
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
        auto lk = host_.lock();
        Session * s = host_.session(id);
        if (!s || !s->place.started || s->place.epoch != epoch || s->busy()) continue;
        drop_fenced(*s, !r ? std::string("the store no longer has it")
                           : "the store gives it to " + (r->node.empty() ? std::string("no node") : r->node) +
                                 " at epoch " + std::to_string(r->epoch) + ", this node ran it at epoch " +
                                 std::to_string(epoch));
    }
}

}  // namespace armada::agent
