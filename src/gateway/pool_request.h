#pragma once

// What the gateway sends to a GPU pool for a client's chat or text completion, and what of the
// pool's answer reaches the client. A pool is another team's server shared by every tenant: the
// request is validated as a node would validate it and rebuilt from the fields Armada knows
// (vendor fields such as ignore_eos, id_slot or cache_prompt never pass), and the answer loses
// the figures that tell one tenant about another's prompts (cached tokens, timings).

#include "api/json_util.h"
#include "api/openai_map.h"
#include "net/sse.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace armada::gateway {

struct PoolRequestOptions {
    bool chat = true;             // /v1/chat/completions, else /v1/completions
    std::string model;            // the model name the upstream serves
    int64_t context = 0;          // tokens a request may hold there (0: not known)
    int32_t n_vocab = INT32_MAX;  // bounds token ids (logit_bias, a prompt of ids) when known
    std::string cache_salt;       // sent as `cache_salt` (vLLM) when not empty
    api::RequestLimits limits;    // a node's caps on n, stop and tools
};

//! The body to send upstream. Throws api::ApiError(400) for what a node would refuse, naming the
//! field. Fields a node does not know are dropped; llama.cpp's `n_probs` becomes OpenAI's
//! logprobs fields; `model` is the upstream's.
std::string pool_request_body(const api::json & body, const PoolRequestOptions & o);

//! A pool's whole JSON answer, with cached-token counts and timings removed; text that is not a
//! JSON object comes back unchanged.
std::string scrub_pool_json(std::string_view text);

//! One event's data: scrubbed whole when it is one JSON object, else line by line.
std::string scrub_event_data(const std::string & data);

//! The same for a stream of server-sent events, fed in pieces as they arrive: each whole event's
//! `data:` JSON is scrubbed; a partial event waits for its end.
class PoolStreamScrubber {
  public:
    //! What may go to the client now.
    std::string feed(std::string_view chunk);
    //! Whatever is left at the end of the stream.
    std::string flush();

  private:
    std::string rewrite(const net::SseEvent & ev);

    net::SseReader reader_{net::SseReader::Options{.every_block = true}};
};

}  // namespace armada::gateway
