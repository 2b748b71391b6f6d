#pragma once

#include <string_view>

namespace armada::api {

//! The OpenAPI 3.1 document of every route a node and a gateway answer (docs/openapi.json,
//! built into the binary), served at GET /openapi.json.
std::string_view openapi_document();

}  // namespace armada::api
