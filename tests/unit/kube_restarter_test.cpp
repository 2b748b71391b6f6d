// The Kubernetes restarter against a stand-in API server (there is no Kubernetes here): it keeps
// one StatefulSet's partition, template, revisions and pods, and acts as the StatefulSet
// controller does on them (pods at or above the partition are at the update revision; a deleted
// pod comes back at the revision its ordinal calls for).
#include "cluster/kube_restarter.h"
#include "api/http_server.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using armada::cluster::EtcdLeader;
using armada::cluster::KubeConfig;
using armada::cluster::KubeRestarter;
using armada::cluster::RestartAck;
using armada::cluster::RestartLedger;
using armada::cluster::RestartRequest;
using json = nlohmann::json;

class MemoryLedger : public RestartLedger {
  public:
    // Like etcd's fence: only the leader of revision `leader_rev` may write.
    std::string claim(const RestartRequest & r, const std::string &, const EtcdLeader & me) override {
        std::lock_guard lk(mu);
        if (me.rev != leader_rev) return armada::cluster::kNotLeader;
        requests.push_back(r);
        return {};
    }
    std::string put_ack(const std::string & node, const RestartAck & a, const EtcdLeader & me) override {
        std::lock_guard lk(mu);
        if (me.rev != leader_rev) return armada::cluster::kNotLeader;
        if (fail_acks > 0) {
            --fail_acks;
            return "etcd: unavailable";
        }
        acked[node] = a;
        return {};
    }
    std::map<std::string, RestartAck> acks() override {
        std::lock_guard lk(mu);
        return acked;
    }
    std::mutex mu;
    int64_t leader_rev = 1;
    int fail_acks = 0;  // the next acknowledgements fail to be written
    std::vector<RestartRequest> requests;
    std::map<std::string, RestartAck> acked;
};

//! One StatefulSet, `armada-node`, in namespace `armada`, with `replicas` pods at version v1.
struct FakeKube {
    std::mutex mu;
    int replicas = 3, partition = 0;
    std::string version = "v1", current = "rev-v1", update = "rev-v1";
    std::map<std::string, std::string> revisions{{"rev-v1", "v1"}};
    std::map<int, std::string> pods;  // ordinal -> revision
    std::vector<std::string> calls;   // "METHOD path"
    std::vector<json> patches;
    std::string auth;
    bool instant = true;            // the controller replaces pods at once (else they stay as they were)
    int fail_gets = 0;              // the next GETs of the StatefulSet answer 500
    int forbid_patches = 0;         // the next PATCHes answer 403
    int stale_gets = 0;             // the next GETs show a status the controller has not brought up to date
    std::atomic<bool> hold{false};  // answers wait while set (an API server that hangs)
    int64_t generation = 1;
    std::unique_ptr<armada::api::HttpServer> http;

    FakeKube() {
        for (int i = 0; i < replicas; ++i)
            pods[i] = current;
        armada::api::HttpConfig c;
        c.port = 0;
        c.threads = 1;
        http = std::make_unique<armada::api::HttpServer>(
            c, [this](armada::api::HttpRequest && r, std::shared_ptr<armada::api::Responder> out) {
                while (hold)
                    std::this_thread::sleep_for(std::chrono::milliseconds(5));
                std::lock_guard lk(mu);
                handle(r, *out);
            });
        EXPECT_EQ(http->listen(), "");
        http->run();
    }
    ~FakeKube() { http->stop(); }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(http->port()); }

    // The controller: pods at or above the partition go to the update revision.
    void reconcile() {
        for (auto & [i, rev] : pods)
            if (i >= partition) rev = update;
        bool all = true;
        for (const auto & [i, rev] : pods)
            all = all && rev == update;
        if (all) current = update;
    }

    void handle(const armada::api::HttpRequest & r, armada::api::Responder & out) {
        calls.push_back(r.method + " " + r.path);
        auth = r.header("authorization");
        const std::string sts = "/apis/apps/v1/namespaces/armada/statefulsets/armada-node";
        const std::string pod = "/api/v1/namespaces/armada/pods/armada-node-";
        if (r.path == sts && r.method == "GET") {
            if (fail_gets > 0) {
                --fail_gets;
                return out.send(500, "application/json", R"({"kind":"Status","message":"etcdserver: leader changed"})");
            }
            const bool stale = stale_gets > 0;
            if (stale) --stale_gets;
            const json j = {
                {"metadata", {{"generation", generation}}},
                {"spec",
                 {{"replicas", replicas},
                  {"updateStrategy", {{"type", "RollingUpdate"}, {"rollingUpdate", {{"partition", partition}}}}},
                  {"template", template_of(version)}}},
                {"status",
                 {{"currentRevision", current},
                  {"updateRevision", update},
                  {"observedGeneration", stale ? generation - 1 : generation}}}};
            return out.send(200, "application/json", j.dump());
        }
        if (r.path == sts && r.method == "PATCH" && forbid_patches > 0) {
            --forbid_patches;
            return out.send(403, "application/json", R"({"kind":"Status","message":"patch is forbidden"})");
        }
        if (r.path == sts && r.method == "PATCH") {
            EXPECT_EQ(r.header("content-type"), "application/strategic-merge-patch+json");
            const json p = json::parse(r.body);
            patches.push_back(p);
            const json & s = p["spec"];
            if (s.contains("template")) {
                version = s["template"]["metadata"]["annotations"]["armada.dev/version"];
                update = "rev-" + version;
                revisions[update] = version;
            }
            partition = s["updateStrategy"]["rollingUpdate"]["partition"];
            ++generation;
            if (instant) reconcile();
            return out.send(200, "application/json", "{}");
        }
        if (r.path.rfind("/apis/apps/v1/namespaces/armada/controllerrevisions/", 0) == 0 && r.method == "GET") {
            const std::string name = r.path.substr(r.path.rfind('/') + 1);
            const json j = {{"data", {{"spec", {{"template", template_of(revisions[name])}}}}}};
            return out.send(200, "application/json", j.dump());
        }
        if (r.path.rfind(pod, 0) == 0) {
            const int i = std::stoi(r.path.substr(pod.size()));
            if (r.method == "GET")
                return out.send(200, "application/json",
                                json{{"metadata", {{"labels", {{"controller-revision-hash", pods[i]}}}}}}.dump());
            if (r.method == "DELETE") {
                pods[i] = i >= partition ? update : current;
                return out.send(200, "application/json", "{}");
            }
        }
        out.send(404, "application/json", R"({"kind":"Status","message":"not found"})");
    }
    // A pod template at `v`: with the annotation, or (`by_env`) only the container's version
    // label, or with no version at all ("").
    bool by_env = false;
    json template_of(const std::string & v) const {
        if (v.empty()) return {{"spec", {{"containers", json::array({{{"name", "armada"}}})}}}};
        if (by_env)
            return {{"spec",
                     {{"containers",
                       json::array({{{"name", "armada"},
                                     {"env", json::array({{{"name", "ARMADA_VERSION_LABEL"}, {"value", v}}})}}})}}}};
        return {{"metadata", {{"annotations", {{"armada.dev/version", v}}}}}};
    }
    std::map<int, std::string> versions() {
        std::lock_guard lk(mu);
        std::map<int, std::string> v;
        for (const auto & [i, rev] : pods)
            v[i] = revisions[rev];
        return v;
    }
    void set(const std::function<void(FakeKube &)> & f) {
        std::lock_guard lk(mu);
        f(*this);
    }
    size_t patches_sent() {
        std::lock_guard lk(mu);
        return patches.size();
    }
};

struct Rig {
    FakeKube kube;
    MemoryLedger ledger;
    std::unique_ptr<KubeRestarter> k;
    EtcdLeader me{"global", "global/1", "b1", 1, 1};
    Rig() {
        KubeConfig c;
        c.api = kube.url();
        c.token = "sa-token";
        c.ns = "armada";
        c.image = "registry.example/armada:{version}";
        c.retry_ms = 20;
        k = std::make_unique<KubeRestarter>(c, ledger, [] { return int64_t(1000); });
    }
    //! Asks, and waits until the restarter's API thread has done it.
    std::string restart(int ordinal, const std::string & version, int64_t gen, bool back = false) {
        auto e = k->restart({"cell0", "armada-node-" + std::to_string(ordinal), version, gen, back}, "r1", me);
        EXPECT_TRUE(k->wait_idle(10000));
        return e;
    }
    RestartAck ack(const std::string & node) {
        std::lock_guard lk(ledger.mu);
        return ledger.acked.at(node);
    }
    RestartAck ack(int ordinal) { return ack("armada-node-" + std::to_string(ordinal)); }
    std::string ack_error(int ordinal) { return ack(ordinal).error; }
    bool acked(int ordinal) {
        std::lock_guard lk(ledger.mu);
        return ledger.acked.count("armada-node-" + std::to_string(ordinal)) > 0;
    }
    //! Another term of leadership (another brain's, or this one's again) begins at `rev`.
    void lead_at(int64_t rev) {
        std::lock_guard lk(ledger.mu);
        ledger.leader_rev = rev;
    }
    size_t count(const std::string & call) {
        std::lock_guard lk(kube.mu);
        return size_t(std::count(kube.calls.begin(), kube.calls.end(), call));
    }
};

TEST(KubeRestarter, UpgradesPodsFromTheHighestOrdinalDownByLoweringThePartition) {
    Rig rig;
    EXPECT_TRUE(rig.k->highest_ordinal_first());
    ASSERT_EQ(rig.restart(2, "v2", 1), "");
    EXPECT_EQ(rig.ack_error(2), "");
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v1"}, {2, "v2"}}));
    {
        // One patch: the template (version label, annotation and image) and the partition.
        std::lock_guard lk(rig.kube.mu);
        EXPECT_EQ(rig.kube.auth, "Bearer sa-token");
        const json & c = rig.kube.patches.at(0)["spec"]["template"]["spec"]["containers"][0];
        EXPECT_EQ(c["name"], "armada");
        EXPECT_EQ(c["image"], "registry.example/armada:v2");
        EXPECT_EQ(c["env"][0], (json{{"name", "ARMADA_VERSION_LABEL"}, {"value", "v2"}}));
        EXPECT_EQ(rig.kube.partition, 2);
    }
    ASSERT_EQ(rig.restart(1, "v2", 2), "");
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v2"}, {2, "v2"}}));
    // The same gen asked again (a new leader, or the next turn) changes nothing.
    const size_t patches = rig.kube.patches_sent();
    ASSERT_EQ(rig.restart(1, "v2", 2), "");
    EXPECT_EQ(rig.kube.patches_sent(), patches);
    ASSERT_EQ(rig.restart(0, "v2", 3), "");
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v2"}, {1, "v2"}, {2, "v2"}}));
    {
        std::lock_guard lk(rig.kube.mu);
        EXPECT_EQ(rig.kube.partition, 0);
        EXPECT_EQ(rig.kube.current, "rev-v2");
    }
    // Every pod runs v2, so the set's current revision is v2's. A request to take the lowest
    // pod to v1 that is no rollback would restart the others: refused.
    ASSERT_EQ(rig.restart(0, "v1", 4), "");
    EXPECT_NE(rig.ack_error(0).find("armada-node-2 goes before armada-node-0"), std::string::npos) << rig.ack_error(0);
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v2"}, {1, "v2"}, {2, "v2"}}));
    // The last wave's rollback: one pod cannot go back alone, so it and those above it go back,
    // and the acknowledgement says so. (The controller takes its time here.)
    rig.kube.set([](FakeKube & k) { k.instant = false; });
    ASSERT_EQ(rig.restart(0, "v1", 5, true), "");
    EXPECT_EQ(rig.ack_error(0), "");
    EXPECT_NE(rig.ack(0).note.find("a StatefulSet cannot take one pod back alone: armada-node-0 and the 2 pod(s) "
                                   "above it go back to v1"),
              std::string::npos)
        << rig.ack(0).note;
    EXPECT_EQ(rig.ack(0).others, 2);
    {
        std::lock_guard lk(rig.kube.mu);
        EXPECT_EQ(rig.kube.patches.back()["spec"]["template"]["spec"]["containers"][0]["image"],
                  "registry.example/armada:v1");
    }
    // Asked again (a new leader did not see the acknowledgement): nothing more is patched, and
    // the pods going back with it are still counted.
    const size_t patched = rig.kube.patches_sent();
    ASSERT_EQ(rig.restart(0, "v1", 6, true), "");
    EXPECT_EQ(rig.kube.patches_sent(), patched);
    EXPECT_EQ(rig.ack(0).others, 2);
    EXPECT_NE(rig.ack(0).note.find("armada-node-0 and the 2 pod(s) above it go back to v1"), std::string::npos);
    rig.kube.set([](FakeKube & k) { k.reconcile(); });
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v1"}, {2, "v1"}}));
}

TEST(KubeRestarter, AnAcknowledgementThatCannotBeWrittenIsWrittenAgainWithoutActingAgain) {
    Rig rig;
    {
        std::lock_guard lk(rig.ledger.mu);
        rig.ledger.fail_acks = 2;
    }
    ASSERT_EQ(rig.restart(2, "v2", 1), "");
    ASSERT_TRUE(rig.acked(2));
    EXPECT_EQ(rig.ack_error(2), "");
    EXPECT_EQ(rig.kube.patches_sent(), 1u);
    EXPECT_EQ(rig.count("GET /apis/apps/v1/namespaces/armada/statefulsets/armada-node"), 1u);
}

TEST(KubeRestarter, APodOutOfOrderIsRefusedWithoutTouchingTheSet) {
    Rig rig;
    // armada-node-2 must go first: lowering the partition to 0 would restart all three.
    ASSERT_EQ(rig.restart(0, "v2", 1), "");
    EXPECT_NE(rig.ack_error(0).find("armada-node-2 goes before armada-node-0"), std::string::npos) << rig.ack_error(0);
    EXPECT_EQ(rig.kube.patches_sent(), 0u);
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v1"}, {2, "v1"}}));
    // So is skipping one once the update is under way.
    ASSERT_EQ(rig.restart(2, "v2", 2), "");
    ASSERT_EQ(rig.restart(0, "v2", 3), "");
    EXPECT_NE(rig.ack_error(0).find("armada-node-1 goes before"), std::string::npos) << rig.ack_error(0);
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v1"}, {2, "v2"}}));
}

TEST(KubeRestarter, RollsAPodBackToTheCurrentRevisionByRaisingThePartitionAndDeletingIt) {
    Rig rig;
    ASSERT_EQ(rig.restart(2, "v2", 1), "");
    ASSERT_EQ(rig.restart(1, "v2", 2), "");
    // The wave of armada-node-1 halted: it goes back to v1, armada-node-2 (an earlier wave) stays.
    ASSERT_EQ(rig.restart(1, "v1", 3, true), "");
    EXPECT_EQ(rig.ack_error(1), "");
    EXPECT_EQ(rig.ack(1).note, "");
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v1"}, {2, "v2"}}));
    std::lock_guard lk(rig.kube.mu);
    EXPECT_EQ(rig.kube.partition, 2);
    EXPECT_EQ(rig.kube.calls.back(), "DELETE /api/v1/namespaces/armada/pods/armada-node-1");
}

TEST(KubeRestarter, AnAnswerWorthWaitingForIsTriedAgainAndOneThatNeverWillHaltsTheRollout) {
    Rig rig;
    // The API server's 500, twice: the restarter tries again on its own, and claims the
    // request again under the leader's fence each time.
    rig.kube.set([](FakeKube & k) { k.fail_gets = 2; });
    ASSERT_EQ(rig.restart(2, "v2", 1), "");
    EXPECT_EQ(rig.ack_error(2), "");
    EXPECT_EQ(rig.count("GET /apis/apps/v1/namespaces/armada/statefulsets/armada-node"), 3u);
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v1"}, {2, "v2"}}));
    {
        std::lock_guard lk(rig.ledger.mu);
        EXPECT_EQ(rig.ledger.requests.size(), 3u);
    }
    // A node that is no StatefulSet's pod, or a set that does not exist: refused, with why.
    ASSERT_EQ(rig.k->restart({"cell0", "node7", "v2", 2}, "r1", rig.me), "");
    ASSERT_EQ(rig.k->restart({"cell0", "other-set-0", "v2", 3}, "r1", rig.me), "");
    ASSERT_TRUE(rig.k->wait_idle(10000));
    EXPECT_NE(rig.ack("node7").error.find("not named as a StatefulSet's pod"), std::string::npos);
    EXPECT_EQ(rig.ack("other-set-0").error, "there is no StatefulSet other-set in namespace armada");
}

TEST(KubeRestarter, AStatusTheControllerHasNotCaughtUpWithIsReadAgain) {
    Rig rig;
    // The set's status is from before its last change: its revisions cannot be trusted yet.
    rig.kube.set([](FakeKube & k) { k.stale_gets = 2; });
    ASSERT_EQ(rig.restart(2, "v2", 1), "");
    EXPECT_EQ(rig.ack_error(2), "");
    EXPECT_EQ(rig.count("GET /apis/apps/v1/namespaces/armada/statefulsets/armada-node"), 3u);
    EXPECT_EQ(rig.kube.patches_sent(), 1u);
}

TEST(KubeRestarter, ItsAPICallsNeverHoldTheCallerAndADeposedBrainsRetriesAreDropped) {
    Rig rig;
    rig.kube.hold = true;  // the API server hangs
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(rig.k->restart({"cell0", "armada-node-2", "v2", 1}, "r1", rig.me), "");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_FALSE(rig.k->wait_idle(300));
    EXPECT_FALSE(rig.acked(2));
    rig.kube.hold = false;
    ASSERT_TRUE(rig.k->wait_idle(10000));
    EXPECT_EQ(rig.ack_error(2), "");

    // A request that keeps failing is tried until its brain no longer leads, then dropped.
    rig.kube.set([](FakeKube & k) { k.fail_gets = 1000; });
    ASSERT_EQ(rig.k->restart({"cell0", "armada-node-1", "v2", 2}, "r1", rig.me), "");
    EXPECT_FALSE(rig.k->wait_idle(300));
    const auto retrying = rig.k->retrying();
    ASSERT_EQ(retrying.count("armada-node-1"), 1u);
    EXPECT_NE(retrying.at("armada-node-1").find("HTTP 500"), std::string::npos) << retrying.at("armada-node-1");
    rig.lead_at(2);  // another brain leads now
    ASSERT_TRUE(rig.k->wait_idle(10000));
    EXPECT_FALSE(rig.acked(1));
    EXPECT_EQ(rig.kube.patches_sent(), 1u);
}

TEST(KubeRestarter, ARequestAskedAgainByANewTermGoesOnUnderItAndOneNoLongerWantedIsDropped) {
    Rig rig;
    rig.kube.set([](FakeKube & k) { k.fail_gets = 1000; });
    ASSERT_EQ(rig.k->restart({"cell0", "armada-node-2", "v2", 1}, "r1", rig.me), "");
    EXPECT_FALSE(rig.k->wait_idle(200));
    // This process leads again under a new revision; the old term is over.
    rig.lead_at(2);
    EtcdLeader again = rig.me;
    again.rev = 2;
    ASSERT_EQ(rig.k->restart({"cell0", "armada-node-2", "v2", 1}, "r1", again), "");
    rig.kube.set([](FakeKube & k) { k.fail_gets = 0; });
    ASSERT_TRUE(rig.k->wait_idle(10000));
    ASSERT_TRUE(rig.acked(2));
    EXPECT_EQ(rig.ack_error(2), "");
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, "v1"}, {1, "v1"}, {2, "v2"}}));

    // A request the rollout stops asking for (it was aborted) is dropped before it acts.
    rig.kube.set([](FakeKube & k) { k.fail_gets = 1000; });
    ASSERT_EQ(rig.k->restart({"cell0", "armada-node-1", "v2", 2}, "r1", again), "");
    EXPECT_FALSE(rig.k->wait_idle(200));
    rig.k->forget_except({});
    ASSERT_TRUE(rig.k->wait_idle(10000));
    EXPECT_FALSE(rig.acked(1));
    EXPECT_EQ(rig.kube.patches_sent(), 1u);
}

TEST(KubeRestarter, AForbiddenPatchIsRefusedAtOnce) {
    Rig rig;
    rig.kube.set([](FakeKube & k) { k.forbid_patches = 1; });
    ASSERT_EQ(rig.restart(2, "v2", 1), "");
    EXPECT_EQ(rig.ack_error(2), "setting the template of armada-node to v2: HTTP 403 (patch is forbidden)");
    EXPECT_EQ(rig.count("PATCH /apis/apps/v1/namespaces/armada/statefulsets/armada-node"), 1u);
}

TEST(KubeRestarter, ASetWhoseOldRevisionNamesNoVersionCanStillGoBack) {
    Rig rig;
    // Pods from a template with no version written down; the version is the container's label.
    {
        std::lock_guard lk(rig.kube.mu);
        rig.kube.revisions["rev-v1"] = "";
        rig.kube.version = "";
        rig.kube.by_env = true;
    }
    ASSERT_EQ(rig.restart(2, "v2", 1), "");
    EXPECT_EQ(rig.ack_error(2), "");
    // Asked again with the label only in the template's env: it is there already.
    const size_t patches = rig.kube.patches_sent();
    ASSERT_EQ(rig.restart(2, "v2", 2), "");
    EXPECT_EQ(rig.ack_error(2), "");
    EXPECT_EQ(rig.kube.patches_sent(), patches);
    // Not a rollback: another version the set does not have is refused.
    ASSERT_EQ(rig.restart(2, "0.9.0", 3), "");
    EXPECT_NE(rig.ack_error(2).find("still part way"), std::string::npos) << rig.ack_error(2);
    // The rollback goes to the only revision it can: the current one.
    ASSERT_EQ(rig.restart(2, "0.9.0", 4, true), "");
    EXPECT_EQ(rig.ack_error(2), "");
    EXPECT_EQ(rig.kube.versions(), (std::map<int, std::string>{{0, ""}, {1, ""}, {2, ""}}));
    EXPECT_EQ(rig.count("DELETE /api/v1/namespaces/armada/pods/armada-node-2"), 1u);
}

}  // namespace
