#include "engine/tool_grammar.h"

#include <regex>
#include <sstream>

namespace armada::engine {

std::string constrain_tool_grammar(const std::string & gbnf, bool required, bool parallel) {
    static const std::regex optional_until(R"(\s+until-\d+\?)");
    static const std::regex repeated_calls(R"(^tool-calls ::= \((.*)\)\+$)");
    static const std::regex exp_schema(R"(\(\[eE\] \[-\+\]\? integral-part\)\?)");
    static const std::regex exp_json(R"(\(\(\"e\" \| \"E\"\) \[\+-\]\? \[0-9\]\+\)\?)");
    static const std::regex int_json(R"(\[1-9\] \[0-9\]\*)");
    static const std::regex more_in_block(R"(\s*\(space "," space \([^()]*\)\)\*)");
    static const std::regex colon_space(R"re((^|[^\\])":" space)re");
    static const std::regex comma_space(R"re((^|[^\\])"," space)re");
    std::istringstream in(gbnf);
    std::string out, line;
    while (std::getline(in, line)) {
        if (required && line.rfind("root ::=", 0) == 0) line = std::regex_replace(line, optional_until, "");
        if (!parallel && line.rfind("tool-calls ::=", 0) == 0)
            line = std::regex_replace(line, repeated_calls, "tool-calls ::= $1");
        // One block may also hold a comma-separated run of calls; one call means one object.
        if (!parallel && line.rfind("tool-call ::=", 0) == 0) line = std::regex_replace(line, more_in_block, "");
        // JSON inside a call has one layout, the one chat templates render calls in (`tojson`,
        // like Python's json.dumps): `{"name": "f", "arguments": {"a": 1, "b": [1, 2]}}`. The
        // default (newlines and up to 20 blanks) lets a model spend its whole token budget on
        // indentation and end with a call cut in half; and with no choice of whitespace, every
        // fixed part of a call is text the grammar allows one way, which the engine feeds
        // without sampling (EngineConfig::jump_forward).
        if (line.rfind("space ::=", 0) == 0) line = "space ::= \"\"";
        line = std::regex_replace(line, colon_space, "$1\": \"");
        line = std::regex_replace(line, comma_space, "$1\", \"");
        // Numbers stay within what a double (and llama.cpp's JSON reader) holds: exponents of at
        // most two digits, integer parts of at most 16. 1e4660 is valid JSON that no one can read.
        line = std::regex_replace(line, exp_schema, "([eE] [-+]? [0-9]{1,2})?");
        line = std::regex_replace(line, exp_json, "((\"e\" | \"E\") [+-]? [0-9]{1,2})?");
        line = std::regex_replace(line, int_json, "[1-9] [0-9]{0,15}");
        out += line;
        out += '\n';
    }
    return out;
}

}  // namespace armada::engine
