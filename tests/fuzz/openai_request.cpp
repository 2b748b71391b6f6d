// Request bodies of /v1/chat/completions and the sampling fields of /v1/completions: any bytes
// become a request or an ApiError (400/413), never another exception.
#include "api/errors.h"
#include "api/json_util.h"
#include "api/openai_map.h"

#include <cstdlib>

using namespace armada::api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string body(reinterpret_cast<const char *>(data), size);
    RequestLimits lim;
    try {
        const json j = parse_request_body(body);
        try {
            parse_chat(j, 151936, lim);
        } catch (const ApiError &) {
        }
        try {
            parse_sampling(j, 151936, lim);
        } catch (const ApiError &) {
        }
    } catch (const ApiError &) {
    }
    return 0;
}
