#include "engine/kv_pool.h"

#include <build-info.h>
#include <spdlog/spdlog.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace armada::engine {

namespace fs = std::filesystem;

uint64_t fnv1a64(const void * data, size_t n, uint64_t h) {
    const auto * p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

namespace {
constexpr char kMagic[4] = {'A', 'R', 'K', 'V'};
constexpr uint32_t kVersion = 1;

uint64_t checksum64(const uint8_t * p, size_t n) {
    return kv_checksum64(p, n);
}
}  // namespace

bool read_whole_file(const std::string & path, std::string & out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    out = std::move(ss).str();
    return bool(f) || f.eof();
}

uint64_t kv_checksum64(const uint8_t * p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return fnv1a64(p + i, n - i, h);
}

namespace {

template <typename T>
void put_pod(std::string & out, T v) {
    out.append(reinterpret_cast<const char *>(&v), sizeof v);
}

void put_str(std::string & out, const std::string & s) {
    put_pod(out, uint32_t(s.size()));
    out += s;
}

//! Bounds-checked reader over a file image.
struct Reader {
    const std::string & s;
    size_t at = 0;
    bool ok = true;

    template <typename T>
    T pod() {
        T v{};
        if (!ok || s.size() - at < sizeof v) {
            ok = false;
            return v;
        }
        std::memcpy(&v, s.data() + at, sizeof v);
        at += sizeof v;
        return v;
    }
    std::string str(size_t max) {
        const auto n = pod<uint32_t>();
        if (!ok || n > max || s.size() - at < n) {
            ok = false;
            return {};
        }
        std::string r = s.substr(at, n);
        at += n;
        return r;
    }
};

bool read_file(const std::string & path, std::string & out) {
    return read_whole_file(path, out);
}

//! Reads just the header fields needed to index a file at start-up; `tokens` too when they fit
//! in the first 64 KiB (about 16,000 tokens), otherwise it stays empty.
bool read_header(const std::string & path, std::string & fingerprint, std::string & key, uint32_t & n_tokens,
                 Tokens & tokens) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::string head(64 * 1024, '\0');
    f.read(head.data(), std::streamsize(head.size()));
    head.resize(size_t(f.gcount()));
    Reader r{head};
    char magic[4];
    for (char & c : magic)
        c = r.pod<char>();
    if (!r.ok || std::memcmp(magic, kMagic, 4) != 0 || r.pod<uint32_t>() != kVersion) return false;
    fingerprint = r.str(4096);  // checked again when the file is loaded
    key = r.str(4096);
    n_tokens = r.pod<uint32_t>();
    if (!r.ok) return false;
    const uint64_t bytes = uint64_t(n_tokens) * sizeof(llama_token);
    if (bytes <= head.size() - r.at) {
        tokens.resize(n_tokens);
        if (n_tokens > 0) std::memcpy(tokens.data(), head.data() + r.at, bytes);
    } else if (n_tokens <= (1u << 24)) {
        // A long entry: its tokens go on past the window.
        tokens.resize(n_tokens);
        f.clear();
        f.seekg(std::streamoff(r.at));
        f.read(reinterpret_cast<char *>(tokens.data()), std::streamsize(bytes));
        if (f.gcount() != std::streamsize(bytes)) tokens.clear();
    }
    return true;
}
}  // namespace

KvPool::KvPool(KvPoolConfig cfg) : cfg_(std::move(cfg)) {}

KvPool::~KvPool() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

std::string KvPool::path_for(const std::string & key) const {
    char name[32];
    snprintf(name, sizeof name, "%016llx.kv", static_cast<unsigned long long>(fnv1a64(key.data(), key.size())));
    return (fs::path(cfg_.dir) / name).string();
}

std::string KvPool::open() {
    if (cfg_.dir.empty()) return {};
    std::error_code ec;
    fs::create_directories(cfg_.dir, ec);
    if (ec) return "cannot create the KV spill directory " + cfg_.dir + ": " + ec.message();
    std::lock_guard lk(mu_);
    for (const auto & de : fs::directory_iterator(cfg_.dir, ec)) {
        const auto & p = de.path();
        if (p.extension() == ".tmp") {
            fs::remove(p, ec);  // an interrupted write
            continue;
        }
        if (p.extension() != ".kv") continue;
        std::string fingerprint, key;
        uint32_t n = 0;
        Tokens tokens;
        if (!read_header(p.string(), fingerprint, key, n, tokens) || path_for(key) != p.string()) {
            spdlog::warn("kv: ignoring unreadable spill file {}", p.string());
            continue;
        }
        const auto found = cfg_.found ? cfg_.found(key, fingerprint, tokens) : KvPoolConfig::Found::Keep;
        if (found == KvPoolConfig::Found::Remove) {
            fs::remove(p, ec);
            ec.clear();
            continue;
        }
        Entry e;
        e.key = key;
        e.tier = KvTier::Disk;
        e.n_tokens = n;
        e.stored_bytes = uint64_t(de.file_size(ec));
        e.raw_bytes = e.stored_bytes;
        e.cold = true;
        e.cache = found == KvPoolConfig::Found::Cache;
        e.used = ++tick_;
        count_locked(e, 1);
        entries_[key] = std::move(e);
    }
    if (ec) return "cannot list " + cfg_.dir + ": " + ec.message();
    return {};
}

std::string KvPool::encode_file(const KvPoolConfig & cfg, const std::string & key, const KvBlob & blob,
                                bool & compressed) {
    std::string out;
    out.append(kMagic, 4);
    put_pod(out, kVersion);
    put_str(out, cfg.fingerprint);
    put_str(out, key);
    put_pod(out, uint32_t(blob.tokens.size()));
    out.append(reinterpret_cast<const char *>(blob.tokens.data()), blob.tokens.size() * sizeof(llama_token));
    const uint64_t raw = blob.data.size();
    put_pod(out, raw);
    put_pod(out, checksum64(blob.data.data(), blob.data.size()));
    // Compress only when it pays: random-looking KV barely shrinks and would cost CPU on restore.
    compressed = false;
    std::string z;
    if (cfg.zstd_level > 0 && raw > 0) {
        z.resize(ZSTD_compressBound(raw));
        const size_t n = ZSTD_compress(z.data(), z.size(), blob.data.data(), raw, cfg.zstd_level);
        if (!ZSTD_isError(n) && double(n) <= double(raw) * (1.0 - cfg.min_gain)) {
            z.resize(n);
            compressed = true;
        }
    }
    put_pod(out, uint8_t(compressed ? 1 : 0));
    if (compressed) {
        put_pod(out, uint64_t(z.size()));
        out += z;
    } else {
        put_pod(out, raw);
        out.append(reinterpret_cast<const char *>(blob.data.data()), raw);
    }
    return out;
}

std::optional<KvBlob> KvPool::decode_file(const std::string & image, const std::string & fingerprint,
                                          const std::string & key, std::string & why) {
    Reader r{image};
    char magic[4];
    for (char & c : magic)
        c = r.pod<char>();
    if (!r.ok || std::memcmp(magic, kMagic, 4) != 0) {
        why = "not a KV file";
        return std::nullopt;
    }
    if (r.pod<uint32_t>() != kVersion) {
        why = "KV file version differs";
        return std::nullopt;
    }
    const std::string fp = r.str(4096);
    if (!r.ok) {
        why = "truncated KV file";
        return std::nullopt;
    }
    if (fp != fingerprint) {
        why = "fingerprint differs (saved by another model, build or context setting)";
        return std::nullopt;
    }
    if (r.str(4096) != key || !r.ok) {
        why = "KV file belongs to another key";
        return std::nullopt;
    }
    KvBlob b;
    const auto n = r.pod<uint32_t>();
    if (!r.ok || uint64_t(n) * sizeof(llama_token) > image.size() - r.at) {
        why = "truncated KV file";
        return std::nullopt;
    }
    b.tokens.resize(n);
    if (n > 0) std::memcpy(b.tokens.data(), image.data() + r.at, n * sizeof(llama_token));
    r.at += n * sizeof(llama_token);
    const auto raw = r.pod<uint64_t>();
    const auto sum = r.pod<uint64_t>();
    const auto codec = r.pod<uint8_t>();
    const auto stored = r.pod<uint64_t>();
    if (!r.ok || stored != image.size() - r.at || codec > 1 || (codec == 0 && stored != raw) ||
        raw > (uint64_t(1) << 40)) {
        why = "truncated or malformed KV file";
        return std::nullopt;
    }
    // A compressed payload must say its own size, and KV never shrinks 64-fold: a header that
    // claims more is refused before anything is allocated for it.
    if (codec == 1 &&
        (ZSTD_getFrameContentSize(image.data() + r.at, stored) != raw || raw > stored * 64 + (1u << 20))) {
        why = "malformed compressed KV file";
        return std::nullopt;
    }
    b.data.resize(raw);
    if (codec == 1) {
        const size_t got = ZSTD_decompress(b.data.data(), raw, image.data() + r.at, stored);
        if (ZSTD_isError(got) || got != raw) {
            why = "KV file does not decompress";
            return std::nullopt;
        }
    } else if (raw > 0) {
        std::memcpy(b.data.data(), image.data() + r.at, raw);
    }
    if (checksum64(b.data.data(), b.data.size()) != sum) {
        why = "KV file checksum mismatch";
        return std::nullopt;
    }
    return b;
}

void KvPool::put(const std::string & key, KvBlob blob, bool cold, bool cache) {
    std::unique_lock lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) remove_locked(it);
    Entry e;
    e.key = key;
    e.tier = KvTier::Ram;
    e.n_tokens = blob.tokens.size();
    e.raw_bytes = blob.data.size();
    e.stored_bytes = e.raw_bytes + e.n_tokens * sizeof(llama_token);
    e.cold = cold;
    e.cache = cache;
    e.used = ++tick_;
    e.gen = e.used;
    e.blob = std::make_shared<KvBlob>(std::move(blob));
    count_locked(e, 1);
    entries_[key] = std::move(e);
    enforce_locked();
    // The writer is behind: wait for it rather than let RAM stay over the limit.
    done_cv_.wait(lk, [&] { return stats_.ram_bytes <= cfg_.ram_limit || stats_.writing_entries == 0 || stop_; });
}

std::optional<KvBlob> KvPool::get(const std::string & key, bool keep, KvTier & from, std::string & why) {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
        why = "not parked";
        return std::nullopt;
    }
    Entry & e = it->second;
    from = e.tier;
    e.used = ++tick_;
    if (e.tier == KvTier::Ram) {
        if (keep) return *e.blob;
        // While the writer holds the blob too, it gets a copy; otherwise the blob moves out.
        KvBlob b = e.blob.use_count() == 1 ? std::move(*e.blob) : *e.blob;
        remove_locked(it);
        return b;
    }
    std::string image;
    std::optional<KvBlob> b;
    if (!read_file(path_for(key), image)) {
        why = "KV file unreadable";
    } else {
        b = decode_file(image, cfg_.fingerprint, key, why);
    }
    if (!b) {
        stats_.rejected++;
        drop_locked(it);  // never try a bad file twice
        return std::nullopt;
    }
    if (!keep) remove_locked(it);
    return b;
}

bool KvPool::contains(const std::string & key) const {
    std::lock_guard lk(mu_);
    return entries_.count(key) > 0;
}

void KvPool::erase(const std::string & key) {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) remove_locked(it);
}

void KvPool::set_cold(const std::string & key, bool cold) {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) it->second.cold = cold;
}

void KvPool::set_ram_limit(uint64_t high, uint64_t low) {
    std::lock_guard lk(mu_);
    cfg_.ram_limit = high;
    cfg_.ram_low = std::min(low, high);
    enforce_locked();
}

bool KvPool::pressured() const {
    std::lock_guard lk(mu_);
    auto * self = const_cast<KvPool *>(this);
    // Prompt-cache entries on disk make way by themselves: only sessions' KV counts here.
    const uint64_t disk = stats_.disk_bytes - stats_.cache_disk_bytes;
    if (!cfg_.dir.empty() && disk > cfg_.disk_limit / 10 * 9) self->pressured_ = true;
    if (pressured_ && stats_.ram_bytes - stats_.cache_ram_bytes <= cfg_.ram_low && disk <= cfg_.disk_limit / 4 * 3 &&
        cfg_.now() - last_drop_ >= std::chrono::milliseconds(cfg_.pressure_hold_ms)) {
        self->pressured_ = false;
    }
    return pressured_;
}

size_t KvPool::spill_all() {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return (queue_.empty() && !busy_) || stop_; });
    size_t n = 0;
    for (auto & [k, e] : entries_) {
        if (e.tier != KvTier::Ram || e.cache) continue;
        // Saved when the journal has it, or once written to disk.
        if ((cfg_.durable && cfg_.durable(k, e.blob->tokens)) || spill_locked(e)) ++n;
    }
    return n;
}

void KvPool::flush() {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return (queue_.empty() && !busy_) || stop_; });
}

void KvPool::count_locked(const Entry & e, int sign) {
    const uint64_t bytes = e.stored_bytes;
    auto add = [sign](auto & v, uint64_t n) { v = sign > 0 ? v + n : v - n; };
    if (e.tier == KvTier::Ram) {
        add(stats_.ram_bytes, bytes);
        add(stats_.ram_entries, 1);
        if (e.cache) add(stats_.cache_ram_bytes, bytes), add(stats_.cache_ram_entries, 1);
    } else {
        add(stats_.disk_bytes, bytes);
        add(stats_.disk_entries, 1);
        if (e.cache) add(stats_.cache_disk_bytes, bytes), add(stats_.cache_disk_entries, 1);
    }
}

void KvPool::remove_locked(std::map<std::string, Entry>::iterator it) {
    Entry & e = it->second;
    count_locked(e, -1);
    if (e.writing) {  // the writer finds it gone and discards its file
        stats_.writing_entries--;
        stats_.writing_bytes -= e.stored_bytes;
    }
    if (e.tier == KvTier::Disk) {
        std::error_code ec;
        fs::remove(path_for(e.key), ec);
    }
    entries_.erase(it);
}

void KvPool::drop_locked(std::map<std::string, Entry>::iterator it) {
    const std::string key = it->first;
    remove_locked(it);
    if (cfg_.dropped) cfg_.dropped(key);
}

bool KvPool::write_file(const std::string & key, const std::string & image) const {
    const std::string tmp = path_for(key) + ".tmp";
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(image.data(), std::streamsize(image.size()));
    f.close();
    if (!f) {
        spdlog::warn("kv: cannot write {}", tmp);
        std::error_code ec;
        fs::remove(tmp, ec);
        return false;
    }
    return true;
}

bool KvPool::spill_locked(Entry & e) {
    if (cfg_.dir.empty()) return false;
    bool compressed = false;
    const std::string image = encode_file(cfg_, e.key, *e.blob, compressed);
    const std::string path = path_for(e.key);
    if (!write_file(e.key, image)) return false;
    std::error_code ec;
    fs::rename(path + ".tmp", path, ec);
    if (ec) return false;
    count_locked(e, -1);
    e.tier = KvTier::Disk;
    e.blob = {};
    e.stored_bytes = image.size();
    count_locked(e, 1);
    stats_.spilled++;
    (compressed ? stats_.compressed : stats_.stored_raw)++;
    return true;
}

void KvPool::enforce_locked() {
    // To spill: cold sessions first (not back soon), then prompt-cache entries, then the least
    // recently used session. To drop: prompt-cache entries first, since losing one costs a
    // prefill and losing a session's KV turns new sessions away.
    auto victims = [&](KvTier tier, bool dropping) {
        std::vector<Entry *> v;
        for (auto & [k, e] : entries_) {
            if (e.tier == tier) v.push_back(&e);
        }
        auto rank = [dropping](const Entry * e) {
            if (e->cache) return dropping ? 0 : 1;
            return e->cold ? (dropping ? 1 : 0) : 2;
        };
        std::sort(v.begin(), v.end(), [&](const Entry * a, const Entry * b) {
            if (rank(a) != rank(b)) return rank(a) < rank(b);
            return a->used < b->used;
        });
        return v;
    };
    // RAM the writer is about to free counts as freed: it is not chosen twice.
    auto ram = [&] { return stats_.ram_bytes - stats_.writing_bytes; };
    if (ram() > cfg_.ram_limit) {
        for (Entry * e : victims(KvTier::Ram, cfg_.dir.empty())) {
            if (ram() <= cfg_.ram_low) break;
            if (e->writing) continue;
            if (cfg_.durable && cfg_.durable(e->key, e->blob->tokens)) {
                stats_.released++;
                remove_locked(entries_.find(e->key));
                continue;
            }
            if (!cfg_.dir.empty() && cfg_.background_writes) {
                queue_write_locked(*e);
                continue;
            }
            // No disk tier, or it failed: the entry is dropped and the session re-prefills.
            if (!spill_locked(*e)) evict_locked(*e);
        }
    }
    if (stats_.disk_bytes > cfg_.disk_limit) {
        for (Entry * e : victims(KvTier::Disk, true)) {
            if (stats_.disk_bytes <= cfg_.disk_limit / 4 * 3) break;
            evict_locked(*e);
        }
    }
}

void KvPool::evict_locked(Entry & e) {
    // Losing a prompt-cache entry costs one prefill later; losing a session's KV is what
    // pressure (new sessions wait) is about.
    if (e.cache) {
        stats_.cache_evicted++;
    } else {
        stats_.dropped++;
        pressured_ = true;
        last_drop_ = cfg_.now();
    }
    drop_locked(entries_.find(e.key));
}

void KvPool::queue_write_locked(Entry & e) {
    e.writing = true;
    stats_.writing_entries++;
    stats_.writing_bytes += e.stored_bytes;
    queue_.push_back({e.key, e.gen});
    if (!thread_.joinable()) thread_ = std::thread([this] { writer(); });
    work_cv_.notify_one();
}

void KvPool::writer() {
    std::unique_lock lk(mu_);
    for (;;) {
        work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) break;
        const WriteJob job = queue_.front();
        queue_.pop_front();
        auto it = entries_.find(job.key);
        if (it == entries_.end() || it->second.gen != job.gen || !it->second.writing) continue;
        const std::shared_ptr<KvBlob> blob = it->second.blob;
        busy_ = true;
        lk.unlock();
        if (cfg_.before_write) cfg_.before_write(job.key);
        bool compressed = false;
        const std::string image = encode_file(cfg_, job.key, *blob, compressed);
        const bool wrote = write_file(job.key, image);
        lk.lock();
        busy_ = false;
        const std::string path = path_for(job.key);
        std::error_code ec;
        it = entries_.find(job.key);
        if (it == entries_.end() || it->second.gen != job.gen || !it->second.writing) {
            // Taken back, erased or replaced while it was written: the file is stale.
            if (wrote) fs::remove(path + ".tmp", ec);
        } else {
            Entry & e = it->second;
            e.writing = false;
            stats_.writing_entries--;
            stats_.writing_bytes -= e.stored_bytes;
            if (wrote) fs::rename(path + ".tmp", path, ec);
            if (!wrote || ec) {
                if (wrote) fs::remove(path + ".tmp", ec);
                spdlog::warn("kv: cannot spill {}; its KV is dropped", job.key);
                evict_locked(e);
            } else {
                count_locked(e, -1);
                e.tier = KvTier::Disk;
                e.blob.reset();
                e.stored_bytes = image.size();
                count_locked(e, 1);
                stats_.spilled++;
                (compressed ? stats_.compressed : stats_.stored_raw)++;
            }
            enforce_locked();
        }
        done_cv_.notify_all();
    }
    done_cv_.notify_all();
}

std::optional<KvEntryInfo> KvPool::info(const std::string & key) const {
    std::lock_guard lk(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    return KvEntryInfo{it->second.tier, it->second.n_tokens, it->second.raw_bytes, it->second.stored_bytes};
}

KvPoolStats KvPool::stats() const {
    std::lock_guard lk(mu_);
    return stats_;
}

std::string kv_fingerprint(const Model & model, int32_t n_ctx_seq, bool kv_unified, const std::string & extra) {
    // Sampled content hash: 32 chunks of 64 KiB spread over the file, plus its size. Reading a
    // whole 4–15 GB file at every start would cost more than the KV it protects.
    uint64_t h = 0xcbf29ce484222325ull;
    std::error_code ec;
    const uint64_t size = fs::file_size(model.path(), ec);
    h = fnv1a64(&size, sizeof size, h);
    std::ifstream f(model.path(), std::ios::binary);
    std::string buf(64 * 1024, '\0');
    for (int i = 0; i < 32 && f && size > 0; ++i) {
        const uint64_t at = size <= buf.size() ? 0 : (size - buf.size()) / 31 * uint64_t(i);
        f.seekg(std::streamoff(at));
        f.read(buf.data(), std::streamsize(buf.size()));
        h = checksum64(reinterpret_cast<const uint8_t *>(buf.data()), size_t(f.gcount())) ^ (h * 31);
        f.clear();
    }
    char desc[256] = {};
    llama_model_desc(model.get(), desc, sizeof desc);
    char hex[24];
    snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    std::string fp = std::string("model=") + hex + ";desc=" + desc + ";n_ctx_seq=" + std::to_string(n_ctx_seq) +
                     ";kv=f16" + (kv_unified ? ";unified" : "") + ";llama=" + llama_build_info();
    if (!extra.empty()) fp += ";" + extra;
    return fp;
}

}  // namespace armada::engine
