#pragma once

#include <string>

namespace armada::engine {

//! Checks a GGUF file's header before llama.cpp loads it: that gguf can parse it, and that the
//! values llama.cpp asserts on (rather than rejects) are in range, so a hostile or broken file is
//! an error message and never an abort. Returns the problem, or "" when the file may be loaded.
std::string check_gguf(const std::string & path);

}  // namespace armada::engine
