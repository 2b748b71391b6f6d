#include "engine/tool_grammar.h"

#include <regex>
#include <sstream>

namespace armada::engine {

std::string constrain_tool_grammar(const std::string & gbnf, bool required, bool parallel) {
    static const std::regex optional_until(R"(\s+until-\d+\?)");
    static const std::regex repeated_calls(R"(^tool-calls ::= \((.*)\)\+$)");
    std::istringstream in(gbnf);
    std::string out, line;
    while (std::getline(in, line)) {
        if (required && line.rfind("root ::=", 0) == 0) line = std::regex_replace(line, optional_until, "");
        if (!parallel && line.rfind("tool-calls ::=", 0) == 0)
            line = std::regex_replace(line, repeated_calls, "tool-calls ::= $1");
        out += line;
        out += '\n';
    }
    return out;
}

}  // namespace armada::engine
