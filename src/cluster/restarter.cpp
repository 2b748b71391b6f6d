#include "cluster/restarter.h"

#include <nlohmann/json.hpp>

namespace armada::cluster {

using json = nlohmann::json;

std::string encode_restart_request(const RestartRequest & r, const std::string & rollout_id) {
    return json{{"rollout", rollout_id}, {"cell", r.cell}, {"version", r.version}, {"gen", r.gen}, {"back", r.back}}
        .dump();
}

std::optional<RestartRequest> decode_restart_request(const std::string & node, const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    RestartRequest r;
    try {
        r.node = node;
        r.cell = j.value("cell", "");
        r.version = j.value("version", "");
        r.gen = j.value("gen", int64_t(0));
        r.back = j.value("back", false);
    } catch (const json::exception &) {
        return std::nullopt;
    }
    if (r.version.empty() || r.gen <= 0) return std::nullopt;
    return r;
}

std::string encode_restart_ack(const RestartAck & a) {
    return json{{"gen", a.gen},     {"version", a.version}, {"pid", a.pid},      {"at_ms", a.at_ms},
                {"error", a.error}, {"note", a.note},       {"others", a.others}}
        .dump();
}

std::optional<RestartAck> decode_restart_ack(const std::string & text) {
    const auto j = json::parse(text, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    RestartAck a;
    try {
        a.gen = j.value("gen", int64_t(0));
        a.version = j.value("version", "");
        a.pid = j.value("pid", int64_t(0));
        a.at_ms = j.value("at_ms", int64_t(0));
        a.error = j.value("error", "");
        a.note = j.value("note", "");
        a.others = j.value("others", 0);
    } catch (const json::exception &) {
        return std::nullopt;
    }
    return a;
}

std::string EtcdRestarter::restart(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) {
    bool ok = false;
    int64_t rev = 0;
    const std::vector<EtcdCompare> fence{{EtcdCompare::Target::Create, me.key, me.rev}};
    if (auto e = etcd_.txn(fence, {{rollout_prefix(cfg_) + "restart/" + r.node, encode_restart_request(r, rollout_id)}},
                           ok, rev);
        !e.empty())
        return e;
    return ok ? "" : kNotLeader;
}

std::map<std::string, RestartAck> EtcdRestarter::acks() {
    std::map<std::string, RestartAck> out;
    std::vector<EtcdKv> kvs;
    int64_t rev = 0;
    const ClusterKeys keys(cfg_.prefix);
    if (!etcd_.list(keys.rollout() + "restarted/", kvs, rev).empty()) return out;
    for (const auto & kv : kvs) {
        const auto k = keys.parse(kv.key);
        if (k.kind != ClusterKeys::Parsed::Kind::RestartAck) continue;
        if (auto a = decode_restart_ack(kv.value)) out[k.name] = *a;
    }
    return out;
}

}  // namespace armada::cluster
