// The supervisor over fake processes, an in-memory etcd and a clock the test moves. The same
// code runs in `armada cluster up`.

#include "cluster/runtime/supervisor.h"
#include "unit/live_kv.h"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>

using namespace armada::cluster;

namespace {

class FakeProcess final : public ProcessHandle {
  public:
    explicit FakeProcess(int pid) : pid_(pid) {}
    int pid() const override { return pid_; }
    bool running() override { return alive; }
    int exit_code() const override { return code; }
    void signal(int sig) override {
        signals.push_back(sig);
        if (sig == SIGTERM && exits_on_term) {
            alive = false;
            code = 0;
        }
    }
    void stop(int, int) override { alive = false; }
    bool alive = true, exits_on_term = true;
    int code = 0;
    std::vector<int> signals;

  private:
    int pid_;
};

class FakeLauncher final : public Launcher {
  public:
    std::unique_ptr<ProcessHandle> spawn(const SupervisedProc & p, std::string &) override {
        auto h = std::make_unique<FakeProcess>(++next_pid);
        last[p.name] = h.get();
        started.push_back(p.name + "@" + p.version);
        return h;
    }
    int next_pid = 100;
    std::map<std::string, FakeProcess *> last;
    std::vector<std::string> started;
};

}  // namespace

TEST(Supervisor, ACrashedProcessComesBackAfterABackOffThatDoublesAndOneThatExitedZeroStaysDown) {
    FakeLauncher l;
    ManualClock clock;
    Supervisor sup({10}, l, clock);
    sup.add({"node", "n1", "", "", {"armada"}, ""});
    sup.add({"cell", "b1", "", "", {"armada"}, ""});
    ASSERT_TRUE(sup.start_all());
    EXPECT_EQ(sup.backoff_ms(0), 20000) << "twice the lease TTL: its cell has moved its sessions by then";
    l.last["n1"]->alive = false;
    l.last["n1"]->code = 137;  // kill -9
    l.last["b1"]->alive = false;
    l.last["b1"]->code = 0;
    EXPECT_FALSE(sup.turn());
    clock.advance(19999);
    EXPECT_FALSE(sup.turn()) << "not before its back-off";
    clock.advance(1);
    EXPECT_TRUE(sup.turn());
    EXPECT_EQ(l.started, (std::vector<std::string>{"n1@", "b1@", "n1@"}));
    // The second crash waits twice as long.
    l.last["n1"]->alive = false;
    l.last["n1"]->code = 1;
    sup.turn();
    clock.advance(39999);
    EXPECT_FALSE(sup.turn());
    clock.advance(1);
    EXPECT_TRUE(sup.turn());
    EXPECT_EQ(l.started.size(), 4u);
    clock.advance(600000);
    sup.turn();
    EXPECT_EQ(l.started.size(), 4u) << "b1 exited 0: it stays down";
}

TEST(Supervisor, AServerThatDiesIsBroughtBackAtOnce) {
    FakeLauncher l;
    ManualClock clock;
    Supervisor sup({10}, l, clock);
    bool up = true;
    int restarts = 0;
    sup.add_server(
        "etcd", [&] { return up; },
        [&] {
            ++restarts;
            up = true;
            return std::string();
        });
    sup.turn();
    EXPECT_EQ(restarts, 0);
    up = false;
    EXPECT_TRUE(sup.turn());
    EXPECT_EQ(restarts, 1);
}

TEST(Supervisor, CarriesOutARolloutsRestartAndAcknowledgesItInEtcd) {
    FakeLauncher l;
    ManualClock clock;
    MemoryKv kv;
    const ClusterKeys keys("/armada");
    // A request from before this supervisor started is not carried out.
    RestartRequest old;
    old.node = "n1";
    old.gen = 1;
    old.version = "v0";
    ASSERT_EQ(kv.put(keys.restart_request("n1"), encode_restart_request(old, "r0"), 0), "");
    Supervisor sup({10}, l, clock);
    sup.add({"node", "n1", "", "", {"armada"}, "v1"});
    RestartRequests reqs(kv, "/armada", {"n1"});
    sup.follow_restarts(&reqs);
    ASSERT_TRUE(sup.start_all());
    reqs.poll();
    sup.turn();
    EXPECT_TRUE(l.last["n1"]->signals.empty());
    RestartRequest r = old;
    r.gen = 2;
    r.version = "v2";
    ASSERT_EQ(kv.put(keys.restart_request("n1"), encode_restart_request(r, "r1"), 0), "");
    RestartRequest stranger = r;
    stranger.node = "zz";
    ASSERT_EQ(kv.put(keys.restart_request("zz"), encode_restart_request(stranger, "r1"), 0), "");
    reqs.poll();
    FakeProcess * before = l.last["n1"];
    sup.turn();
    EXPECT_EQ(before->signals, std::vector<int>{SIGTERM}) << "it drains and exits";
    sup.turn();  // its exit seen
    clock.advance(2000);
    EXPECT_TRUE(sup.turn());
    EXPECT_EQ(l.started.back(), "n1@v2");
    reqs.poll();  // the acknowledgement goes out
    std::optional<EtcdKv> ack;
    ASSERT_EQ(kv.get(keys.restart_ack("n1"), ack), "");
    ASSERT_TRUE(ack);
    const auto a = decode_restart_ack(ack->value);
    ASSERT_TRUE(a);
    EXPECT_EQ(a->gen, 2);
    EXPECT_EQ(a->version, "v2");
    EXPECT_EQ(a->pid, l.last["n1"]->pid());
    EXPECT_TRUE(a->error.empty());
    ASSERT_EQ(kv.get(keys.restart_ack("zz"), ack), "");
    ASSERT_TRUE(ack);
    EXPECT_NE(decode_restart_ack(ack->value)->error.find("no node named zz"), std::string::npos);
}

TEST(Supervisor, RestartRequestsAreFollowedByAWatchNotReadAgainAtRest) {
    MemoryKv kv;
    ManualClock clock;
    const ClusterKeys keys("/armada");
    RestartRequests reqs(kv, "/armada", {"n1"}, clock);
    ASSERT_TRUE(reqs.poll());  // the first list
    const int64_t calls = kv.calls();
    for (int i = 0; i < 20; ++i) {
        clock.advance(1000);
        ASSERT_TRUE(reqs.poll());
    }
    EXPECT_EQ(kv.calls(), calls) << "20 s at rest read the store again";
    RestartRequest r;
    r.node = "n1";
    r.gen = 1;
    r.version = "v2";
    ASSERT_EQ(kv.put(keys.restart_request("n1"), encode_restart_request(r, "r1"), 0), "");
    ASSERT_TRUE(reqs.poll());
    ASSERT_EQ(reqs.requests().count("n1"), 1u) << "a request put after the first list is seen through the watch";
    EXPECT_EQ(reqs.requests()["n1"].version, "v2");
    // Once a minute it lists afresh (a watch whose connection died without a word).
    clock.advance(60000);
    const int64_t before = kv.calls();
    ASSERT_TRUE(reqs.poll());
    EXPECT_GT(kv.calls(), before);
}

namespace {
//! A store that refuses every put and counts them (etcd out of space, or the key not allowed).
class RefusedPuts final : public ForwardingKv {
  public:
    using ForwardingKv::ForwardingKv;
    std::atomic<int> puts{0};
    std::string put(const std::string &, const std::string &, int64_t) override {
        ++puts;
        return "etcdserver: mvcc: database space exceeded";
    }
};
}  // namespace

TEST(Supervisor, AnAcknowledgementEtcdRefusesIsSentAgainOnceASecondNotInALoop) {
    MemoryKv kv;
    RefusedPuts refusing(kv);
    ManualClock clock;
    RestartRequests reqs(refusing, "/armada", {"n1"}, clock);
    RestartAck a;
    a.gen = 1;
    a.version = "v2";
    reqs.ack("n1", a);
    for (int i = 0; i < 10; ++i)
        reqs.poll();
    EXPECT_EQ(refusing.puts.load(), 1) << "sent again before a second passed";
    clock.advance(1000);
    reqs.poll();
    EXPECT_EQ(refusing.puts.load(), 2) << "not sent again after a second";
}
