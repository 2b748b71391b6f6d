#pragma once

#include <string>

namespace armada::engine {

//! Tightens a tool-call grammar from llama.cpp's chat API.
//!
//! `required`: llama.cpp lets free text come before the first call even when a call is required
//! (`root ::= <prefix> space until-N? tool-calls`), so a model may talk until max_tokens and never
//! call. The optional free-text element is removed from the root rule, so the call starts at once.
//!
//! `!parallel`: the grammar still allows a run of calls (`tool-calls ::= (tool-call space)+`);
//! it is cut to exactly one.
//!
//! Always: the `space` rule (where JSON may have whitespace) allows at most one blank, so call
//! arguments are compact and a model cannot spend its budget on indentation.
//!
//! Grammars without those shapes come back unchanged.
std::string constrain_tool_grammar(const std::string & gbnf, bool required, bool parallel);

}  // namespace armada::engine
