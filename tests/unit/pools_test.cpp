// GPU pools: the routing section of the cluster file, the rules' choice, and the pool state
// (warming, breaker, draining) with a fake probe standing in for the upstreams' HTTP.
#include "cluster/cluster_config.h"
#include "routing/pool_set.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

using namespace armada;

namespace {

const char * kBase = "etcd: [127.0.0.1:2379]\npostgres: [postgres://a@h/db]\n";

std::optional<cluster::ClusterConfig> parse(const std::string & extra, std::string & err) {
    return cluster::parse_cluster_config(std::string(kBase) + extra, err);
}

routing::RouteFacts facts(int64_t prompt, int64_t max_tokens, std::string latency = "standard",
                          std::string model = "") {
    routing::RouteFacts f;
    f.prompt_tokens = prompt;
    f.max_tokens = max_tokens;
    f.latency = std::move(latency);
    f.model = std::move(model);
    return f;
}

//! Waits until `pred` holds (the pool's checker runs on its own thread), up to 5 s.
template <class P>
bool eventually(P pred) {
    for (int i = 0; i < 500; ++i) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
}

}  // namespace

TEST(Pools, WithAGpuPoolAndNoRulesTheSourcesThresholdsApply) {
    std::string err;
    auto c = parse(
        "tokenizer: /m.gguf\npools:\n  - name: gpu\n    upstreams: [{url: http://10.0.0.1:8000/, model: q7}]\n", err);
    ASSERT_TRUE(c) << err;
    ASSERT_EQ(c->routing.pools.size(), 1u);
    EXPECT_EQ(c->routing.pools[0].upstreams[0].url, "http://10.0.0.1:8000");  // the trailing '/' goes
    const auto & r = c->routing.routes;
    EXPECT_EQ(routing::choose_route(r, facts(8192, 500)).target, "cpu");
    EXPECT_EQ(routing::choose_route(r, facts(8193, 10)).target, "gpu");
    EXPECT_EQ(routing::choose_route(r, facts(8193, 10)).rule, "prompt_tokens>8192");
    EXPECT_EQ(routing::choose_route(r, facts(100, 501)).rule, "max_tokens>500");
    // Not known (no max_tokens, a prompt that could not be counted): the thresholds do not fire.
    EXPECT_EQ(routing::choose_route(r, facts(-1, -1)).target, "cpu");
    // An agent step its agent marks as long goes to the pool whatever its size.
    auto marked = facts(100, 10);
    marked.long_step = true;
    EXPECT_EQ(routing::choose_route(r, marked).target, "gpu");
    EXPECT_EQ(routing::choose_route(r, marked).rule, "long_step");
}

TEST(Pools, RulesAreReadInOrderAndEveryConditionOfOneMustHold) {
    std::string err;
    auto c = parse(R"(
pools:
  - {name: gpu, upstreams: [{url: 'http://g:1', model: m}]}
  - {name: long, upstreams: [{url: 'http://l:1', model: m}]}
routes:
  - {name: rt, when: {latency: [realtime, interactive], max_tokens_over: 100}, to: gpu}
  - {when: {model: big}, to: long}
  - {when: {latency: batch}, to: cpu}
  - {when: {}, to: gpu}
)",
                   err);
    ASSERT_TRUE(c) << err;
    const auto & r = c->routing.routes;
    EXPECT_EQ(routing::choose_route(r, facts(-1, 200, "realtime")).rule, "rt");
    // One condition of the first rule fails: the next ones are read.
    EXPECT_EQ(routing::choose_route(r, facts(-1, 50, "realtime")).rule, "always");
    EXPECT_EQ(routing::choose_route(r, facts(-1, 50, "standard", "big")).target, "long");
    EXPECT_EQ(routing::choose_route(r, facts(-1, 50, "standard", "big")).rule, "model=big");
    EXPECT_EQ(routing::choose_route(r, facts(-1, 500, "batch")).target, "cpu");
    EXPECT_EQ(routing::choose_route(r, facts(-1, 5, "standard")).target, "gpu");
}

TEST(Pools, TheFileSaysWhichPoolSettingIsWrong) {
    struct Case {
        const char * yaml;
        const char * says;
    };
    const Case cases[] = {
        {"pools:\n  - {name: cpu, upstreams: [{url: 'http://g:1', model: m}]}\n", "pools[0].name"},
        {"pools:\n  - {name: gpu, upstreams: []}\n", "pools[0].upstreams"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'https://g:1', model: m}]}\n", "pools[0].upstreams[0].url"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://u:secret@g:1', model: m}]}\n", "no credentials"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1'}]}\n", "pools[0].upstreams[0].model"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m, grammar: gbnf}]}\n", ".grammar"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m, max_in_flight: 0}]}\n", "max_in_flight"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m, api_key_env: A, api_key_file: /k}]}\n",
         "not both"},
        {"pools:\n  - {name: gpu, colour: red, upstreams: [{url: 'http://g:1', model: m}]}\n", "'colour'"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m}]}\n", "default rules for pool 'gpu'"},
        {"routes:\n  - {when: {latency: rt}, to: gpu}\n", "routes[0].to"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:8000/v1', model: m}]}\n", "without a path"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m}]}\n"
         "routes:\n  - {when: {latency: []}, to: gpu}\n",
         "routes[0].when.latency"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m}]}\n"
         "routes:\n  - {name: 'a b', when: {latency: x}, to: gpu}\n",
         "routes[0].name"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m}]}\n"
         "routes:\n  - {when: {tokens_over: 5}, to: gpu}\n",
         "unknown condition 'tokens_over'"},
        {"pools:\n  - {name: gpu, upstreams: [{url: 'http://g:1', model: m}]}\n"
         "routes:\n  - {when: {long_step: false}, to: gpu}\n",
         "routes[0].when.long_step"},
    };
    for (const auto & k : cases) {
        std::string err;
        EXPECT_FALSE(parse(k.yaml, err)) << k.yaml;
        EXPECT_NE(err.find(k.says), std::string::npos) << k.yaml << " → " << err;
        EXPECT_EQ(err.find("secret"), std::string::npos) << err;
    }
}

namespace {

//! Upstreams whose /health and warm-up answers the test sets.
struct FakeUpstreams {
    std::atomic<int> health{200};
    std::atomic<int> warm{200};
    std::atomic<int> probes{0};
    std::atomic<int> answered{0};  // probes that have read what to answer
    routing::PoolSet::Probe probe() {
        return [this](const std::string & method, const std::string &, const std::string &, const std::string &, int) {
            ++probes;
            const int status = method == "GET" ? health.load() : warm.load();
            ++answered;
            return status;
        };
    }
};

routing::PoolConfig pool_of(int n, int max_in_flight = 2) {
    routing::PoolConfig p;
    p.name = "gpu";
    p.health_ms = 100;
    p.breaker_errors = 2;
    p.breaker_open_ms = 300;
    for (int i = 0; i < n; ++i) {
        routing::UpstreamConfig u;
        u.url = "http://u" + std::to_string(i) + ":1";
        u.model = "m";
        u.max_in_flight = max_in_flight;
        p.upstreams.push_back(u);
    }
    return p;
}

//! A started pool set over `pool` whose upstreams answer as `f` says, once all are up.
std::unique_ptr<routing::PoolSet> started(const routing::PoolConfig & pool, FakeUpstreams & f) {
    std::string err;
    auto s = routing::PoolSet::open({pool}, err);
    EXPECT_TRUE(s) << err;
    if (!s) return nullptr;
    s->set_probe(f.probe());
    s->start();
    const size_t n = pool.upstreams.size();
    EXPECT_TRUE(eventually([&] { return s->status()["gpu"]["up"] == n; }));
    return s;
}

}  // namespace

TEST(Pools, AnUpstreamTakesNothingUntilItIsHealthyAndWarmed) {
    std::string err;
    auto s = routing::PoolSet::open({pool_of(1)}, err);
    ASSERT_TRUE(s) << err;
    FakeUpstreams f;
    f.warm = 503;  // healthy, but the tiny request fails (the model is still loading)
    s->set_probe(f.probe());
    routing::PoolSet::Unavailable why;
    EXPECT_FALSE(s->acquire("gpu", {}, false, why));
    EXPECT_EQ(why, routing::PoolSet::Unavailable::down);
    s->start();
    ASSERT_TRUE(eventually([&] { return f.probes.load() >= 4; }));
    EXPECT_FALSE(s->acquire("gpu", {}, false, why));
    f.warm = 200;
    ASSERT_TRUE(eventually([&] { return s->acquire("gpu", {}, false, why).has_value(); }));
    s->stop();
}

TEST(Pools, RequestsGoToTheLeastBusyAndAFullPoolSaysSo) {
    FakeUpstreams f;
    auto s = started(pool_of(2, 2), f);
    ASSERT_TRUE(s);
    routing::PoolSet::Unavailable why;
    std::vector<routing::PoolLease> held;
    for (int i = 0; i < 4; ++i) {
        auto l = s->acquire("gpu", {}, false, why);
        ASSERT_TRUE(l) << i;
        held.push_back(*l);
    }
    EXPECT_NE(held[0].url, held[1].url);  // spread, not piled on one
    EXPECT_FALSE(s->acquire("gpu", {}, false, why));
    EXPECT_EQ(why, routing::PoolSet::Unavailable::full);
    // An upstream already tried is left out.
    s->release(held[0], routing::PoolOutcome::ok, 0.01);
    EXPECT_FALSE(s->acquire("gpu", {held[0].url}, false, why));
    EXPECT_TRUE(s->acquire("gpu", {}, false, why));
    s->stop();
}

TEST(Pools, FailuresInARowOpenTheBreakerAndAProbeClosesIt) {
    FakeUpstreams f;
    auto s = started(pool_of(1, 8), f);
    ASSERT_TRUE(s);
    routing::PoolSet::Unavailable why;
    // A success between failures starts the count again.
    auto a = s->acquire("gpu", {}, false, why);
    s->release(*a, routing::PoolOutcome::failed, 0);
    a = s->acquire("gpu", {}, false, why);
    s->release(*a, routing::PoolOutcome::ok, 0.01);
    a = s->acquire("gpu", {}, false, why);
    s->release(*a, routing::PoolOutcome::failed, 0);
    a = s->acquire("gpu", {}, false, why);
    ASSERT_TRUE(a);
    // A client that went away, or a 429, says nothing of the upstream's health.
    s->release(*a, routing::PoolOutcome::cancelled, 0);
    a = s->acquire("gpu", {}, false, why);
    s->release(*a, routing::PoolOutcome::busy, 0);
    EXPECT_EQ(s->breaker_opened("gpu"), 0u);
    a = s->acquire("gpu", {}, false, why);
    s->release(*a, routing::PoolOutcome::failed, 0);
    EXPECT_EQ(s->breaker_opened("gpu"), 1u);
    EXPECT_EQ(s->status()["gpu"]["upstreams"][0]["state"], "open");
    EXPECT_FALSE(s->acquire("gpu", {}, false, why));
    // After breaker_open_ms a probe that passes closes it.
    ASSERT_TRUE(eventually([&] { return s->acquire("gpu", {}, false, why).has_value(); }));
    s->stop();
}

TEST(Pools, AnOpenBreakerWhoseProbeFailsIsProbedAgainAfterItsOpenTimeNotTheHealthPeriod) {
    FakeUpstreams f;
    auto cfg = pool_of(1, 8);
    cfg.health_ms = 60000;  // the breaker, not the health check, notices trouble
    auto s = started(cfg, f);
    ASSERT_TRUE(s);
    routing::PoolSet::Unavailable why;
    f.health = 503;  // killed, then restarting (llama-server says 503 while it loads)
    for (int i = 0; i < 2; ++i) {
        auto a = s->acquire("gpu", {}, false, why);
        ASSERT_TRUE(a);
        s->release(*a, routing::PoolOutcome::failed, 0);
    }
    ASSERT_EQ(s->status()["gpu"]["upstreams"][0]["state"], "open");
    // The probe at the end of the open time fails (it has read 503): still open.
    const int before = f.answered.load();
    ASSERT_TRUE(eventually([&] { return f.answered.load() > before; }));
    EXPECT_EQ(s->status()["gpu"]["upstreams"][0]["state"], "open");
    // Back: the next probe, one open time later, closes it (not a health period later).
    f.health = 200;
    EXPECT_TRUE(eventually([&] { return s->status()["gpu"]["upstreams"][0]["state"] == "up"; }));
    s->stop();
}

TEST(Pools, ARemovedUpstreamDrainsAndANewOneWarmsFirst) {
    FakeUpstreams f;
    auto s = started(pool_of(1, 8), f);
    ASSERT_TRUE(s);
    routing::PoolSet::Unavailable why;
    auto held = s->acquire("gpu", {}, false, why);
    ASSERT_TRUE(held);
    auto next = pool_of(2, 8);
    next.upstreams.erase(next.upstreams.begin());  // u0 leaves, u1 comes
    f.warm = 503;
    ASSERT_EQ(s->reload({next}), "");
    auto st = s->status()["gpu"]["upstreams"];
    ASSERT_EQ(st.size(), 2u);
    EXPECT_EQ(st[1]["url"], "http://u0:1");
    EXPECT_EQ(st[1]["state"], "draining");
    EXPECT_FALSE(s->acquire("gpu", {}, false, why));  // u0 takes nothing new; u1 is not warm
    s->release(*held, routing::PoolOutcome::ok, 0.01);
    f.warm = 200;
    ASSERT_TRUE(eventually([&] { return s->status()["gpu"]["upstreams"].size() == 1; }));
    auto l = s->acquire("gpu", {}, false, why);
    ASSERT_TRUE(eventually([&] {
        if (!l) l = s->acquire("gpu", {}, false, why);
        return l.has_value();
    }));
    EXPECT_EQ(l->url, "http://u1:1");
    s->stop();
}

TEST(Pools, KeysComeFromTheEnvironmentOrAFileAndAMissingOneIsNamed) {
    auto p = pool_of(1);
    p.upstreams[0].api_key_env = "ARMADA_TEST_POOL_KEY";
    unsetenv("ARMADA_TEST_POOL_KEY");
    std::string err;
    EXPECT_FALSE(routing::PoolSet::open({p}, err));
    EXPECT_NE(err.find("ARMADA_TEST_POOL_KEY is not set"), std::string::npos) << err;
    setenv("ARMADA_TEST_POOL_KEY", "sk-pool", 1);
    auto s = routing::PoolSet::open({p}, err);
    ASSERT_TRUE(s) << err;
    FakeUpstreams f;
    std::string seen;
    s->set_probe([&](const std::string &, const std::string &, const std::string &, const std::string & key, int) {
        seen = key;
        return 200;
    });
    s->start();
    routing::PoolSet::Unavailable why;
    ASSERT_TRUE(eventually([&] { return s->acquire("gpu", {}, false, why).has_value(); }));
    s->stop();
    EXPECT_EQ(seen, "sk-pool");
    unsetenv("ARMADA_TEST_POOL_KEY");
}

TEST(Pools, AStepThatNeedsALlamaGrammarSkipsJsonSchemaUpstreams) {
    auto p = pool_of(2, 8);
    p.upstreams[0].grammar = routing::GrammarDialect::json_schema;
    std::string err;
    auto s = routing::PoolSet::open({p}, err);
    ASSERT_TRUE(s) << err;
    FakeUpstreams f;
    s->set_probe(f.probe());
    s->start();
    ASSERT_TRUE(eventually([&] { return s->status()["gpu"]["up"] == 2; }));
    routing::PoolSet::Unavailable why;
    for (int i = 0; i < 3; ++i) {
        auto l = s->acquire("gpu", {}, true, why);
        ASSERT_TRUE(l);
        EXPECT_EQ(l->url, "http://u1:1");
    }
    s->stop();
}

TEST(Pools, AWarmedUpstreamIsOnlyHealthCheckedAndGoesDownWhenItFails) {
    std::string err;
    auto p = pool_of(1, 8);
    auto s = routing::PoolSet::open({p}, err);
    ASSERT_TRUE(s) << err;
    std::atomic<int> gets{0}, posts{0}, health{200}, warm{429};  // a busy upstream still warms
    s->set_probe([&](const std::string & method, const std::string &, const std::string &, const std::string &, int) {
        ++(method == "GET" ? gets : posts);
        return method == "GET" ? health.load() : warm.load();
    });
    s->start();
    routing::PoolSet::Unavailable why;
    ASSERT_TRUE(eventually([&] { return s->status()["gpu"]["up"] == 1; }));
    const int warmed = posts.load();
    EXPECT_EQ(warmed, 1);
    ASSERT_TRUE(eventually([&] { return gets.load() >= 4; }));
    EXPECT_EQ(posts.load(), warmed) << "no request sent to a warmed upstream, only /health";
    health = 503;
    ASSERT_TRUE(eventually([&] { return s->status()["gpu"]["upstreams"][0]["state"] == "down"; }));
    EXPECT_FALSE(s->acquire("gpu", {}, false, why));
    // Back: warmed again before it takes traffic.
    health = 200;
    warm = 200;
    ASSERT_TRUE(eventually([&] { return s->acquire("gpu", {}, false, why).has_value(); }));
    EXPECT_GT(posts.load(), warmed);
    s->stop();
}

TEST(Pools, AnOpenBreakerStaysOpenForItsTimeEvenIfACheckWasUnderWay) {
    std::string err;
    auto p = pool_of(1, 8);
    p.breaker_open_ms = 1500;
    p.health_ms = 100;
    auto s = routing::PoolSet::open({p}, err);
    ASSERT_TRUE(s) << err;
    std::atomic<bool> slow{false};
    std::atomic<int> checks{0};
    s->set_probe([&](const std::string &, const std::string &, const std::string &, const std::string &, int) {
        ++checks;
        if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return 200;
    });
    s->start();
    routing::PoolSet::Unavailable why;
    ASSERT_TRUE(eventually([&] { return s->status()["gpu"]["up"] == 1; }));
    slow = true;  // health checks now take 300 ms: one is under way when the breaker opens
    const int before = checks.load();
    ASSERT_TRUE(eventually([&] { return checks.load() > before; }));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2; ++i) {
        auto a = s->acquire("gpu", {}, false, why);
        ASSERT_TRUE(a);
        s->release(*a, routing::PoolOutcome::failed, 0);
    }
    ASSERT_EQ(s->breaker_opened("gpu"), 1u);
    // Until breaker_open_ms has passed, nothing closes it.
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1300)) {
        EXPECT_FALSE(s->acquire("gpu", {}, false, why).has_value());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(eventually([&] { return s->acquire("gpu", {}, false, why).has_value(); }));
    s->stop();
}

TEST(Pools, WaitWarmReturnsOnceEveryUpstreamHadItsFirstCheck) {
    std::string err;
    auto s = routing::PoolSet::open({pool_of(2)}, err);
    ASSERT_TRUE(s) << err;
    std::atomic<bool> answer{false};
    std::atomic<int> gets{0};
    s->set_probe([&](const std::string & method, const std::string &, const std::string &, const std::string &, int) {
        if (method == "GET") ++gets;
        while (!answer.load())  // the upstreams take their time
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return method == "GET" && gets.load() == 1 ? 503 : 200;  // the first fails its check
    });
    s->start();
    EXPECT_FALSE(s->wait_warm(200));  // still warming
    answer = true;
    EXPECT_TRUE(s->wait_warm(5000));
    const auto st = s->status()["gpu"]["upstreams"];
    EXPECT_EQ(st[0]["state"].get<std::string>() == "down" || st[1]["state"].get<std::string>() == "down", true);
    s->stop();
}

TEST(Pools, AnUpstreamThatIsUpIsCheckedAtItsOwnSlowerPace) {
    std::string err;
    auto p = pool_of(1, 8);
    p.up_health_ms = 60000;  // as on a node
    auto s = routing::PoolSet::open({p}, err);
    ASSERT_TRUE(s) << err;
    std::atomic<int> gets{0}, health{503};
    s->set_probe([&](const std::string & method, const std::string &, const std::string &, const std::string &, int) {
        if (method == "GET") ++gets;
        return method == "GET" ? health.load() : 200;
    });
    s->start();
    // Down: probed at health_ms (100 ms) until it passes.
    ASSERT_TRUE(eventually([&] { return gets.load() >= 3; }));
    health = 200;
    ASSERT_TRUE(eventually([&] { return s->status()["gpu"]["up"] == 1; }));
    const int at_up = gets.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // five health_ms periods
    EXPECT_EQ(gets.load(), at_up) << "an upstream that is up waits up_health_ms";
    s->stop();
}
