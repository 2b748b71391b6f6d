#include "servers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace fs = std::filesystem;

namespace {
ClusterServers * g_servers = nullptr;

class Environment : public ::testing::Environment {
  public:
    void SetUp() override {
        g_servers = new ClusterServers();
        g_servers->root = (fs::temp_directory_path() / ("armada-cluster-" + std::to_string(::getpid()))).string();
        ASSERT_EQ(g_servers->etcd.start(g_servers->root + "/etcd"), "");
        ASSERT_EQ(g_servers->nats.start(g_servers->root + "/nats"), "");
        ASSERT_EQ(g_servers->redis.start(g_servers->root + "/redis"), "");
    }
    void TearDown() override {
        const std::string root = g_servers->root;
        delete g_servers;  // stops the servers this process started
        g_servers = nullptr;
        std::error_code ec;
        fs::remove_all(root, ec);
    }
};
const auto * g_env = ::testing::AddGlobalTestEnvironment(new Environment);
}  // namespace

ClusterServers & servers() {
    return *g_servers;
}
