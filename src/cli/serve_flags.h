#pragma once

// The flags of `armada serve`, with their environment variables and defaults (main.cpp adds the
// observability flags every process shares).

#include "cli/serve.h"

namespace CLI {
class App;
}

namespace armada::cli {

void add_serve_flags(CLI::App * cmd, ServeOptions & o);

}  // namespace armada::cli
