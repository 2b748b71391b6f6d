#include "servers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

namespace fs = std::filesystem;

namespace {
ClusterServers * g_servers = nullptr;
std::set<std::string> g_shared;  // the names under root that the shared servers made

bool keep_tmp() {
    const char * keep = std::getenv("ARMADA_KEEP_TMP");
    return keep != nullptr && std::string(keep) == "1";
}

class Environment : public ::testing::Environment {
  public:
    void SetUp() override {
        g_servers = new ClusterServers();
        g_servers->root = (fs::temp_directory_path() / ("armada-cluster-" + std::to_string(::getpid()))).string();
        ASSERT_EQ(g_servers->etcd.start(g_servers->root + "/etcd"), "");
        ASSERT_EQ(g_servers->nats.start(g_servers->root + "/nats"), "");
        ASSERT_EQ(g_servers->redis.start(g_servers->root + "/redis"), "");
        // What the shared servers made (their data, secrets and logs) stays to the end.
        std::error_code ec;
        for (const auto & entry : fs::directory_iterator(g_servers->root, ec))
            g_shared.insert(entry.path().filename().string());
    }
    void TearDown() override {
        const std::string root = g_servers->root;
        delete g_servers;  // stops the servers this process started
        g_servers = nullptr;
        if (keep_tmp()) return;
        std::error_code ec;
        fs::remove_all(root, ec);
    }
};
const auto * g_env = ::testing::AddGlobalTestEnvironment(new Environment);

// What a test made under the servers' root (its own PostgreSQL or etcd, its files) goes when the
// test ends, by then its servers have stopped: left to the end of the run, these add up to
// gigabytes, and a CI machine's disk fills. ARMADA_KEEP_TMP=1 keeps them for a look afterwards.
class RemoveWhatATestMade : public ::testing::EmptyTestEventListener {
    void OnTestEnd(const ::testing::TestInfo &) override {
        if (g_servers == nullptr || g_servers->root.empty()) return;
        if (keep_tmp()) return;
        std::error_code ec;
        for (const auto & entry : fs::directory_iterator(g_servers->root, ec)) {
            if (g_shared.count(entry.path().filename().string())) continue;
            std::error_code rm;
            fs::remove_all(entry.path(), rm);
        }
    }
};
const bool g_listener = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new RemoveWhatATestMade);
    return true;
}();
}  // namespace

ClusterServers & servers() {
    return *g_servers;
}
