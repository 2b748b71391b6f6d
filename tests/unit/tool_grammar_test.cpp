#include "engine/tool_grammar.h"

#include <gtest/gtest.h>

using armada::engine::constrain_tool_grammar;

namespace {
const std::string kQwen =
    "root ::= \"<|im_start|>assistant\\n\" space until-169? tool-calls\n"
    "tool-calls ::= (tool-call space)+\n"
    "until-169 ::= | [<] until-169\n";
}

TEST(ToolGrammar, RequiredDropsFreeTextBeforeCall) {
    const std::string r = constrain_tool_grammar(kQwen, true, true);
    EXPECT_NE(r.find("root ::= \"<|im_start|>assistant\\n\" space tool-calls\n"), std::string::npos) << r;
    EXPECT_NE(r.find("until-169 ::= | [<] until-169"), std::string::npos);  // other rules untouched
    EXPECT_NE(r.find("tool-calls ::= (tool-call space)+"), std::string::npos);
}

TEST(ToolGrammar, NotParallelAllowsOneCall) {
    const std::string r = constrain_tool_grammar(kQwen, false, false);
    EXPECT_NE(r.find("tool-calls ::= tool-call space\n"), std::string::npos) << r;
    EXPECT_NE(r.find("until-169? tool-calls"), std::string::npos);  // auto keeps the free text
}

TEST(ToolGrammar, NotParallelAllowsOneObjectPerBlock) {
    const std::string g =
        "root ::= tool-calls\n"
        "tool-call ::= \"<tool_call>\\n\" space (tool-a | tool-b) (space \",\" space (tool-a | tool-b))* "
        "space \"</tool_call>\"\n";
    EXPECT_NE(constrain_tool_grammar(g, true, false)
                  .find("tool-call ::= \"<tool_call>\\n\" space (tool-a | tool-b) space \"</tool_call>\"\n"),
              std::string::npos)
        << constrain_tool_grammar(g, true, false);
    EXPECT_NE(constrain_tool_grammar(g, true, true).find("(space \", \" (tool-a | tool-b))*"), std::string::npos);
}

TEST(ToolGrammar, CallJsonHasOneLayout) {
    const std::string g =
        "root ::= tool-calls\nspace ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\ntool-calls ::= \"x\"\n"
        "tool-a ::= \"{\" space \"\\\"name\\\"\" space \":\" space \"\\\"a\\\"\" space \",\" space args space \"}\"\n"
        "enum ::= (\"\\\":\\\"\" | \"\\\",\\\"\") space\n";
    const std::string r = constrain_tool_grammar(g, false, true);
    EXPECT_NE(r.find("space ::= \"\"\n"), std::string::npos) << r;
    EXPECT_EQ(r.find("{0,20}"), std::string::npos) << r;
    // ": " after a key and ", " between members, as tojson writes them.
    EXPECT_NE(
        r.find("tool-a ::= \"{\" space \"\\\"name\\\"\" space \": \" \"\\\"a\\\"\" space \", \" args space \"}\"\n"),
        std::string::npos)
        << r;
    // Quoted ":" and "," inside string values are not separators.
    EXPECT_NE(r.find("enum ::= (\"\\\":\\\"\" | \"\\\",\\\"\") space\n"), std::string::npos) << r;
}

TEST(ToolGrammar, NumbersFitADouble) {
    const std::string g =
        "root ::= tool-calls\n"
        "number ::= (\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space\n"
        "json-number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ((\"e\" | \"E\") [+-]? [0-9]+)?\n";
    const std::string r = constrain_tool_grammar(g, false, true);
    EXPECT_NE(r.find("([eE] [-+]? [0-9]{1,2})? space"), std::string::npos) << r;
    EXPECT_NE(r.find("[1-9] [0-9]{0,15}"), std::string::npos) << r;
    EXPECT_NE(r.find("((\"e\" | \"E\") [+-]? [0-9]{1,2})?"), std::string::npos) << r;
    EXPECT_EQ(r.find("[0-9]+)?\n"), std::string::npos) << r;
}

TEST(ToolGrammar, LeavesOtherGrammarsAlone) {
    const std::string g = "root ::= tool-calls\ntool-calls ::= \"x\"\n";
    EXPECT_EQ(constrain_tool_grammar(g, true, false), g);
}
