#include "cli/kv_move.h"

#include "api/errors.h"
#include "common/clock.h"
#include "engine/kv_pool.h"
#include "tools/http_sync.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <thread>

namespace armada::cli {

std::string kv_fingerprint_tag(const std::string & fingerprint) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, engine::fnv1a64(fingerprint.data(), fingerprint.size()));
    return hex;
}

KvSender::KvSender(engine::EngineSet & eng, agent::SessionManager & sessions, int cut_every)
    : eng_(eng), sessions_(sessions), cut_every_(cut_every) {}

KvSender::~KvSender() {
    stopping_ = true;  // a send paced on a client the server no longer serves ends now
    std::vector<Worker> workers;
    {
        std::lock_guard lk(mu_);
        workers.swap(workers_);
    }
    for (auto & w : workers)
        if (w.thread.joinable()) w.thread.join();
}

bool KvSender::served(const std::string & session) const {
    std::lock_guard lk(mu_);
    return served_.count(session) > 0;
}

void KvSender::send(const std::string & session, std::shared_ptr<api::Responder> out) {
    if (active_.fetch_add(1) >= kMaxSends) {
        --active_;
        api::ApiError e(503, "this node is sending " + std::to_string(kMaxSends) + " KV journals already", {}, "busy");
        e.retry_after_s = 1;
        throw e;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard lk(mu_);
    // Threads that finished are joined here: a node sends a few journals at a time.
    std::erase_if(workers_, [](Worker & w) {
        if (!w.done->load()) return false;
        w.thread.join();
        return true;
    });
    // The checks read the store and wait for the journal's writer: on the send's own thread,
    // not the I/O thread that took the request.
    workers_.push_back({std::thread([this, out, done, session] {
                            run(session, out);
                            last_served_ms_ = common::steady_ms();
                            --active_;
                            done->store(true);
                        }),
                        done});
}

void KvSender::run(const std::string & session, const std::shared_ptr<api::Responder> & out) {
    auto refuse = [&](int status, const std::string & code, const std::string & message) {
        out->send(status, "application/json", api::error_body(status, message, {}, code));
    };
    if (sessions_.busy(session))
        return refuse(409, "busy", "session '" + session + "' is in the middle of a step here; ask again after it");
    // Only a session the store gives to another node now: its KV is no use here any more. (A
    // request for one that still runs here is refused; the send would also drop its KV.)
    if (auto elsewhere = sessions_.held_elsewhere(session); !elsewhere || !*elsewhere)
        return refuse(409, "not_moved",
                      !elsewhere ? "the store cannot be read now; ask again"
                                 : "session '" + session + "' is not moving from this node");
    std::string why;
    auto file = eng_.open_kv(session, why);
    if (!file) return refuse(404, "not_found", "no KV of session '" + session + "' here: " + why);
    const engine::KvJournal::SendFile f = *file;
    const uint64_t n = ++started_;
    const bool cut = cut_every_ > 0 && n % uint64_t(cut_every_) == 0;
    out->start_stream(200, {{"Content-Type", "application/octet-stream"},
                            {"Cache-Control", "no-store"},
                            {"X-Armada-KV-Bytes", std::to_string(f.bytes)},
                            {"X-Armada-KV-Tokens", std::to_string(f.n_tokens)},
                            {"X-Armada-KV-Fingerprint", kv_fingerprint_tag(eng_.at(0).fingerprint())}});
    const uint64_t limit = cut ? f.bytes / 2 : f.bytes;
    constexpr size_t kPiece = 1u << 20;
    constexpr size_t kAhead = 4u << 20;  // queued for the client at most
    std::string buf;
    uint64_t off = 0;
    bool ok = true;
    while (off < limit && !out->closed()) {
        if (stopping_.load()) {
            ok = false;
            break;
        }
        if (out->backlog() > kAhead) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            continue;
        }
        buf.resize(size_t(std::min<uint64_t>(kPiece, limit - off)));
        const ssize_t r = ::pread(f.fd, buf.data(), buf.size(), off_t(off));
        if (r <= 0) {
            spdlog::warn("kv: reading session {}'s journal to send it failed", session);
            ok = false;
            break;
        }
        buf.resize(size_t(r));
        off += uint64_t(r);
        out->write(std::move(buf));
        buf = {};
    }
    ::close(f.fd);
    // Sent whole: the session is another node's (checked above), so the KV here only takes room.
    if (ok && !cut && off == f.bytes) eng_.release(session, true);
    if (cut) spdlog::warn("kv: session {}'s journal cut at {} bytes (ARMADA_KV_SEND_CUT)", session, off);
    if (ok && !cut && off == f.bytes)
        out->end();
    else
        out->abort();
    std::lock_guard lk(mu_);
    served_.insert(session);
}

std::string kv_offer_problem(uint64_t offered, uint64_t stated, uint64_t disk) {
    if (stated > 0 && offered > stated)
        return "the source offers " + std::to_string(offered) + " bytes, more than the move command's " +
               std::to_string(stated);
    if (offered > disk)
        return "the source offers " + std::to_string(offered) + " bytes, more than this node's --kv-disk (" +
               std::to_string(disk) + ")";
    return {};
}

agent::MoveNote fetch_kv(engine::EngineSet & eng, const std::string & session, const std::string & from_node,
                         const std::string & source_url, const std::vector<std::string> & keys,
                         boost::asio::ssl::context * tls, uint64_t max_bytes, uint64_t stated) {
    agent::MoveNote note;
    note.from = from_node;
    note.kv_source = "none";
    const auto t0 = std::chrono::steady_clock::now();
    auto finish = [&](std::string error) {
        note.ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        note.error = std::move(error);
        if (!note.error.empty()) {
            note.kv_source = "none";
            spdlog::warn("kv: session {} moves from {} without its KV ({}); it re-prefills", session, from_node,
                         note.error);
        }
        return note;
    };
    if (source_url.empty()) return finish("node " + from_node + " is gone");
    // The move command states the most the journal can be; without it, nothing is fetched.
    if (stated == 0) return finish("the move command states no KV size (its node offered none)");
    const auto [path, engine] = eng.incoming_kv(session);
    if (path.empty()) return finish("this node keeps no KV journal");
    // The source's address comes from etcd, which the operator runs: any address is allowed.
    tools::SsrfGuard guard;
    for (const char * all : {"0.0.0.0/0", "::/0"}) {
        tools::Cidr c;
        if (tools::parse_cidr(all, c)) guard.allow(c);
    }
    const std::string want = kv_fingerprint_tag(eng.at(0).fingerprint());
    uint64_t expect = 0;
    tools::DownloadOptions o;
    o.tls = tls;
    o.max_bytes = stated > 0 ? std::min(max_bytes, stated) : max_bytes;
    o.check = [&](int, const std::map<std::string, std::string> & h) -> std::string {
        auto fp = h.find("x-armada-kv-fingerprint");
        if (fp == h.end() || fp->second != want)
            return "fingerprint differs (the nodes run another model, context size or llama.cpp build)";
        auto b = h.find("x-armada-kv-bytes");
        if (b == h.end()) return "the reply does not say its size";
        try {
            expect = std::stoull(b->second);
        } catch (...) {
            return "the reply's size is not a number";
        }
        return kv_offer_problem(expect, stated, max_bytes);
    };
    size_t key = 0;
    auto headers_for = [&] {
        std::vector<std::pair<std::string, std::string>> h;
        if (key < keys.size() && !keys[key].empty()) h.emplace_back("Authorization", "Bearer " + keys[key]);
        return h;
    };
    // A busy source (a step still ending there, or its 4 sends in use) is asked again, for up
    // to 15 s, before the session goes without its KV.
    tools::Download d;
    for (int pause_ms = 100;; pause_ms = std::min(pause_ms * 2, 2000)) {
        d = tools::http_download(source_url + "/admin/kv/" + session, headers_for(), path, o, guard);
        if ((d.status == 401 || d.status == 403) && key + 1 < keys.size()) {
            ++key;  // the next key, at once
            continue;
        }
        const bool again = d.status == 409 || d.status == 503;
        if (!again || std::chrono::steady_clock::now() - t0 > std::chrono::seconds(15)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
    std::error_code ec;
    if (!d.error.empty()) {
        std::filesystem::remove(path, ec);
        return finish("fetching it from " + from_node + ": " + d.error);
    }
    if (d.bytes != expect) {
        std::filesystem::remove(path, ec);
        return finish("fetching it from " + from_node + ": " + std::to_string(d.bytes) + " of " +
                      std::to_string(expect) + " bytes came");
    }
    if (auto e = eng.install_kv(engine, session, path); !e.empty()) {
        std::filesystem::remove(path, ec);
        return finish("installing it: " + e);
    }
    note.kv_source = "transfer";
    note.bytes = d.bytes;
    if (auto u = eng.kv_usage(session)) note.tokens = u->tokens;
    return finish({});
}

}  // namespace armada::cli
