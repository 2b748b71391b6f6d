#include "cluster/kube_restarter.h"

#include "common/backoff.h"
#include "common/json_fields.h"
#include "net/http_client.h"
#include "net/tls.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace armada::cluster {

using json = nlohmann::json;

namespace {

constexpr const char * kVersionAnnotation = "armada.dev/version";
constexpr const char * kServiceAccount = "/var/run/secrets/kubernetes.io/serviceaccount/";

bool read_file(const std::string & path, std::string & out) {
    std::ifstream f(path);
    if (!f) return false;
    std::stringstream ss;
    ss << f.rdbuf();
    out = ss.str();
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' '))
        out.pop_back();
    return true;
}

// "armada-node-3" -> ("armada-node", 3); false for a name that is not NAME-ORDINAL.
bool split_pod(const std::string & pod, std::string & set, int & ordinal) {
    const auto dash = pod.rfind('-');
    if (dash == std::string::npos || dash == 0 || dash + 1 >= pod.size() || pod.size() - dash > 7) return false;
    ordinal = 0;
    for (size_t i = dash + 1; i < pod.size(); ++i) {
        if (pod[i] < '0' || pod[i] > '9') return false;
        ordinal = ordinal * 10 + (pod[i] - '0');
    }
    set = pod.substr(0, dash);
    return true;
}

// A pod template's version: its `armada.dev/version` annotation, else the container's
// ARMADA_VERSION_LABEL (what the node reports); "" when it has neither.
std::string version_of(const json & template_spec, const std::string & container) {
    if (const auto * a = common::object_at(template_spec, {"metadata", "annotations"}))
        if (auto v = common::string_field(*a, kVersionAnnotation)) return *v;
    const auto * pod_spec = common::object_field(template_spec, "spec");
    const auto * containers = pod_spec ? common::array_field(*pod_spec, "containers") : nullptr;
    if (!containers) return {};
    for (const auto & c : *containers) {
        const auto * env = common::array_field(c, "env");
        if (common::string_field(c, "name") != container || !env) continue;
        for (const auto & e : *env)
            if (common::string_field(e, "name") == "ARMADA_VERSION_LABEL")
                if (auto v = common::string_field(e, "value")) return *v;
    }
    return {};
}

}  // namespace

std::string kube_config_in_pod(KubeConfig & c) {
    const char * host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char * port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host) return "KUBERNETES_SERVICE_HOST is not set: this process does not run in a pod";
    const std::string h = host;
    c.api = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + (port && *port ? port : "443");
    c.token_file = std::string(kServiceAccount) + "token";
    if (!read_file(c.token_file, c.token) || c.token.empty())
        return std::string("cannot read the service account's token in ") + kServiceAccount;
    if (!read_file(std::string(kServiceAccount) + "namespace", c.ns) || c.ns.empty())
        return std::string("cannot read the pod's namespace in ") + kServiceAccount;
    c.ca_file = std::string(kServiceAccount) + "ca.crt";
    return {};
}

std::string EtcdLedger::put_ack(const std::string & node, const RestartAck & a, const EtcdLeader & me) {
    bool ok = false;
    int64_t rev = 0;
    const std::vector<EtcdCompare> fence{{EtcdCompare::Target::Create, me.key, me.rev}};
    if (auto e = etcd_.txn(fence, {{rollout_prefix(cfg_) + "restarted/" + node, encode_restart_ack(a)}}, ok, rev);
        !e.empty())
        return e;
    return ok ? "" : kNotLeader;
}

struct KubeRestarter::Tls {
    std::shared_ptr<boost::asio::ssl::context> ctx;
};

KubeRestarter::KubeRestarter(KubeConfig cfg, RestartLedger & ledger, std::function<int64_t()> wall_ms)
    : cfg_(std::move(cfg)), ledger_(ledger), wall_ms_(std::move(wall_ms)), tls_(std::make_unique<Tls>()) {
    if (cfg_.api.rfind("https://", 0) == 0) {
        std::string err;
        tls_->ctx = armada::net::client_tls(cfg_.ca_file, err, "the CA file");
        if (!tls_->ctx) spdlog::error("kubernetes: the API server's CA {}: {}", cfg_.ca_file, err);
    }
    worker_ = std::thread([this] { work(); });
}

KubeRestarter::~KubeRestarter() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
}

namespace {

bool same_leader(const EtcdLeader & a, const EtcdLeader & b) {
    return a.key == b.key && a.rev == b.rev;
}

}  // namespace

std::string KubeRestarter::restart(const RestartRequest & r, const std::string & rollout_id, const EtcdLeader & me) {
    // Once per gen: a request carried out (or refused) is acknowledged in the ledger.
    if (auto a = ledger_.acks(); a.count(r.node) && a.at(r.node).gen >= r.gen) return {};
    {
        std::lock_guard lk(mu_);
        auto j = jobs_.find(r.node);
        if (j != jobs_.end() && j->second.r.gen > r.gen) return {};
        if (j != jobs_.end() && j->second.r.gen == r.gen) {
            // Asked again by another term of leadership (this process may lead again): the job
            // goes on under the leader that asks now, and soon.
            if (!same_leader(j->second.me, me)) {
                j->second.me = me;
                j->second.rollout_id = rollout_id;
                j->second.due = std::min(j->second.due, std::chrono::steady_clock::now());
                cv_.notify_all();
            }
            return {};
        }
        // The claim under the leader's fence is the API thread's, right before it acts.
        jobs_[r.node] = {r, rollout_id, me, 0, std::chrono::steady_clock::now(), {}, std::nullopt};
    }
    cv_.notify_all();
    return {};
}

void KubeRestarter::forget_except(const std::vector<RestartRequest> & wanted) {
    std::lock_guard lk(mu_);
    std::erase_if(jobs_, [&](const auto & kv) {
        const bool keep = std::any_of(wanted.begin(), wanted.end(), [&](const RestartRequest & w) {
            return w.node == kv.first && w.gen == kv.second.r.gen;
        });
        if (!keep)
            spdlog::info("kubernetes: restart of {} on {} (gen {}) no longer wanted: dropped", kv.first,
                         kv.second.r.version, kv.second.r.gen);
        return !keep;
    });
    cv_.notify_all();
}

bool KubeRestarter::wait_idle(int timeout_ms) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return jobs_.empty() && busy_ == 0; });
}

std::map<std::string, std::string> KubeRestarter::retrying() {
    std::lock_guard lk(mu_);
    std::map<std::string, std::string> out;
    for (const auto & [node, j] : jobs_)
        if (!j.last_error.empty()) out[node] = j.last_error;
    return out;
}

void KubeRestarter::work() {
    using clock = std::chrono::steady_clock;
    std::minstd_rand jitter(std::random_device{}());
    std::unique_lock lk(mu_);
    while (!stop_) {
        // The job due first.
        auto next = jobs_.end();
        for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
            if (next == jobs_.end() || it->second.due < next->second.due) next = it;
        if (next == jobs_.end()) {
            cv_.wait(lk);
            continue;
        }
        if (next->second.due > clock::now()) {
            // A copy: the wait lets go of the lock, and the job may be dropped meanwhile
            // (`forget_except`), taking its `due` with it.
            const clock::time_point due = next->second.due;
            cv_.wait_until(lk, due);
            continue;
        }
        Job job = next->second;
        ++busy_;
        lk.unlock();
        std::string e;
        bool drop = false, done = false, acting = false;
        try {
            if (!job.ack) {
                // Claimed under the leader's fence right before each try: a brain that no longer
                // leads drops it.
                e = ledger_.claim(job.r, job.rollout_id, job.me);
                drop = e == kNotLeader;
                if (e.empty()) {
                    bool refused = false;
                    std::string note;
                    int others = 0;
                    acting = true;
                    e = act(job.r, refused, note, others);
                    acting = false;
                    if (e.empty() || refused) {
                        RestartAck ack;
                        ack.gen = job.r.gen;
                        ack.version = job.r.version;
                        ack.at_ms = wall_ms_();
                        ack.error = refused ? e : "";
                        ack.note = note;
                        ack.others = others;
                        if (refused)
                            spdlog::warn("kubernetes: restart of {} on {} refused: {}", job.r.node, job.r.version, e);
                        if (!note.empty())
                            spdlog::warn("kubernetes: restart of {} on {}: {}", job.r.node, job.r.version, note);
                        job.ack = ack;
                    }
                }
            }
            if (job.ack) {
                // Written under the fence too, so a deposed brain's late acknowledgement never
                // overwrites its successor's. Only the write is tried again, not the act.
                e = ledger_.put_ack(job.r.node, *job.ack, job.me);
                drop = e == kNotLeader;
                done = e.empty();
            }
        } catch (const std::exception & x) {
            // Nothing a request or the API sends may end the brain. What the request or the API
            // sent is refused; a failure of etcd's (the claim, the acknowledgement, which is
            // kept) is tried again.
            e = std::string("kubernetes restarter: ") + x.what();
            if (acting) {
                RestartAck ack;
                ack.gen = job.r.gen;
                ack.version = job.r.version;
                ack.at_ms = wall_ms_();
                ack.error = e;
                job.ack = ack;
            }
            spdlog::error("kubernetes: restart of {}: {}", job.r.node, e);
        }
        lk.lock();
        --busy_;
        const auto it = jobs_.find(job.r.node);
        if (it != jobs_.end() && it->second.r.gen == job.r.gen) {
            // Asked again meanwhile by a new term of leadership: not dropped, tried under it.
            const bool newer_leader = !same_leader(it->second.me, job.me);
            if (done || (drop && !newer_leader)) {
                jobs_.erase(it);
            } else {
                // Worth waiting for: again after 1, 2, 4 … up to 30 s (the first wait from the
                // config), each with up to a fifth more at random so retries do not march together.
                auto & j = it->second;
                j.attempts = job.attempts + 1;
                j.last_error = e;
                j.ack = job.ack;
                int64_t wait = common::backoff_ms(std::max(1, cfg_.retry_ms), std::min(j.attempts - 1, 5), 30000);
                wait += int64_t(jitter() % uint64_t(wait / 5 + 1));
                if (newer_leader) wait = 0;
                j.due = clock::now() + std::chrono::milliseconds(wait);
                spdlog::warn("kubernetes: restart of {} on {}: {} (again in {} ms)", job.r.node, job.r.version, e,
                             wait);
            }
        }
        if (drop) spdlog::warn("kubernetes: restart of {} on {}: {}", job.r.node, job.r.version, e);
        cv_.notify_all();
    }
}

std::string KubeRestarter::act(const RestartRequest & r, bool & refused, std::string & note, int & others) {
    refused = false;
    note.clear();
    others = 0;
    auto refuse = [&](std::string why) {
        refused = true;
        return why;
    };
    std::string set;
    int ordinal = 0;
    if (!split_pod(r.node, set, ordinal))
        return refuse("node " + r.node + " is not named as a StatefulSet's pod (NAME-ORDINAL)");
    if (cfg_.api.rfind("https://", 0) == 0 && !tls_->ctx)
        return refuse("the Kubernetes API's CA (" + cfg_.ca_file + ") cannot be loaded");
    // Bound service-account tokens rotate: the file is read again for each request.
    if (!cfg_.token_file.empty()) {
        std::string t;
        if (read_file(cfg_.token_file, t) && !t.empty()) cfg_.token = std::move(t);
    }
    // The API server is the operator's: any address may be reached, and a redirect is an answer.
    armada::net::HttpOptions o;
    o.timeout_ms = cfg_.timeout_ms;
    o.max_body = 8 << 20;
    o.tls = tls_->ctx.get();
    o.ca_setting = "the CA file " + cfg_.ca_file;
    auto call = [&](const std::string & method, const std::string & path, const std::string & content_type,
                    const std::string & body) {
        armada::net::HeaderList h{{"Accept", "application/json"}};
        if (!cfg_.token.empty()) h.emplace_back("Authorization", "Bearer " + cfg_.token);
        if (!content_type.empty()) h.emplace_back("Content-Type", content_type);
        return armada::net::http_call({method, cfg_.api + path, h, body}, o);
    };
    auto failed = [&](const std::string & what, const armada::net::HttpReply & rep) {
        if (!rep.error.empty()) return what + ": " + rep.error;
        std::string msg;
        const auto j = json::parse(rep.body, nullptr, false);
        msg = common::string_field(j, "message").value_or("");
        return what + ": HTTP " + std::to_string(rep.status) + (msg.empty() ? "" : " (" + msg + ")");
    };
    // A 4xx other than a conflict or a throttle will not change by asking again (a forbidden
    // verb, an invalid patch): the request is refused and the rollout halts saying so.
    auto settled = [&](std::string why, const armada::net::HttpReply & rep) {
        // (A 401 may be a token rotated between reading it and using it: it is read again.)
        if (rep.error.empty() && rep.status >= 400 && rep.status < 500 && rep.status != 401 && rep.status != 409 &&
            rep.status != 429)
            return refuse(std::move(why));
        return why;
    };
    const std::string ns_path = "/namespaces/" + cfg_.ns;
    const std::string sts_path = "/apis/apps/v1" + ns_path + "/statefulsets/" + set;

    auto got = call("GET", sts_path, "", "");
    if (got.status == 404) return refuse("there is no StatefulSet " + set + " in namespace " + cfg_.ns);
    if (got.status == 403)
        return refuse(failed("reading StatefulSet " + set +
                                 " (the global brain's service account needs get and "
                                 "patch on statefulsets, get on controllerrevisions and pods, delete on pods)",
                             got));
    if (got.status != 200) return failed("reading StatefulSet " + set, got);
    const auto sts = json::parse(got.body, nullptr, false);
    const json * spec_at = common::object_at(sts, {"spec"});
    if (!spec_at) return "reading StatefulSet " + set + ": not a StatefulSet";
    const json & spec = *spec_at;
    int replicas = 1, partition = 0;
    int64_t generation = 0, observed = 0;
    std::string strategy = "RollingUpdate", tmpl_version, current, update;
    try {
        if (const json * md = common::object_at(sts, {"metadata"})) generation = md->value("generation", int64_t(0));
        replicas = spec.value("replicas", 1);
        if (const json * us = common::object_at(spec, {"updateStrategy"})) {
            strategy = us->value("type", "RollingUpdate");
            if (const json * ru = common::object_at(*us, {"rollingUpdate"})) partition = ru->value("partition", 0);
        }
        if (const json * t = common::object_at(spec, {"template"})) tmpl_version = version_of(*t, cfg_.container);
        if (const json * st = common::object_at(sts, {"status"})) {
            current = st->value("currentRevision", "");
            update = st->value("updateRevision", "");
            observed = st->value("observedGeneration", int64_t(0));
        }
    } catch (const json::exception & e) {
        return "reading StatefulSet " + set + ": " + e.what();
    }
    if (strategy != "RollingUpdate")
        return refuse("StatefulSet " + set + " uses updateStrategy " + strategy + "; rollouts need RollingUpdate");
    // The status (revisions) is the controller's: until it has seen the last change, it is old.
    if (generation > 0 && observed < generation)
        return "StatefulSet " + set + ": its controller has not seen generation " + std::to_string(generation) +
               " yet (it is at " + std::to_string(observed) + ")";
    if (ordinal >= replicas)
        return refuse("StatefulSet " + set + " has " + std::to_string(replicas) + " replicas; " + r.node +
                      " is not one of them");
    auto set_partition = [&](int p) -> std::string {
        const json patch = {
            {"spec", {{"updateStrategy", {{"type", "RollingUpdate"}, {"rollingUpdate", {{"partition", p}}}}}}}};
        auto rep = call("PATCH", sts_path, "application/strategic-merge-patch+json", patch.dump());
        if (rep.status != 200)
            return settled(failed("setting the partition of " + set + " to " + std::to_string(p), rep), rep);
        spdlog::info("kubernetes: StatefulSet {}: partition {} -> {}", set, partition, p);
        return {};
    };
    // Pods below the partition stay where they are; lowering it by more than one would restart
    // pods nobody asked for.
    auto only_this_one = [&](int from) -> std::string {
        if (ordinal == from - 1) return {};
        return refuse("StatefulSet " + set + " replaces pods from the highest ordinal down, so " + set + "-" +
                      std::to_string(from - 1) + " goes before " + r.node + " (is it down?)");
    };

    if (!tmpl_version.empty() && tmpl_version == r.version) {
        // The template is at the version already: the pod joins the updated range.
        if (ordinal >= partition) {
            // It is in it: the controller replaces it, or did. A way back asked again after
            // the template went back (the answer was lost): the pods above it go back too.
            if (r.back && !current.empty() && current != update && ordinal < replicas - 1) {
                others = replicas - 1 - ordinal;
                note = "a StatefulSet cannot take one pod back alone: " + r.node + " and the " +
                       std::to_string(others) + " pod(s) above it go back to " + r.version;
            }
            return {};
        }
        if (auto e = only_this_one(partition); !e.empty()) return e;
        return set_partition(ordinal);
    }
    std::string current_version = tmpl_version;
    if (!current.empty() && current != update) {
        auto rev = call("GET", "/apis/apps/v1" + ns_path + "/controllerrevisions/" + current, "", "");
        if (rev.status != 200) return settled(failed("reading revision " + current + " of " + set, rev), rev);
        const auto j = json::parse(rev.body, nullptr, false);
        current_version.clear();
        if (const auto * t = common::object_at(j, {"data", "spec", "template"}))
            current_version = version_of(*t, cfg_.container);
        if (current_version.empty() && r.back && r.version != tmpl_version) {
            // A revision from before versions were written down: a way back can only go there.
            spdlog::warn("kubernetes: revision {} of {} names no version; {} goes back to it as {}", current, set,
                         r.node, r.version);
            current_version = r.version;
        }
    }
    if (!current.empty() && current != update && !current_version.empty() && current_version == r.version) {
        // Back to the current revision: out of the updated range, and made again.
        if (partition <= ordinal) {
            if (auto e = set_partition(ordinal + 1); !e.empty()) return e;
        }
        auto pod = call("GET", "/api/v1" + ns_path + "/pods/" + r.node, "", "");
        if (pod.status == 404) return {};  // being made again already
        if (pod.status != 200) return settled(failed("reading pod " + r.node, pod), pod);
        const auto pj = json::parse(pod.body, nullptr, false);
        std::string hash;
        if (const auto * l = common::object_at(pj, {"metadata", "labels"}))
            hash = common::string_field(*l, "controller-revision-hash").value_or("");
        if (hash == current) return {};
        auto del = call("DELETE", "/api/v1" + ns_path + "/pods/" + r.node, "", "");
        if (del.status != 200 && del.status != 202 && del.status != 404)
            return settled(failed("deleting pod " + r.node, del), del);
        spdlog::info("kubernetes: pod {} deleted; it comes back at revision {} ({})", r.node, current, r.version);
        return {};
    }
    // A version the set does not have yet: a new template, from the highest ordinal down.
    if (!current.empty() && current != update && partition < replicas)
        return refuse("StatefulSet " + set + " is still part way to " +
                      (tmpl_version.empty() ? std::string("another template") : tmpl_version) + " (partition " +
                      std::to_string(partition) + " of " + std::to_string(replicas) +
                      " replicas); finish or roll back that first");
    if (r.back && ordinal != replicas - 1 && !current.empty() && current == update) {
        // A way back once every pod runs the template's version: the set's current revision is
        // that one, and a StatefulSet cannot take one pod back without those above it. They go
        // back too, from the highest ordinal down, each drained by its preStop hook.
        note = "every pod of " + set + " ran " +
               (tmpl_version.empty() ? std::string("the new version") : tmpl_version) +
               ", and a StatefulSet cannot take one pod back alone: " + r.node + " and the " +
               std::to_string(replicas - 1 - ordinal) + " pod(s) above it go back to " + r.version;
        others = replicas - 1 - ordinal;
    } else if (auto e = only_this_one(replicas); !e.empty()) {
        return e;
    }
    json container = {{"name", cfg_.container},
                      {"env", json::array({{{"name", "ARMADA_VERSION_LABEL"}, {"value", r.version}}})}};
    if (!cfg_.image.empty()) {
        std::string image = cfg_.image;
        if (const auto at = image.find("{version}"); at != std::string::npos) image.replace(at, 9, r.version);
        container["image"] = image;
    }
    const json patch = {{"spec",
                         {{"updateStrategy", {{"type", "RollingUpdate"}, {"rollingUpdate", {{"partition", ordinal}}}}},
                          {"template",
                           {{"metadata", {{"annotations", {{kVersionAnnotation, r.version}}}}},
                            {"spec", {{"containers", json::array({container})}}}}}}}};
    auto rep = call("PATCH", sts_path, "application/strategic-merge-patch+json", patch.dump());
    if (rep.status != 200) return settled(failed("setting the template of " + set + " to " + r.version, rep), rep);
    spdlog::info("kubernetes: StatefulSet {}: template at {}, partition {} -> {}", set, r.version, partition, ordinal);
    return {};
}

}  // namespace armada::cluster
