#include "engine/text_stream.h"
#include "text/utf8.h"

#include <gtest/gtest.h>

using armada::engine::TextStream;
using armada::text::utf8_incomplete_tail;
using armada::text::utf8_sanitize;

TEST(Utf8, IncompleteTail) {
    EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("a\xE4"), 1u);          // first byte of a 3-byte char
    EXPECT_EQ(utf8_incomplete_tail("a\xE4\xBD"), 2u);      // two of three
    EXPECT_EQ(utf8_incomplete_tail("a\xE4\xBD\xA0"), 0u);  // complete
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
}

TEST(Utf8, SanitizeReplacesInvalidBytes) {
    EXPECT_EQ(utf8_sanitize("ok"), "ok");
    EXPECT_EQ(utf8_sanitize("a\xFF"
                            "b"),
              "a\xEF\xBF\xBD"
              "b");
    EXPECT_EQ(utf8_sanitize("\xE4\xBD"), "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(TextStream, HoldsBackSplitCharacter) {
    TextStream ts;
    EXPECT_EQ(ts.push("x\xE4"), "x");
    EXPECT_EQ(ts.push("\xBD"), "");
    EXPECT_EQ(ts.push("\xA0!"), "\xE4\xBD\xA0!");
}

TEST(TextStream, CutMidCharacterAtEndNeverBreaksUtf8) {
    TextStream ts;
    EXPECT_EQ(ts.push("ab\xE4\xBD"), "ab");
    EXPECT_EQ(ts.finish(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TextStream, StopStringAcrossPieces) {
    TextStream ts({"STOP"});
    EXPECT_EQ(ts.push("hello ST"), "hello ");
    EXPECT_FALSE(ts.stopped());
    EXPECT_EQ(ts.push("OP and more"), "");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(ts.finish(), "");
}

TEST(TextStream, FalseStopPrefixIsReleased) {
    TextStream ts({"STOP"});
    EXPECT_EQ(ts.push("ST"), "");
    EXPECT_EQ(ts.push("ATE"), "STATE");
    EXPECT_EQ(ts.finish(), "");
}

TEST(TextStream, EarliestOfSeveralStops) {
    TextStream ts({"b", "xyz"});
    EXPECT_EQ(ts.push("a xyz b"), "a ");
    EXPECT_TRUE(ts.stopped());
}

TEST(TextStream, EmptyStopIgnored) {
    TextStream ts({""});
    EXPECT_EQ(ts.push("abc"), "abc");
    EXPECT_FALSE(ts.stopped());
}
