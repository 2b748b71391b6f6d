#include "engine/kv_pool.h"
#include "engine/memory_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

using namespace armada::engine;
namespace fs = std::filesystem;

namespace {

KvBlob blob(size_t bytes, uint32_t seed, bool compressible = false) {
    KvBlob b;
    for (int i = 0; i < 10; ++i)
        b.tokens.push_back(llama_token(seed + uint32_t(i)));
    b.data.resize(bytes);
    std::mt19937 rng(seed);
    for (auto & x : b.data)
        x = compressible ? uint8_t(seed) : uint8_t(rng());
    return b;
}

struct Dir {
    fs::path p = fs::temp_directory_path() /
                 ("armada-kvpool-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    Dir() { fs::create_directories(p); }
    ~Dir() { fs::remove_all(p); }
};

KvPoolConfig cfg(const std::string & dir, uint64_t ram) {
    KvPoolConfig c;
    c.dir = dir;
    c.ram_limit = ram;
    c.ram_low = ram / 2;
    c.fingerprint = "fp-1";
    return c;
}

}  // namespace

TEST(KvFile, RoundTripsAndCompressesOnlyWhenItPays) {
    KvPoolConfig c = cfg("", 0);
    for (bool compressible : {false, true}) {
        const KvBlob b = blob(100000, 7, compressible);
        bool z = false;
        const std::string img = KvPool::encode_file(c, "sess_x", b, z);
        EXPECT_EQ(z, compressible);
        if (!compressible) EXPECT_GT(img.size(), b.data.size());
        std::string why;
        auto back = KvPool::decode_file(img, "fp-1", "sess_x", why);
        ASSERT_TRUE(back) << why;
        EXPECT_EQ(back->tokens, b.tokens);
        EXPECT_EQ(back->data, b.data);
    }
}

TEST(KvFile, RefusesForeignFingerprintOtherKeyCorruptionAndTruncation) {
    KvPoolConfig c = cfg("", 0);
    const KvBlob b = blob(5000, 3);
    bool z = false;
    const std::string img = KvPool::encode_file(c, "sess_x", b, z);
    std::string why;
    EXPECT_FALSE(KvPool::decode_file(img, "fp-2", "sess_x", why));
    EXPECT_NE(why.find("fingerprint"), std::string::npos);
    EXPECT_FALSE(KvPool::decode_file(img, "fp-1", "sess_y", why));
    EXPECT_NE(why.find("another key"), std::string::npos);
    std::string bad = img;
    bad[bad.size() - 10] ^= 0x40;
    EXPECT_FALSE(KvPool::decode_file(bad, "fp-1", "sess_x", why));
    EXPECT_NE(why.find("checksum"), std::string::npos);
    for (size_t cut : {size_t(0), size_t(3), size_t(20), img.size() / 2, img.size() - 1}) {
        EXPECT_FALSE(KvPool::decode_file(img.substr(0, cut), "fp-1", "sess_x", why)) << cut;
    }
}

TEST(KvPoolTest, SpillsColdThenLeastRecentlyUsedAndRestoresFromDisk) {
    Dir d;
    KvPool pool(cfg(d.p.string(), 250000));
    ASSERT_EQ(pool.open(), "");
    pool.put("a", blob(100000, 1), false);
    pool.put("b", blob(100000, 2), true);  // cold: waiting for its user
    EXPECT_EQ(pool.stats().spilled, 0u);
    pool.put("c", blob(100000, 3), false);  // over 250 kB: spill down to 125 kB
    pool.flush();
    EXPECT_EQ(pool.info("b")->tier, KvTier::Disk);  // cold goes first
    EXPECT_EQ(pool.info("a")->tier, KvTier::Disk);  // then the least recently used
    EXPECT_EQ(pool.info("c")->tier, KvTier::Ram);
    EXPECT_FALSE(pool.pressured());

    KvTier from = KvTier::Ram;
    std::string why;
    auto got = pool.get("a", false, from, why);
    ASSERT_TRUE(got) << why;
    EXPECT_EQ(from, KvTier::Disk);
    EXPECT_EQ(got->data, blob(100000, 1).data);
    EXPECT_FALSE(pool.contains("a"));
    EXPECT_EQ(pool.stats().disk_entries, 1u);
}

TEST(KvPoolTest, ReopenFindsSpilledEntriesAndDropsBadFiles) {
    Dir d;
    {
        KvPool pool(cfg(d.p.string(), 1 << 30));
        ASSERT_EQ(pool.open(), "");
        pool.put("sess_1", blob(4000, 1), false);
        pool.put("sess_2", blob(4000, 2), false);
        EXPECT_EQ(pool.spill_all(), 2u);
    }
    // Corrupt one file the way a torn write or a bad disk would.
    for (const auto & de : fs::directory_iterator(d.p)) {
        std::string img;
        {
            std::ifstream f(de.path(), std::ios::binary);
            img.assign(std::istreambuf_iterator<char>(f), {});
        }
        if (img.find("sess_2") == std::string::npos) continue;
        img[img.size() - 1] ^= 1;
        std::ofstream(de.path(), std::ios::binary | std::ios::trunc).write(img.data(), std::streamsize(img.size()));
    }
    KvPool pool(cfg(d.p.string(), 1 << 30));
    ASSERT_EQ(pool.open(), "");
    EXPECT_TRUE(pool.contains("sess_1"));
    EXPECT_TRUE(pool.contains("sess_2"));
    KvTier from;
    std::string why;
    EXPECT_TRUE(pool.get("sess_1", true, from, why));
    EXPECT_FALSE(pool.get("sess_2", false, from, why));
    EXPECT_NE(why.find("checksum"), std::string::npos);
    EXPECT_FALSE(pool.contains("sess_2"));  // never tried twice
    EXPECT_EQ(pool.stats().rejected, 1u);
}

TEST(KvPoolTest, WithoutADiskTierOverflowDropsAndRaisesPressureForTheHoldTime) {
    KvPoolConfig c = cfg("", 250000);
    c.pressure_hold_ms = 300;
    auto t = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
    c.now = [&t] { return t; };
    KvPool pool(c);
    ASSERT_EQ(pool.open(), "");
    pool.put("a", blob(100000, 1), false);
    pool.put("b", blob(100000, 2), false);
    EXPECT_FALSE(pool.pressured());
    pool.put("c", blob(100000, 3), false);
    EXPECT_EQ(pool.stats().dropped, 2u);  // down to the low watermark (125 kB), oldest first
    EXPECT_FALSE(pool.contains("a"));
    EXPECT_FALSE(pool.contains("b"));
    EXPECT_TRUE(pool.contains("c"));
    EXPECT_TRUE(pool.pressured());
    t += std::chrono::milliseconds(299);
    EXPECT_TRUE(pool.pressured());  // still within the hold time
    t += std::chrono::milliseconds(1);
    EXPECT_FALSE(pool.pressured());  // under the low watermark and nothing dropped since
}

TEST(KvPoolTest, DiskTierNearItsLimitRaisesPressure) {
    Dir d;
    KvPoolConfig c = cfg(d.p.string(), 1000);
    c.ram_low = 0;
    c.disk_limit = 215000;
    c.pressure_hold_ms = 0;
    KvPool pool(c);
    ASSERT_EQ(pool.open(), "");
    pool.put("a", blob(100000, 1), false);
    EXPECT_FALSE(pool.pressured());
    pool.put("b", blob(100000, 2), false);  // ~200 kB on disk: past 90% of 215 kB
    EXPECT_EQ(pool.stats().disk_entries, 2u);
    EXPECT_TRUE(pool.pressured());
    pool.erase("a");
    EXPECT_FALSE(pool.pressured());
}

TEST(MemoryBudget, ParsesSizes) {
    EXPECT_EQ(parse_size("8G"), 8ull << 30);
    EXPECT_EQ(parse_size("512M"), 512ull << 20);
    EXPECT_EQ(parse_size("64k"), 64ull << 10);
    EXPECT_EQ(parse_size("1.5GiB"), 3ull << 29);
    EXPECT_EQ(parse_size("1000"), 1000u);
    EXPECT_FALSE(parse_size(""));
    EXPECT_FALSE(parse_size("G"));
    EXPECT_FALSE(parse_size("12X"));
    EXPECT_FALSE(parse_size("1e30"));
    EXPECT_EQ(format_size(3ull << 29), "1.5 GiB");
}

TEST(MemoryBudget, HonoursACgroupLimitBelowTheMachine) {
    Dir d;
    fs::create_directories(d.p / "proc");
    fs::create_directories(d.p / "sys/fs/cgroup");
    std::ofstream(d.p / "proc/meminfo") << "MemTotal:       16000000 kB\nMemFree: 1 kB\n";
    const std::string root = d.p.string() + "/";
    EXPECT_EQ(memory_limit(root), 16000000ull * 1024);
    std::ofstream(d.p / "sys/fs/cgroup/memory.max") << "max\n";
    EXPECT_EQ(memory_limit(root), 16000000ull * 1024);
    std::ofstream(d.p / "sys/fs/cgroup/memory.max") << "4294967296\n";
    EXPECT_EQ(memory_limit(root), 4294967296ull);
}

TEST(KvPoolTest, AFileClaimingAHugeUncompressedSizeIsRefusedBeforeAllocating) {
    KvPoolConfig c = cfg("", 1 << 20);
    const KvBlob b = blob(1 << 16, 5, true);
    bool compressed = false;
    std::string image = KvPool::encode_file(c, "k", b, compressed);
    ASSERT_TRUE(compressed);
    std::string why;
    ASSERT_TRUE(KvPool::decode_file(image, c.fingerprint, "k", why)) << why;
    // The raw size sits after magic, version, fingerprint, key and tokens.
    const size_t at = 4 + 4 + (4 + c.fingerprint.size()) + (4 + 1) + 4 + b.tokens.size() * sizeof(llama_token);
    const uint64_t huge = uint64_t(1) << 39;
    std::memcpy(image.data() + at, &huge, sizeof huge);
    EXPECT_FALSE(KvPool::decode_file(image, c.fingerprint, "k", why));
    EXPECT_EQ(why, "malformed compressed KV file");
}

namespace {
//! Holds the pool's writer inside its first write until opened, and says when it got there.
struct WriterGate {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, open = false;
    std::thread::id writer;
    void enter() {
        std::unique_lock lk(mu);
        writer = std::this_thread::get_id();
        entered = true;
        cv.notify_all();
        cv.wait(lk, [&] { return open; });
    }
    bool wait_entered() {
        std::unique_lock lk(mu);
        return cv.wait_for(lk, std::chrono::seconds(10), [&] { return entered; });
    }
    void release() {
        std::lock_guard lk(mu);
        open = true;
        cv.notify_all();
    }
};

size_t files_in(const fs::path & dir) {
    size_t n = 0;
    for ([[maybe_unused]] const auto & de : fs::directory_iterator(dir))
        ++n;
    return n;
}
}  // namespace

TEST(KvPoolTest, SpillFilesAreWrittenOffTheCallersThreadAndTheEntryStaysReadableMeanwhile) {
    Dir d;
    WriterGate gate;
    KvPoolConfig c = cfg(d.p.string(), 150000);
    c.ram_low = 120000;
    c.before_write = [&](const std::string &) { gate.enter(); };
    KvPool pool(c);
    ASSERT_EQ(pool.open(), "");
    pool.put("a", blob(100000, 1), false);
    std::atomic<bool> returned{false};
    std::thread::id caller;
    std::thread t([&] {
        caller = std::this_thread::get_id();
        pool.put("b", blob(100000, 2), false);  // over 150 kB: "a" is chosen to spill
        returned = true;
    });
    ASSERT_TRUE(gate.wait_entered());
    // The write is under way on another thread; "a" is still in RAM and can be read.
    EXPECT_EQ(pool.info("a")->tier, KvTier::Ram);
    EXPECT_EQ(pool.stats().writing_entries, 1u);
    KvTier from = KvTier::Disk;
    std::string why;
    auto got = pool.get("a", true, from, why);
    ASSERT_TRUE(got) << why;
    EXPECT_EQ(from, KvTier::Ram);
    EXPECT_EQ(got->data, blob(100000, 1).data);
    // RAM is over the limit until the file is in place: the caller waits for it.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(returned);
    gate.release();
    t.join();
    EXPECT_NE(gate.writer, caller);
    EXPECT_EQ(pool.info("a")->tier, KvTier::Disk);
    EXPECT_EQ(pool.info("b")->tier, KvTier::Ram);
    EXPECT_EQ(pool.stats().writing_entries, 0u);
    EXPECT_LE(pool.stats().ram_bytes, c.ram_limit);
    got = pool.get("a", false, from, why);
    ASSERT_TRUE(got) << why;
    EXPECT_EQ(from, KvTier::Disk);
    EXPECT_EQ(got->data, blob(100000, 1).data);
}

TEST(KvPoolTest, AnEntryErasedWhileItsFileIsWrittenLeavesNoFile) {
    Dir d;
    WriterGate gate;
    KvPoolConfig c = cfg(d.p.string(), 150000);
    c.ram_low = 120000;
    c.before_write = [&](const std::string &) { gate.enter(); };
    KvPool pool(c);
    ASSERT_EQ(pool.open(), "");
    pool.put("a", blob(100000, 1), false);
    std::thread t([&] { pool.put("b", blob(100000, 2), false); });
    ASSERT_TRUE(gate.wait_entered());
    pool.erase("a");
    gate.release();
    t.join();
    pool.flush();
    EXPECT_FALSE(pool.contains("a"));
    EXPECT_EQ(pool.stats().writing_entries, 0u);
    EXPECT_EQ(pool.stats().disk_entries, 0u);
    EXPECT_EQ(files_in(d.p), 0u);  // neither the file nor its temporary
}
