// The KV journal and the sequence-state layout it cuts and joins, on synthetic llama.cpp states
// whose cell contents are a function of (layer, position): a state folded from records must be
// byte-identical to the state built directly.
#include "engine/kv_journal.h"
#include "engine/kv_state.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

using namespace armada::engine;
namespace fs = std::filesystem;

namespace {

template <class T>
void put(std::vector<uint8_t> & out, T v) {
    const auto * p = reinterpret_cast<const uint8_t *>(&v);
    out.insert(out.end(), p, p + sizeof v);
}

struct Shape {
    uint32_t n_layer = 2, k_row = 6, v_row = 4, n_embd_v = 3;
    bool v_trans = false;
};

//! A llama.cpp sequence state for positions [0, n) of sequence `seq` (stream `seq` of 2).
std::vector<uint8_t> state(uint32_t n, int32_t seq = 1, Shape sh = {}) {
    std::vector<uint8_t> s;
    put(s, uint32_t(0xaf143cd8));
    put(s, seq);
    put(s, uint32_t(2));
    for (int32_t st = 0; st < seq; ++st)
        put(s, uint32_t(0));
    put(s, n);
    for (uint32_t i = 0; i < n; ++i) {
        put(s, int32_t(i));
        put(s, uint32_t(1));
        put(s, seq);
    }
    put(s, uint32_t(sh.v_trans));
    put(s, sh.n_layer);
    for (uint32_t l = 0; l < sh.n_layer; ++l) {
        put(s, int32_t(1));
        put(s, uint64_t(sh.k_row));
        for (uint32_t i = 0; i < n; ++i)
            for (uint32_t b = 0; b < sh.k_row; ++b)
                s.push_back(uint8_t(l * 31 + i * 7 + b));
    }
    for (uint32_t l = 0; l < sh.n_layer; ++l) {
        put(s, int32_t(1));
        if (!sh.v_trans) {
            put(s, uint64_t(sh.v_row));
            for (uint32_t i = 0; i < n; ++i)
                for (uint32_t b = 0; b < sh.v_row; ++b)
                    s.push_back(uint8_t(l * 17 + i * 5 + b + 100));
        } else {
            put(s, uint32_t(2));
            put(s, sh.n_embd_v);
            for (uint32_t j = 0; j < sh.n_embd_v; ++j)
                for (uint32_t i = 0; i < n; ++i) {
                    s.push_back(uint8_t(l * 13 + j * 3 + i));
                    s.push_back(uint8_t(i >> 8));
                }
        }
    }
    for (int32_t st = seq + 1; st < 2; ++st)
        put(s, uint32_t(0));
    return s;
}

Tokens toks(uint32_t n, int salt = 0) {
    Tokens t;
    for (uint32_t i = 0; i < n; ++i)
        t.push_back(llama_token(1000 + i + (i >= 20 ? salt : 0)));
    return t;
}

KvBlob blob(uint32_t n, int salt = 0) {
    return KvBlob{toks(n, salt), state(n)};
}

struct Dir {
    fs::path p = fs::temp_directory_path() /
                 ("armada-kvj-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    Dir() { fs::create_directories(p); }
    ~Dir() { fs::remove_all(p); }
};

KvJournalConfig cfg(const fs::path & dir) {
    KvJournalConfig c;
    c.dir = dir.string();
    c.fingerprint = "fp-1";
    return c;
}

std::string slurp(const fs::path & p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

fs::path only_file(const fs::path & dir) {
    for (const auto & de : fs::directory_iterator(dir)) {
        if (de.path().extension() == ".kvj") return de.path();
    }
    return {};
}

}  // namespace

TEST(SeqState, CutsAndJoinsByPosition) {
    for (bool v_trans : {false, true}) {
        Shape sh;
        sh.v_trans = v_trans;
        const auto full = state(40, 1, sh);
        std::string why;
        auto l = SeqState::parse(full.data(), full.size(), why);
        ASSERT_TRUE(l) << why;
        EXPECT_EQ(l->cell_count(), 40u);
        EXPECT_EQ(l->select(full.data(), 0, 40), full);
        const auto head = l->select(full.data(), 0, 15), tail = l->select(full.data(), 15, 1000);
        EXPECT_EQ(head, state(15, 1, sh));
        auto lh = SeqState::parse(head.data(), head.size(), why), lt = SeqState::parse(tail.data(), tail.size(), why);
        ASSERT_TRUE(lh && lt) << why;
        EXPECT_EQ(lt->cell_count(), 25u);
        EXPECT_EQ(lt->positions().front(), 15);
        EXPECT_EQ(SeqState::join(head.data(), *lh, tail.data(), *lt), full);
    }
}

TEST(SeqState, RejectsWhatItDoesNotKnow) {
    std::string why;
    auto full = state(10);
    EXPECT_FALSE(SeqState::parse(full.data(), full.size() - 1, why));
    EXPECT_FALSE(why.empty());
    auto longer = full;
    longer.push_back(0);
    EXPECT_FALSE(SeqState::parse(longer.data(), longer.size(), why));
    EXPECT_EQ(why, "trailing bytes (unknown layout)");
    auto bad = full;
    bad[0] ^= 1;
    EXPECT_FALSE(SeqState::parse(bad.data(), bad.size(), why));
    const std::vector<uint8_t> empty = state(0);
    EXPECT_FALSE(SeqState::parse(empty.data(), empty.size(), why));
    // Every prefix of a valid image is rejected without reading past its end.
    for (size_t n = 0; n < full.size(); ++n)
        EXPECT_FALSE(SeqState::parse(full.data(), n, why)) << n;
    // Layouts of two different models do not join.
    Shape other;
    other.n_layer = 3;
    const auto a = state(5), b = state(5, 1, other);
    auto la = SeqState::parse(a.data(), a.size(), why), lb = SeqState::parse(b.data(), b.size(), why);
    ASSERT_TRUE(la && lb);
    EXPECT_TRUE(SeqState::join(a.data(), *la, b.data(), *lb).empty());
}

TEST(KvJournal, AppendsStepsAndFoldsThemBack) {
    Dir d;
    KvJournal j(cfg(d.p));
    ASSERT_EQ(j.open(), "");
    j.append("s1", blob(10));
    j.flush();
    j.append("s1", blob(25));  // grows: only cells 10..24 are written
    j.flush();
    j.append("s1", blob(30, 7));  // diverges at 20: keep 20, add 10
    j.flush();
    j.append("s1", blob(30, 7));  // nothing new: nothing written
    j.flush();
    const auto st = j.stats();
    EXPECT_EQ(st.records, 3u);
    EXPECT_EQ(st.bases, 1u);
    const auto file = only_file(d.p);
    EXPECT_LT(fs::file_size(file), state(10).size() + state(25).size() + state(30).size());

    std::string why;
    auto b = j.load("s1", why);
    ASSERT_TRUE(b) << why;
    EXPECT_EQ(b->tokens, toks(30, 7));
    EXPECT_EQ(b->data, state(30));
    ASSERT_TRUE(j.info("s1"));
    EXPECT_EQ(j.info("s1")->n_tokens, 30u);
    EXPECT_EQ(j.info("s1")->tier, KvTier::Disk);
    EXPECT_FALSE(j.load("nobody", why));
    EXPECT_EQ(why, "not journaled");

    // A shorter step only cuts.
    j.append("s1", blob(12));
    j.flush();
    b = j.load("s1", why);
    ASSERT_TRUE(b) << why;
    EXPECT_EQ(b->data, state(12));
}

TEST(KvJournal, ATornOrCorruptLastStepFallsBackToTheStepBefore) {
    Dir d;
    {
        KvJournal j(cfg(d.p));
        ASSERT_EQ(j.open(), "");
        j.append("s", blob(10));
        j.flush();
        j.append("s", blob(18));
        j.flush();
    }
    const auto file = only_file(d.p);
    const std::string image = slurp(file);
    std::string why;
    auto b = KvJournal::read_image(image, "fp-1", "s", why);
    ASSERT_TRUE(b) << why;
    EXPECT_EQ(b->data, state(18));
    // Torn: every cut inside the second record gives the first step back.
    const size_t first_end = image.find("STEP", image.find("STEP") + 4);  // where the second record starts
    for (size_t cut = first_end; cut < image.size(); cut += 7) {
        b = KvJournal::read_image(image.substr(0, cut), "fp-1", "s", why);
        ASSERT_TRUE(b) << cut;
        EXPECT_EQ(b->data, state(10)) << cut;
    }
    // A flipped bit in the second record's cells fails its checksum.
    std::string bad = image;
    bad[image.size() - 20] ^= 0x10;
    b = KvJournal::read_image(bad, "fp-1", "s", why);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->tokens.size(), 10u);
    // Other fingerprint or key: refused with the reason.
    EXPECT_FALSE(KvJournal::read_image(image, "fp-2", "s", why));
    EXPECT_NE(why.find("fingerprint"), std::string::npos);
    EXPECT_FALSE(KvJournal::read_image(image, "fp-1", "t", why));
    EXPECT_FALSE(KvJournal::read_image("garbage", "fp-1", "s", why));
    // Any prefix of the header is refused.
    for (size_t n = 0; n < first_end; n += 3)
        EXPECT_FALSE(KvJournal::read_image(image.substr(0, n), "fp-1", "s", why)) << n;

    // After a crash mid-write, a restart cuts the torn tail off and keeps appending.
    fs::resize_file(file, image.size() - 5);
    KvJournal j(cfg(d.p));
    ASSERT_EQ(j.open(), "");
    EXPECT_EQ(fs::file_size(file), first_end);
    ASSERT_TRUE(j.info("s"));
    EXPECT_EQ(j.info("s")->n_tokens, 10u);
    j.append("s", blob(14));
    j.flush();
    EXPECT_EQ(j.stats().bases, 0u);
    b = j.load("s", why);
    ASSERT_TRUE(b) << why;
    EXPECT_EQ(b->data, state(14));
}

TEST(KvJournal, EraseSkipAndWholeImages) {
    Dir d;
    KvJournalConfig c = cfg(d.p);
    c.max_pending_bytes = state(12).size() + 1;
    KvJournal j(c);
    ASSERT_EQ(j.open(), "");
    j.append("s", blob(10));
    j.flush();
    j.erase("s");
    j.append("s", blob(12));  // after an erase the file starts afresh
    j.flush();
    EXPECT_EQ(j.stats().bases, 2u);
    j.erase("s");
    j.flush();
    EXPECT_FALSE(j.contains("s"));
    EXPECT_TRUE(only_file(d.p).empty());
    // Past the pending bound, a step is skipped, not queued.
    j.append("big", blob(40));
    EXPECT_EQ(j.stats().skipped, 1u);
    // A state in a layout the journal cannot cut is written whole, every time, and read back.
    KvBlob odd{toks(5), std::vector<uint8_t>(100, 7)};
    j.append("odd", odd);
    j.flush();
    odd.tokens = toks(6);
    j.append("odd", odd);
    j.flush();
    EXPECT_EQ(j.stats().bases, 4u);
    std::string why;
    auto b = j.load("odd", why);
    ASSERT_TRUE(b) << why;
    EXPECT_EQ(b->tokens, toks(6));
    EXPECT_EQ(b->data, odd.data);
}

TEST(KvJournal, OverTheDiskLimitTheOldestJournalsGo) {
    Dir d;
    KvJournalConfig c = cfg(d.p);
    c.disk_limit = 3 * (state(20).size() + 200);
    KvJournal j(c);
    ASSERT_EQ(j.open(), "");
    for (const char * k : {"a", "b", "c", "d", "e"}) {
        j.append(k, blob(20));
        j.flush();
    }
    const auto st = j.stats();
    EXPECT_EQ(st.evicted, 2u);
    EXPECT_EQ(st.files, 3u);
    EXPECT_LE(st.disk_bytes, c.disk_limit);
    EXPECT_FALSE(j.contains("a"));
    EXPECT_FALSE(j.contains("b"));
    EXPECT_TRUE(j.contains("e"));
    EXPECT_TRUE(j.holds("e", toks(20)));
    EXPECT_FALSE(j.holds("e", toks(21)));
    // A restart counts what is on disk.
    KvJournal again(c);
    ASSERT_EQ(again.open(), "");
    EXPECT_EQ(again.stats().files, 3u);
    EXPECT_EQ(again.stats().disk_bytes, st.disk_bytes);
}

namespace {

//! What a descriptor from `open_for_send` reads, as a node sending it would.
std::string read_fd(int fd) {
    std::string out;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, size_t(n));
    }
    ::close(fd);
    return out;
}

void write_file(const std::string & path, const std::string & data) {
    std::ofstream(path, std::ios::binary) << data;
}

}  // namespace

// A session moving with its KV: one node sends its journal file, the other installs it and
// loads the same state.
TEST(KvJournal, AJournalSentToAnotherNodeLoadsThereAsItWas) {
    Dir a, b;
    KvJournal src(cfg(a.p)), dst(cfg(b.p));
    ASSERT_EQ(src.open(), "");
    ASSERT_EQ(dst.open(), "");
    src.append("s1", blob(10));
    src.append("s1", blob(25));  // still queued, maybe: open_for_send waits for the disk
    std::string why;
    auto f = src.open_for_send("s1", why);
    ASSERT_TRUE(f) << why;
    EXPECT_EQ(f->n_tokens, 25u);
    const std::string sent = read_fd(f->fd);
    EXPECT_EQ(sent.size(), f->bytes);

    const std::string in = dst.incoming_path("s1");
    EXPECT_EQ(fs::path(in).parent_path(), b.p);
    write_file(in, sent);
    ASSERT_EQ(dst.install("s1", in), "");
    EXPECT_FALSE(fs::exists(in));
    auto got = dst.load("s1", why);
    ASSERT_TRUE(got) << why;
    EXPECT_EQ(got->tokens, toks(25));
    EXPECT_EQ(got->data, state(25));
    EXPECT_EQ(dst.stats().files, 1u);
    // The installed file is the session's journal from now on: the next step appends to it.
    dst.append("s1", blob(30));
    dst.flush();
    got = dst.load("s1", why);
    ASSERT_TRUE(got) << why;
    EXPECT_EQ(got->data, state(30));

    EXPECT_FALSE(src.open_for_send("nobody", why));
    EXPECT_EQ(why, "not journaled");
}

TEST(KvJournal, AReceivedJournalOfAnotherModelSessionOrTornTailIsTakenOnlyAsFarAsItHolds) {
    Dir a, b, c;
    KvJournal src(cfg(a.p)), dst(cfg(b.p));
    auto other_cfg = cfg(c.p);
    other_cfg.fingerprint = "fp-2";
    KvJournal other(other_cfg);
    ASSERT_EQ(src.open(), "");
    ASSERT_EQ(dst.open(), "");
    ASSERT_EQ(other.open(), "");
    src.append("s1", blob(10));
    src.flush();
    src.append("s1", blob(20));
    src.flush();
    other.append("s1", blob(10));
    other.flush();
    std::string why;
    const auto gf = src.open_for_send("s1", why), ff = other.open_for_send("s1", why);
    ASSERT_TRUE(gf && ff) << why;
    const std::string good = read_fd(gf->fd), foreign = read_fd(ff->fd);

    const std::string in = dst.incoming_path("s1");
    write_file(in, foreign);
    EXPECT_EQ(dst.install("s1", in), "fingerprint differs (model, context or llama.cpp build)");
    write_file(in, good);
    EXPECT_EQ(dst.install("s2", in), "the journal belongs to another session");
    write_file(in, "not a journal at all");
    EXPECT_EQ(dst.install("s1", in), "not a KV journal");
    EXPECT_FALSE(dst.load("s1", why));

    // Cut in the middle of its second record (a transfer that stopped): the first step is kept.
    write_file(in, good.substr(0, good.size() - 7));
    ASSERT_EQ(dst.install("s1", in), "");
    auto got = dst.load("s1", why);
    ASSERT_TRUE(got) << why;
    EXPECT_EQ(got->tokens, toks(10));
    EXPECT_EQ(got->data, state(10));
}
