#include "net/sse.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using armada::net::sse_event;
using armada::net::SseEvent;
using armada::net::SseReader;

namespace {

// Feeds `wire` one byte at a time (the hardest split), then ends the stream if `finish`.
std::vector<SseEvent> read_all(const std::string & wire, SseReader::Options opt = {}, bool finish = false) {
    std::vector<SseEvent> out;
    SseReader r(opt);
    const SseReader::Handler keep = [&](SseEvent & ev) {
        out.push_back(ev);
        return true;
    };
    for (char c : wire)
        r.feed(std::string_view(&c, 1), keep);
    if (finish) r.finish(keep);
    return out;
}

}  // namespace

TEST(Sse, ReadsWhatTheWriterWrites) {
    const std::string wire = sse_event("state", "line one\r\nline two\rthree", "12.3") + sse_event("", "[DONE]");
    const auto evs = read_all(wire);
    ASSERT_EQ(evs.size(), 2u);
    EXPECT_EQ(evs[0].type(), "state");
    EXPECT_EQ(evs[0].data, "line one\nline two\nthree");
    EXPECT_TRUE(evs[0].has_id);
    EXPECT_EQ(evs[0].id, "12.3");
    EXPECT_EQ(evs[1].type(), "message");
    EXPECT_EQ(evs[1].event, "");
    EXPECT_EQ(evs[1].data, "[DONE]");
    EXPECT_FALSE(evs[1].has_id);
    EXPECT_EQ(evs[0].raw + evs[1].raw, wire);
}

TEST(Sse, WriterDropsLineBreaksFromNameAndId) {
    EXPECT_EQ(sse_event("a\nb", "x", "1\r2"), "id: 12\nevent: ab\ndata: x\n\n");
}

TEST(Sse, EveryLineEndingAndTheStandardsFieldRules) {
    // CR, LF and CRLF; a comment; a field with no colon; no space after the colon; an unknown
    // field; an id holding NUL is ignored; a CR split from its LF between two chunks.
    const std::string wire = std::string("\xEF\xBB\xBF") + ": hi\r\ndata\rdata:x\nfoo: bar\r\n" + "id: a" +
                             std::string(1, '\0') + "b\r\n\r\nevent:  spaced\ndata: y\n\n";
    const auto evs = read_all(wire);
    ASSERT_EQ(evs.size(), 2u);
    EXPECT_EQ(evs[0].data, "\nx");
    EXPECT_FALSE(evs[0].has_id);
    EXPECT_EQ(evs[1].event, " spaced");  // only one space goes
    EXPECT_EQ(evs[1].data, "y");
}

TEST(Sse, ABlockWithoutDataIsNoEventUnlessEveryBlockIsAsked) {
    const std::string wire = ": keep-alive\n\nevent: x\nid: 4\n\n\ndata: z\n\n";
    const auto events = read_all(wire);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].data, "z");
    const auto blocks = read_all(wire, {.every_block = true});
    ASSERT_EQ(blocks.size(), 4u);
    std::string joined;
    for (const auto & b : blocks)
        joined += b.raw;
    EXPECT_EQ(joined, wire);  // a relay forwarding `raw` sends every byte it read
    EXPECT_FALSE(blocks[1].has_data);
    EXPECT_EQ(blocks[1].id, "4");
    EXPECT_EQ(blocks[2].raw, "\n");
}

TEST(Sse, TheLastBlockCountsOnlyWhenTheStreamIsFinished) {
    const std::string wire = "data: a\n\ndata: {\"b\":1}";
    EXPECT_EQ(read_all(wire).size(), 1u);
    const auto evs = read_all(wire, {}, true);
    ASSERT_EQ(evs.size(), 2u);
    EXPECT_EQ(evs[1].data, "{\"b\":1}");
    // A lone CR at the very end ends the last line.
    const auto cr = read_all("data: c\r", {}, true);
    ASSERT_EQ(cr.size(), 1u);
    EXPECT_EQ(cr[0].data, "c");
}

TEST(Sse, StoppingKeepsTheRestForTheNextFeed) {
    SseReader r;
    std::vector<std::string> got;
    const SseReader::Handler first_only = [&](SseEvent & ev) {
        got.push_back(ev.data);
        return false;
    };
    EXPECT_FALSE(r.feed("data: 1\n\ndata: 2\n\n", first_only));
    ASSERT_EQ(got.size(), 1u);
    EXPECT_FALSE(r.feed("", first_only));
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[1], "2");
}

TEST(Sse, AnEndlessLineFailsInsteadOfGrowing) {
    SseReader r({.max_block = 64});
    const SseReader::Handler none = [](SseEvent &) { return true; };
    EXPECT_TRUE(r.feed(std::string(60, 'a'), none));
    EXPECT_FALSE(r.feed(std::string(10, 'a'), none));
    EXPECT_TRUE(r.failed());
    EXPECT_FALSE(r.feed("\n\ndata: x\n\n", none));  // a failed reader stays failed
}

TEST(Sse, ABodyOfManyEmptyBlocksIsReadInOnePass) {
    // A megabyte of blank lines, then one event, in one call: each blank line used to cost a move
    // of everything after it (half a terabyte in all here).
    const std::string wire = std::string(size_t(1) << 20, '\n') + "data: last\n\n";
    SseReader r;
    int n = 0;
    std::string got;
    const SseReader::Handler keep = [&](SseEvent & ev) {
        ++n;
        got = ev.data;
        return true;
    };
    EXPECT_TRUE(r.feed(wire, keep));
    EXPECT_EQ(n, 1);
    EXPECT_EQ(got, "last");
    EXPECT_LE(r.moved(), wire.size());
    // Fed in pieces, each piece's leftover moves once.
    SseReader pieces;
    for (size_t at = 0; at < wire.size(); at += 4096)
        pieces.feed(std::string_view(wire).substr(at, 4096), keep);
    EXPECT_EQ(n, 2);
    EXPECT_LE(pieces.moved(), wire.size());
}
