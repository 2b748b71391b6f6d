#pragma once

// Server-Sent Events, both ways: `sse_event` writes one event, `SseReader` splits a byte stream
// back into events. Every SSE producer and consumer in Armada uses these two (the API's streams,
// the gateway's relays, pool steps, the MCP client, the benches and the operator CLI).

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace armada::net {

//! One Server-Sent Events message. `data` may hold line breaks (CR, LF or CRLF): each line
//! becomes its own `data:` field, so a reader joins them back with LF. Line breaks in `event`
//! and `id` would end the field early and are dropped. An empty `event` is a plain `message`;
//! an empty `id` sends none.
std::string sse_event(std::string_view event, std::string_view data, std::string_view id = {});

//! The lines of an event's data (its `data:` fields), for a reader that takes each alone.
std::vector<std::string_view> data_lines(std::string_view data);

//! One event as read.
struct SseEvent {
    std::string event;  // the `event` field; empty when the stream named none (a `message`)
    std::string data;   // the `data` fields joined with LF
    std::string id;     // this event's `id` field (empty when it had none)
    bool has_id = false;
    bool has_data = false;  // false only for a block `SseReader::Options::every_block` passes on
    std::string raw;        // the block's bytes as they came, through the blank line that ends it
    //! The event's type as the SSE standard names it: `message` when the stream named none.
    const std::string & type() const;
};

//! Splits an SSE byte stream into events, fed in chunks of any size. Lines end with CRLF, LF or
//! CR; a field's value loses one leading space; a line that starts with `:` is a comment. As the
//! standard says, a block is dispatched as an event when it held a `data` field (even an empty
//! one), and a block that ends with the stream is not, unless `finish` is called.
class SseReader {
  public:
    struct Options {
        //! Every block that ends at a blank line is passed on, comment-only, data-less and empty
        //! ones too (`has_data` false), so the `raw`s together are every byte read (less a
        //! leading BOM): for a relay that forwards them as they came.
        bool every_block = false;
        //! The most bytes an unfinished line or block may hold; past it the reader fails (`feed`
        //! returns false and `failed()` is true) instead of growing without end. Far above any
        //! event Armada sends (a tool's output is capped at 16 MiB before it is escaped).
        size_t max_block = size_t(256) << 20;
    };
    //! `fn` gets each event and returns false to stop reading.
    using Handler = std::function<bool(SseEvent &)>;

    SseReader() = default;
    explicit SseReader(Options opt) : opt_(opt) {}

    //! Returns false once `fn` asked to stop, or the reader failed; bytes after the event that
    //! stopped it stay buffered for the next call.
    bool feed(std::string_view bytes, const Handler & fn);
    //! The stream ended: a last block that was never closed by a blank line is dispatched as if
    //! it had been (for a body read whole, and an upstream that ended mid-event).
    bool finish(const Handler & fn);
    bool failed() const { return failed_; }
    //! Bytes shifted so far to drop what was passed on: what reading costs beyond one pass.
    size_t moved() const { return moved_; }

  private:
    bool scan(const Handler & fn);
    bool line(std::string_view text, size_t end, const Handler & fn);
    bool dispatch(size_t end, const Handler & fn);
    void compact();

    Options opt_;
    std::string buf_;     // bytes not yet dropped: passed-on blocks, the current block's lines, a partial line
    size_t block_ = 0;    // where the current block starts in `buf_` (before it: passed on)
    size_t scanned_ = 0;  // how far `buf_` is split into lines
    SseEvent cur_;        // the block being read
    bool failed_ = false;
    bool bom_checked_ = false;
    size_t moved_ = 0;
};

}  // namespace armada::net
