#pragma once

// A map from strings to values for the brains' hot views (a cell brain holds tens of thousands of
// open sessions and looks each one up at every reconcile). Entries live in one vector; an
// open-addressing table of (hash fragment, index) pairs finds them, so a lookup reads one slot
// and, when the fragment matches, one entry, where a node-based std::unordered_map chases
// pointers through scattered nodes. Erasing moves the last entry into the hole: iteration order is
// not insertion order, and references to entries are good only until the next insert or erase.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace armada::cluster {

template <class V>
class StringMap {
  public:
    using Entry = std::pair<std::string, V>;

    size_t size() const { return items_.size(); }
    bool empty() const { return items_.empty(); }
    auto begin() { return items_.begin(); }
    auto end() { return items_.end(); }
    auto begin() const { return items_.begin(); }
    auto end() const { return items_.end(); }
    //! The i-th entry (0 <= i < size()), for loops that erase as they go.
    Entry & at(size_t i) { return items_[i]; }

    V * find(const std::string & key) {
        const size_t i = locate(key, hash_of(key));
        return i == kNone ? nullptr : &items_[i].second;
    }
    const V * find(const std::string & key) const { return const_cast<StringMap *>(this)->find(key); }

    //! The value for `key`, default-made if it was not there; true when it was made.
    std::pair<V *, bool> try_emplace(const std::string & key) {
        const uint64_t h = hash_of(key);
        if (const size_t i = locate(key, h); i != kNone) return {&items_[i].second, false};
        if ((items_.size() + 1) * 2 > slots_.size()) grow();
        items_.emplace_back(key, V{});
        hashes_.push_back(h);
        place(h, items_.size() - 1);
        return {&items_.back().second, true};
    }

    //! Removes `key`; false when it was not there.
    bool erase(const std::string & key) {
        const size_t i = locate(key, hash_of(key));
        if (i == kNone) return false;
        erase_at(i);
        return true;
    }

    //! Removes the i-th entry; the last one takes its place.
    void erase_at(size_t i) {
        unslot(slot_of(hashes_[i], i));
        const size_t last = items_.size() - 1;
        if (i != last) {
            slots_[slot_of(hashes_[last], last)] = pack(hashes_[last], i);
            items_[i] = std::move(items_[last]);
            hashes_[i] = hashes_[last];
        }
        items_.pop_back();
        hashes_.pop_back();
    }

  private:
    static constexpr size_t kNone = ~size_t(0);
    // A slot: the hash's top 32 bits, then the entry's index + 1 (0: empty).
    static uint64_t pack(uint64_t h, size_t i) { return (h & 0xffffffff00000000ull) | uint64_t(i + 1); }
    static size_t index_in(uint64_t slot) { return size_t(slot & 0xffffffffull) - 1; }
    static uint64_t hash_of(const std::string & key) {
        // Mixed so that the low bits (the home slot) and the high ones (the fragment) both vary.
        uint64_t h = std::hash<std::string>{}(key);
        h ^= h >> 33;
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
        return h;
    }
    size_t mask() const { return slots_.size() - 1; }

    size_t locate(const std::string & key, uint64_t h) const {
        if (slots_.empty()) return kNone;
        const uint64_t frag = h & 0xffffffff00000000ull;
        for (size_t p = h & mask();; p = (p + 1) & mask()) {
            const uint64_t s = slots_[p];
            if (s == 0) return kNone;
            if ((s & 0xffffffff00000000ull) == frag) {
                const size_t i = index_in(s);
                if (items_[i].first == key) return i;
            }
        }
    }
    //! The slot that holds entry i (it must be there).
    size_t slot_of(uint64_t h, size_t i) const {
        const uint64_t want = pack(h, i);
        size_t p = h & mask();
        while (slots_[p] != want)
            p = (p + 1) & mask();
        return p;
    }
    void place(uint64_t h, size_t i) {
        size_t p = h & mask();
        while (slots_[p] != 0)
            p = (p + 1) & mask();
        slots_[p] = pack(h, i);
    }
    //! Empties slot p and shifts back the run after it, so that no lookup stops early.
    void unslot(size_t p) {
        slots_[p] = 0;
        for (size_t q = (p + 1) & mask(); slots_[q] != 0; q = (q + 1) & mask()) {
            const size_t home = hashes_[index_in(slots_[q])] & mask();
            // The entry at q may move to the hole at p unless its home lies cyclically in (p, q].
            const bool stays = p <= q ? (home > p && home <= q) : (home > p || home <= q);
            if (stays) continue;
            slots_[p] = slots_[q];
            slots_[q] = 0;
            p = q;
        }
    }
    void grow() {
        slots_.assign(slots_.empty() ? 16 : slots_.size() * 2, 0);
        for (size_t i = 0; i < items_.size(); ++i)
            place(hashes_[i], i);
    }

    std::vector<Entry> items_;
    std::vector<uint64_t> hashes_;  // items_[i]'s hash
    std::vector<uint64_t> slots_;   // a power of two long, at most half full
};

}  // namespace armada::cluster
