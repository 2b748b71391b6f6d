#pragma once

// Relaying: a client's request forwarded to a node or a pool, and the answer (streamed when it
// streams) passed back. What a relay may do again elsewhere, and what it must not, is decided here:
// a request that reached a node and got no answer may have been acted on, so only a request with
// no side effect goes to another.
//
// Owns: relay targets, the headers passed through, the usage scan of replies, and the retries
// over nodes by load. It may include gateway/upstream.h (the HTTP client), the cluster view and
// the pool request scrubber; never the routes, the store or the quotas.

#include "api/http_server.h"
#include "gateway/cluster_view.h"
#include "routing/upstream.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace armada::gateway {

//! The last `"total_tokens":N` in a reply, fed in pieces as it streams (a piece may split it),
//! and how many events a stream held: what a request used, for the token quotas.
class UsageScan {
  public:
    void feed(std::string_view chunk);
    std::optional<int64_t> total() const { return total_; }
    int64_t events() const { return events_; }
    int status = 0;  // of the reply

  private:
    std::string tail_;
    std::optional<int64_t> total_;
    int64_t events_ = 0;
    bool newline_ = false;
};

//! Where `relay_to` sends a request, and how.
struct RelayTarget {
    std::string base;  // http://host:port
    routing::HeaderList headers;
    const std::string * body = nullptr;
    int timeout_ms = 600000;
    api::Headers extra;        // added to the reply the client gets
    bool may_resend = false;   // no side effect: sent and not answered, it may go elsewhere
    bool hold_errors = false;  // a 429 or 5xx answer is not passed on: the caller tries elsewhere
    int idle_ms = 0;           // a stream quiet for this long is cut (0: no limit)
    bool scrub = false;        // a pool's answer: cached-token counts and timings removed
};

//! How a relay went.
struct Relayed {
    bool delivered = false;  // the client has its answer (or its stream ended)
    int status = 0;          // what the upstream said (0: nothing)
    double head_s = 0;       // how long its head took
    bool client_gone = false;
    bool cut = false;  // a stream that ended with an error (the upstream went away mid-way)
    //! The request was written to the upstream: it is up and taking connections, even if it then
    //! said nothing (hung). Only one that could not be reached is forgotten.
    bool reached = false;
};

//! Forwards `req` to `t` and answers the client with what it said (streamed when it streams).
Relayed relay_to(const RelayTarget & t, const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                 UsageScan * usage = nullptr);

//! Relays to the cluster's nodes, as the cluster view names them.
class NodeRelay {
  public:
    explicit NodeRelay(ClusterView & view) : view_(view) {}
    //! Forwards to node `node_name` (see relay_to); not delivered when it could not be reached
    //! and nothing was sent to the client.
    Relayed relay(const std::string & node_name, const api::HttpRequest & req,
                  const std::shared_ptr<api::Responder> & out, UsageScan * usage = nullptr, int timeout_ms = 600000,
                  const api::Headers & extra = {});
    //! Forwards to `first`, else the node with the most room, then to another if it does not
    //! answer (three tries); 503 when none took it.
    void by_load(const api::HttpRequest & req, const std::shared_ptr<api::Responder> & out,
                 std::optional<std::string> first = std::nullopt, UsageScan * usage = nullptr,
                 const api::Headers & extra = {});

  private:
    ClusterView & view_;
};

}  // namespace armada::gateway
