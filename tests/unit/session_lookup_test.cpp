// The gateway's session lookup: a store it cannot read is "retry", never "no such session".
#include "gateway/session_lookup.h"
#include "store/sqlite_store.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace armada;

namespace {

//! Reads fail while `unreadable` is set (a read pool that timed out, PostgreSQL restarting),
//! as a real store reports them: `session` says nothing, `has_session` says it cannot tell.
class BlindStore : public store::ForwardingStore {
  public:
    using ForwardingStore::ForwardingStore;
    bool unreadable = false;
    std::optional<store::SessionRecord> session(const std::string & id) override {
        if (unreadable) return std::nullopt;
        return inner_.session(id);
    }
    std::optional<bool> has_session(const std::string & id) override {
        if (unreadable) return std::nullopt;
        return inner_.has_session(id);
    }
};

struct Rig {
    std::string dir =
        (std::filesystem::temp_directory_path() / ("armada-lookup-" + std::to_string(::getpid()))).string();
    std::unique_ptr<store::SqliteStore> sqlite;
    std::unique_ptr<BlindStore> st;
    Rig() {
        std::string err;
        sqlite = store::SqliteStore::open(dir, err);
        EXPECT_TRUE(sqlite) << err;
        st = std::make_unique<BlindStore>(*sqlite);
        store::Batch b;
        store::SessionRecord r;
        r.id = "sess_1";
        r.agent_id = "agent";
        r.state = "running";
        b.sessions.push_back(r);
        EXPECT_TRUE(st->commit_sync(std::move(b)).ok);
    }
    ~Rig() {
        st.reset();
        sqlite.reset();
        std::filesystem::remove_all(dir);
    }
};

}  // namespace

TEST(SessionLookup, FindsARowAndSaysPlainlyWhenThereIsNone) {
    Rig rig;
    bool unavailable = true;
    auto rec = gateway::lookup_session(*rig.st, "sess_1", nullptr, unavailable);
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->agent_id, "agent");
    EXPECT_FALSE(unavailable);
    EXPECT_FALSE(gateway::lookup_session(*rig.st, "sess_none", nullptr, unavailable));
    EXPECT_FALSE(unavailable);
}

TEST(SessionLookup, AStoreThatCannotBeReadIsUnavailableEvenWhenItTakesWrites) {
    Rig rig;
    rig.st->unreadable = true;
    bool unavailable = false;
    int renewals = 0;
    // Writes still work (the probe the gateway renews with succeeds): the row must not be
    // reported missing because of that.
    auto renew = [&] {
        ++renewals;
        return true;
    };
    EXPECT_FALSE(gateway::lookup_session(*rig.st, "sess_1", renew, unavailable));
    EXPECT_TRUE(unavailable);
    EXPECT_EQ(renewals, 1);
    EXPECT_FALSE(gateway::lookup_session(*rig.st, "sess_none", renew, unavailable));
    EXPECT_TRUE(unavailable);
}

TEST(SessionLookup, ARenewalThatBringsTheStoreBackFindsTheRow) {
    Rig rig;
    rig.st->unreadable = true;
    bool unavailable = false;
    auto rec = gateway::lookup_session(
        *rig.st, "sess_1",
        [&] {
            rig.st->unreadable = false;  // the broken connection was replaced
            return true;
        },
        unavailable);
    ASSERT_TRUE(rec);
    EXPECT_FALSE(unavailable);
}
