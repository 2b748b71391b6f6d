// /readyz's store check: ready only when a probe write is durable in time.
#include "api/readiness.h"
#include "mocks/fault_store.h"
#include "store/sqlite_store.h"

#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <filesystem>
#include <future>
#include <thread>

using namespace armada;

namespace {

//! A store whose writes never come back (a hung disk).
class SilentStore : public store::ForwardingStore {
  public:
    using ForwardingStore::ForwardingStore;
    void commit(store::Batch, std::function<void(store::Status)> done) override { held_.push_back(std::move(done)); }

  private:
    std::vector<std::function<void(store::Status)>> held_;
};

struct Rig {
    std::string dir =
        (std::filesystem::temp_directory_path() / ("armada-ready-" + std::to_string(::getpid()))).string();
    std::unique_ptr<store::SqliteStore> sqlite;
    boost::asio::io_context io;
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work = boost::asio::make_work_guard(io);
    std::thread t;
    Rig() {
        std::string err;
        sqlite = store::SqliteStore::open(dir, err);
        EXPECT_TRUE(sqlite) << err;
        t = std::thread([this] { io.run(); });
    }
    ~Rig() {
        work.reset();
        io.stop();
        t.join();
        sqlite.reset();
        std::filesystem::remove_all(dir);
    }
    std::string ask(api::StoreReadiness & r) {
        std::promise<std::string> p;
        r.check([&](std::string why) { p.set_value(std::move(why)); });
        return p.get_future().get();
    }
};

}  // namespace

TEST(StoreReadiness, ReadyWhenAProbeWriteIsDurable) {
    Rig rig;
    api::StoreReadiness r(*rig.sqlite, rig.io.get_executor(), 0);
    EXPECT_EQ(rig.ask(r), "");
}

TEST(StoreReadiness, NotReadyWhenTheStoreRefusesOrIsFull) {
    Rig rig;
    armada::testing::FaultStore faults(*rig.sqlite);
    api::StoreReadiness r(faults, rig.io.get_executor(), 0);
    faults.fail_next = 1;
    EXPECT_NE(rig.ask(r).find("the store refuses writes: write failed (injected)"), std::string::npos);
    // The failure is sticky until the store recovers.
    EXPECT_NE(rig.ask(r).find("injected"), std::string::npos);
    ASSERT_TRUE(faults.recover().ok);
    EXPECT_EQ(rig.ask(r), "");
    faults.disk_full = true;
    EXPECT_NE(rig.ask(r).find("disk full"), std::string::npos);
}

TEST(StoreReadiness, NotReadyWhenAWriteDoesNotComeBackInTime) {
    Rig rig;
    SilentStore silent(*rig.sqlite);
    api::StoreReadiness r(silent, rig.io.get_executor(), 0, 100);
    EXPECT_EQ(rig.ask(r), "the store did not take a write within 100 ms");
}

TEST(StoreReadiness, AsksTheStoreAtMostOncePerInterval) {
    Rig rig;
    armada::testing::FaultStore faults(*rig.sqlite);
    api::StoreReadiness r(faults, rig.io.get_executor(), 60000);
    EXPECT_EQ(rig.ask(r), "");
    // A failure injected now is not seen until the interval has passed: the last answer stands.
    faults.fail_next = 1;
    EXPECT_EQ(rig.ask(r), "");
    EXPECT_EQ(faults.failures.load(), 0);
}
