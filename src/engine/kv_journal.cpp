#include "engine/kv_journal.h"

#include "engine/kv_state.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace armada::engine {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[4] = {'A', 'R', 'K', 'J'};
constexpr char kRecord[4] = {'S', 'T', 'E', 'P'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxTokens = 1u << 24;

template <typename T>
void put(std::string & out, T v) {
    out.append(reinterpret_cast<const char *>(&v), sizeof v);
}

std::string header(const std::string & fingerprint, const std::string & key) {
    std::string h(kMagic, 4);
    put(h, kVersion);
    put(h, uint32_t(fingerprint.size()));
    h += fingerprint;
    put(h, uint32_t(key.size()));
    h += key;
    return h;
}

//! A record: "STEP", tokens kept from the state before it, the tokens it adds, their cells
//! (a llama.cpp sequence state holding exactly those positions; empty when it only cuts), and a
//! checksum of everything after the magic.
std::string record(uint32_t keep, const Tokens & add, const std::vector<uint8_t> & cells) {
    std::string r(kRecord, 4);
    const size_t body = r.size();
    put(r, keep);
    put(r, uint32_t(add.size()));
    r.append(reinterpret_cast<const char *>(add.data()), add.size() * sizeof(llama_token));
    put(r, uint64_t(cells.size()));
    r.append(reinterpret_cast<const char *>(cells.data()), cells.size());
    put(r, kv_checksum64(reinterpret_cast<const uint8_t *>(r.data() + body), r.size() - body));
    return r;
}

struct Cursor {
    const char * p;
    size_t n, at = 0;
    template <typename T>
    bool get(T & v) {
        if (n - at < sizeof v) return false;
        std::memcpy(&v, p + at, sizeof v);
        at += sizeof v;
        return true;
    }
    bool str(std::string & s, size_t max) {
        uint32_t len = 0;
        if (!get(len) || len > max || n - at < len) return false;
        s.assign(p + at, len);
        at += len;
        return true;
    }
};

//! Parses the header; on success the cursor is at the first record.
bool read_header(Cursor & c, std::string & fingerprint, std::string & key) {
    char magic[4];
    uint32_t version = 0;
    if (!c.get(magic) || std::memcmp(magic, kMagic, 4) != 0 || !c.get(version) || version != kVersion) return false;
    return c.str(fingerprint, 4096) && c.str(key, 4096);
}

struct RecordView {
    uint32_t keep = 0;
    const llama_token * add = nullptr;
    uint32_t n_add = 0;
    const uint8_t * cells = nullptr;
    uint64_t n_cells = 0;
};

//! Reads the next record. `check` verifies its checksum. False at the end, on a torn record or a
//! bad checksum.
bool next_record(Cursor & c, RecordView & r, bool check) {
    char magic[4];
    if (!c.get(magic) || std::memcmp(magic, kRecord, 4) != 0) return false;
    const size_t body = c.at;
    if (!c.get(r.keep) || !c.get(r.n_add) || r.n_add > kMaxTokens) return false;
    const size_t tok_bytes = size_t(r.n_add) * sizeof(llama_token);
    if (c.n - c.at < tok_bytes) return false;
    r.add = reinterpret_cast<const llama_token *>(c.p + c.at);  // may be unaligned: copied before use
    c.at += tok_bytes;
    if (!c.get(r.n_cells) || r.n_cells > c.n - c.at) return false;
    r.cells = reinterpret_cast<const uint8_t *>(c.p + c.at);
    c.at += size_t(r.n_cells);
    uint64_t sum = 0;
    const size_t end = c.at;
    if (!c.get(sum)) return false;
    return !check || sum == kv_checksum64(reinterpret_cast<const uint8_t *>(c.p + body), end - body);
}

//! The tokens a file's records describe, from the cursor (just past the header) to the first
//! record that is torn, fails its checksum (when `check`) or keeps more than came before.
//! Returns where the last good record ends.
size_t fold_tokens(Cursor & c, Tokens & tokens, bool check) {
    RecordView r;
    size_t end = c.at;
    while (next_record(c, r, check)) {
        if (r.keep > tokens.size()) break;
        tokens.resize(r.keep);
        const size_t at = tokens.size();
        tokens.resize(at + r.n_add);
        if (r.n_add) std::memcpy(tokens.data() + at, r.add, size_t(r.n_add) * sizeof(llama_token));
        end = c.at;
    }
    return end;
}

bool write_all(int fd, const std::string & data) {
    size_t off = 0;
    while (off < data.size()) {
        const ssize_t w = ::write(fd, data.data() + off, data.size() - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        off += size_t(w);
    }
    return true;
}

}  // namespace

std::optional<KvBlob> KvJournal::read_image(const std::string & image, const std::string & fingerprint,
                                            const std::string & key, std::string & why) {
    Cursor c{image.data(), image.size()};
    std::string fp, k;
    if (!read_header(c, fp, k)) {
        why = "not a KV journal";
        return std::nullopt;
    }
    if (fp != fingerprint) {
        why = "fingerprint differs (model, context or llama.cpp build changed)";
        return std::nullopt;
    }
    if (k != key) {
        why = "journal belongs to another session";
        return std::nullopt;
    }
    std::optional<KvBlob> state;
    RecordView r;
    size_t good = 0;
    while (next_record(c, r, true)) {
        Tokens add(r.n_add);
        if (r.n_add) std::memcpy(add.data(), r.add, size_t(r.n_add) * sizeof(llama_token));
        KvBlob next;
        if (r.keep == 0) {
            next.tokens = std::move(add);
            next.data.assign(r.cells, r.cells + r.n_cells);
        } else {
            if (!state || r.keep > state->tokens.size()) break;
            std::string w;
            auto before = SeqState::parse(state->data.data(), state->data.size(), w);
            if (!before) break;
            std::vector<uint8_t> kept = before->select(state->data.data(), 0, int32_t(r.keep));
            next.tokens.assign(state->tokens.begin(), state->tokens.begin() + r.keep);
            next.tokens.insert(next.tokens.end(), add.begin(), add.end());
            if (r.n_cells == 0) {
                next.data = std::move(kept);
            } else {
                auto lk = SeqState::parse(kept.data(), kept.size(), w);
                auto ln = SeqState::parse(r.cells, size_t(r.n_cells), w);
                if (!lk || !ln) break;
                next.data = SeqState::join(kept.data(), *lk, r.cells, *ln);
                if (next.data.empty()) break;
            }
        }
        // A whole state in a layout SeqState does not know is kept as it is (llama.cpp checks it on
        // restore); anything folded from pieces must add up.
        std::string w;
        auto check = SeqState::parse(next.data.data(), next.data.size(), w);
        if ((!check && r.keep != 0) || (check && check->cell_count() != next.tokens.size())) {
            why = "step " + std::to_string(good + 1) +
                  " does not fold: " + (check ? "cell count differs from its tokens" : w);
            break;
        }
        state = std::move(next);
        ++good;
    }
    if (!state) {
        if (why.empty()) why = "journal holds no complete step";
        return std::nullopt;
    }
    return state;
}

KvJournal::KvJournal(KvJournalConfig cfg) : cfg_(std::move(cfg)) {}

KvJournal::~KvJournal() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

std::string KvJournal::path_for(const std::string & key) const {
    char name[32];
    snprintf(name, sizeof name, "%016llx.kvj", static_cast<unsigned long long>(fnv1a64(key.data(), key.size())));
    return (fs::path(cfg_.dir) / name).string();
}

std::string KvJournal::open() {
    std::error_code ec;
    fs::create_directories(cfg_.dir, ec);
    if (ec) return "cannot create the KV journal directory " + cfg_.dir + ": " + ec.message();
    // Index what is there: the tokens each file holds, so the writer can keep appending after a
    // restart. A torn last record (a crash mid-write) is cut off here.
    for (const auto & de : fs::directory_iterator(cfg_.dir, ec)) {
        const auto & p = de.path();
        if (p.extension() == ".tmp") {
            fs::remove(p, ec);
            continue;
        }
        if (p.extension() != ".kvj") continue;
        std::string image;
        if (!read_whole_file(p.string(), image)) continue;
        Cursor c{image.data(), image.size()};
        std::string fp, key;
        if (!read_header(c, fp, key) || path_for(key) != p.string()) {
            spdlog::warn("kv: ignoring unreadable journal {}", p.string());
            continue;
        }
        if (fp != cfg_.fingerprint) continue;  // another model or build; a restore would refuse it anyway
        Known k;
        const size_t end = fold_tokens(c, k.tokens, false);
        if (end < image.size()) fs::resize_file(p, end, ec);
        k.file_bytes = end;
        k.live_bytes = end;
        std::lock_guard lk(mu_);
        k.written = ++tick_;
        stats_.disk_bytes += k.file_bytes;
        stats_.files++;
        known_[key] = std::move(k);
    }
    {
        std::lock_guard lk(mu_);
        evict_locked({});
    }
    thread_ = std::thread([this] { run(); });
    return {};
}

void KvJournal::append(const std::string & key, KvBlob blob) {
    {
        std::lock_guard lk(mu_);
        auto it = pending_.find(key);
        const uint64_t add = blob.data.size();
        const uint64_t replaced = it != pending_.end() ? it->second.blob.data.size() : 0;
        if (pending_bytes_ - replaced + add > cfg_.max_pending_bytes) {
            stats_.skipped++;
            return;
        }
        const bool reset = it != pending_.end() && (it->second.erase || it->second.reset);
        if (it != pending_.end()) stats_.coalesced++;
        pending_bytes_ = pending_bytes_ - replaced + add;
        pending_[key] = Job{std::move(blob), false, reset};
    }
    cv_.notify_one();
}

void KvJournal::erase(const std::string & key) {
    {
        std::lock_guard lk(mu_);
        auto it = pending_.find(key);
        if (it != pending_.end()) pending_bytes_ -= it->second.blob.data.size();
        pending_[key] = Job{{}, true};
    }
    cv_.notify_one();
}

bool KvJournal::contains(const std::string & key) const {
    std::lock_guard lk(mu_);
    auto it = pending_.find(key);
    if (it != pending_.end()) return !it->second.erase;
    auto k = known_.find(key);
    return k != known_.end() && !k->second.tokens.empty();
}

bool KvJournal::holds(const std::string & key, const Tokens & tokens) const {
    std::lock_guard lk(mu_);
    auto it = pending_.find(key);
    if (it != pending_.end()) return !it->second.erase && it->second.blob.tokens == tokens;
    if (writing_ == key) return writing_tokens_ == tokens;  // being written now
    auto k = known_.find(key);
    return k != known_.end() && k->second.tokens == tokens;
}

void KvJournal::forget_locked(std::map<std::string, Known>::iterator it) {
    stats_.disk_bytes -= std::min(stats_.disk_bytes, it->second.file_bytes);
    stats_.files--;
    known_.erase(it);
}

void KvJournal::evict_locked(const std::string & keep) {
    // Over the disk limit: the journals written longest ago go (those sessions re-prefill).
    while (stats_.disk_bytes > cfg_.disk_limit) {
        auto oldest = known_.end();
        for (auto it = known_.begin(); it != known_.end(); ++it) {
            if (it->first == keep || pending_.count(it->first)) continue;
            if (oldest == known_.end() || it->second.written < oldest->second.written) oldest = it;
        }
        if (oldest == known_.end()) return;
        std::error_code ec;
        fs::remove(path_for(oldest->first), ec);
        stats_.evicted++;
        forget_locked(oldest);
    }
}

std::optional<KvEntryInfo> KvJournal::info(const std::string & key) const {
    std::lock_guard lk(mu_);
    auto it = pending_.find(key);
    if (it != pending_.end() && it->second.erase) return std::nullopt;
    if (it != pending_.end() || writing_ == key) {  // on its way to disk
        KvEntryInfo e;
        e.tier = KvTier::Disk;
        e.n_tokens = it != pending_.end() ? it->second.blob.tokens.size() : writing_tokens_.size();
        e.raw_bytes = e.stored_bytes = it != pending_.end() ? it->second.blob.data.size() : writing_bytes_;
        if (e.n_tokens == 0) return std::nullopt;  // an erase
        return e;
    }
    auto k = known_.find(key);
    if (k == known_.end() || k->second.tokens.empty()) return std::nullopt;
    KvEntryInfo e;
    e.tier = KvTier::Disk;
    e.n_tokens = k->second.tokens.size();
    e.raw_bytes = k->second.live_bytes;
    e.stored_bytes = k->second.file_bytes;
    return e;
}

std::optional<KvBlob> KvJournal::load(const std::string & key, std::string & why) {
    {
        std::unique_lock lk(mu_);
        auto it = pending_.find(key);
        if (it != pending_.end()) {
            if (it->second.erase) {
                why = "not journaled";
                return std::nullopt;
            }
            stats_.loads++;
            return it->second.blob;
        }
        idle_cv_.wait(lk, [&] { return writing_ != key; });
        if (known_.find(key) == known_.end()) {
            why = "not journaled";
            return std::nullopt;
        }
    }
    std::string image;
    if (!read_whole_file(path_for(key), image)) {
        why = "journal file missing";
        return std::nullopt;
    }
    auto st = read_image(image, cfg_.fingerprint, key, why);
    std::lock_guard lk(mu_);
    if (st) stats_.loads++;
    return st;
}

std::optional<KvJournal::SendFile> KvJournal::open_for_send(const std::string & key, std::string & why, int wait_ms) {
    std::unique_lock lk(mu_);
    if (!idle_cv_.wait_for(lk, std::chrono::milliseconds(wait_ms),
                           [&] { return !pending_.count(key) && writing_ != key; })) {
        why = "its latest state is still being written";
        return std::nullopt;
    }
    auto it = known_.find(key);
    if (it == known_.end() || it->second.tokens.empty()) {
        why = "not journaled";
        return std::nullopt;
    }
    // Opened under the lock: the writer cannot be replacing the file in between.
    const int fd = ::open(path_for(key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        why = std::string("cannot open its journal: ") + std::strerror(errno);
        return std::nullopt;
    }
    return SendFile{fd, it->second.file_bytes, it->second.tokens.size()};
}

std::string KvJournal::incoming_path(const std::string & key) const {
    return path_for(key) + ".in.tmp";
}

namespace {
// A file mapped read-only: a received journal (gigabytes for a large model's long session) is
// checked from the page cache, never copied onto the heap whole.
class MappedFile {
  public:
    explicit MappedFile(const std::string & path) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return;
        struct stat st {};
        if (::fstat(fd, &st) == 0) {
            ok_ = true;
            if (st.st_size > 0) {
                void * p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
                if (p == MAP_FAILED) {
                    ok_ = false;
                } else {
                    data_ = static_cast<const char *>(p);
                    size_ = size_t(st.st_size);
                    ::madvise(p, size_, MADV_SEQUENTIAL);
                }
            }
        }
        ::close(fd);
    }
    ~MappedFile() {
        if (data_) ::munmap(const_cast<char *>(data_), size_);
    }
    MappedFile(const MappedFile &) = delete;
    MappedFile & operator=(const MappedFile &) = delete;
    bool ok() const { return ok_; }
    const char * data() const { return data_ ? data_ : ""; }
    size_t size() const { return size_; }

  private:
    const char * data_ = nullptr;
    size_t size_ = 0;
    bool ok_ = false;
};
}  // namespace

std::string KvJournal::install(const std::string & key, const std::string & file) {
    const MappedFile image(file);
    if (!image.ok()) return "cannot read the received journal";
    Cursor c{image.data(), image.size()};
    std::string fp, k;
    if (!read_header(c, fp, k)) return "not a KV journal";
    if (fp != cfg_.fingerprint) return "fingerprint differs (model, context or llama.cpp build)";
    if (k != key) return "the journal belongs to another session";
    Known known;
    const size_t end = fold_tokens(c, known.tokens, true);
    if (known.tokens.empty()) return "the journal holds no complete step";
    std::error_code ec;
    if (end < image.size()) {
        fs::resize_file(file, end, ec);
        if (ec) return "cannot cut the received journal: " + ec.message();
    }
    std::lock_guard lk(mu_);
    if (pending_.count(key) || writing_ == key) return "a newer state of the session is being written here";
    if (auto it = known_.find(key); it != known_.end()) forget_locked(it);
    fs::rename(file, path_for(key), ec);
    if (ec) return "cannot install the received journal: " + ec.message();
    known.file_bytes = end;
    known.live_bytes = end;
    known.written = ++tick_;
    stats_.disk_bytes += end;
    stats_.files++;
    known_[key] = std::move(known);
    evict_locked(key);
    return {};
}

void KvJournal::flush() {
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [&] { return pending_.empty() && writing_.empty(); });
}

KvJournalStats KvJournal::stats() const {
    std::lock_guard lk(mu_);
    return stats_;
}

void KvJournal::run() {
    std::unique_lock lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
        if (pending_.empty()) return;  // stopping, and everything is written
        auto node = pending_.extract(pending_.begin());
        Job job = std::move(node.mapped());
        const std::string key = std::move(node.key());
        pending_bytes_ -= job.blob.data.size();
        writing_ = key;
        writing_tokens_ = job.erase ? Tokens{} : job.blob.tokens;
        writing_bytes_ = job.blob.data.size();
        if (job.erase) {
            if (auto it = known_.find(key); it != known_.end()) forget_locked(it);
            lk.unlock();
            std::error_code ec;
            fs::remove(path_for(key), ec);
        } else {
            lk.unlock();
            write(key, job.blob, job.reset);
        }
        lk.lock();
        writing_.clear();
        writing_tokens_.clear();
        idle_cv_.notify_all();
    }
}

void KvJournal::write(const std::string & key, KvBlob & blob, bool reset) {
    Known k;
    if (!reset) {
        std::lock_guard lk(mu_);
        auto it = known_.find(key);
        if (it != known_.end()) k = it->second;
    }
    const std::string path = path_for(key);
    const size_t lcp = common_prefix(k.tokens, blob.tokens);
    if (lcp == blob.tokens.size() && lcp == k.tokens.size() && lcp > 0) return;  // nothing new

    std::string why;
    auto layout = SeqState::parse(blob.data.data(), blob.data.size(), why);
    const bool rewrite = lcp == 0 || !layout || k.file_bytes > 2 * std::max<uint64_t>(k.live_bytes, 1) + (1u << 20);
    std::string out;
    if (rewrite) {
        out = header(cfg_.fingerprint, key) + record(0, blob.tokens, blob.data);
    } else {
        Tokens add(blob.tokens.begin() + lcp, blob.tokens.end());
        std::vector<uint8_t> cells;
        if (!add.empty()) cells = layout->select(blob.data.data(), int32_t(lcp), INT_MAX);
        out = record(uint32_t(lcp), add, cells);
    }

    bool ok = false;
    if (rewrite) {
        const std::string tmp = path + ".tmp";
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0) {
            ok = write_all(fd, out) && (!cfg_.sync || ::fdatasync(fd) == 0);
            ok = ::close(fd) == 0 && ok;
            ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
            if (!ok) ::unlink(tmp.c_str());
        }
    } else {
        const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
        if (fd >= 0) {
            ok = write_all(fd, out) && (!cfg_.sync || ::fdatasync(fd) == 0);
            if (!ok && ::ftruncate(fd, off_t(k.file_bytes)) != 0) {
                // The file keeps a torn record; readers stop before it.
            }
            ok = ::close(fd) == 0 && ok;
        }
    }

    std::lock_guard lk(mu_);
    if (auto it = known_.find(key); it != known_.end()) forget_locked(it);
    if (!ok) {
        stats_.failed++;  // the next step starts the file afresh
        spdlog::warn("kv: could not write the KV journal of {}: {}", key, std::strerror(errno));
        return;
    }
    stats_.records++;
    stats_.bytes_written += out.size();
    Known & nk = known_[key];
    nk.tokens = std::move(blob.tokens);
    if (rewrite) {
        stats_.bases++;
        nk.file_bytes = out.size();
    } else {
        nk.file_bytes = k.file_bytes + out.size();
    }
    nk.live_bytes = blob.data.size();
    nk.written = ++tick_;
    stats_.disk_bytes += nk.file_bytes;
    stats_.files++;
    evict_locked(key);
}

}  // namespace armada::engine
