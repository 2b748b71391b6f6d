// The gateway's handling of a client request, against a stand-in node that parses and records
// every request reaching it. Input: method, path, query, headers and body, separated by 0x1e
// (headers as name 0x1f value, one per 0x1e field, then an empty field before the body), so
// every field may hold any byte, CR and LF included.
//
// What must hold for every input:
// - a request the checks pass goes to the node as exactly one request, whose target is the
//   client's and whose headers are the ones the gateway set (host and content-length aside);
// - a request the checks refuse never reaches the node;
// - the raw fields sent to `forward` unchecked (a last guard) make at most one request;
// - every answer is the node's answer to this request ("req-N" of the request it recorded),
//   never one left on a reused connection.
#include "fuzz/standin_node.h"
#include "gateway/checks.h"
#include "routing/upstream.h"

#include <strings.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

namespace {

armada::testing::StandinNode & node() {
    static auto * n = new armada::testing::StandinNode();  // lives for the process
    return *n;
}

std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> out;
    size_t i = 0;
    for (;;) {
        const size_t j = s.find(sep, i);
        out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
        if (j == std::string::npos) break;
        i = j + 1;
    }
    return out;
}

//! Sends and checks one request; `expect_one` says whether it must arrive.
void send_and_check(const std::string & method, const std::string & target, const armada::routing::HeaderList & h,
                    const std::string & body, bool must_arrive) {
    auto & n = node();
    const size_t before = n.count();
    const auto r = armada::routing::forward(n.base(), method, target, h, body, 3000);
    // The stand-in records a request before it answers: once the answer is in, so is the record.
    const size_t after = n.count();
    if (after > before + 1) std::abort();  // one request to the gateway became two at the node
    if (must_arrive && !r.invalid && after != before + 1 && r.status != 0) std::abort();
    if (r.invalid && after != before) std::abort();  // refused, yet something was written
    if (after == before + 1 && r.status != 0) {
        const auto seen = n.seen().back();
        // The answer is to this request, not one left on a kept connection.
        if (r.body != "req-" + std::to_string(seen.serial)) std::abort();
        if (seen.target != target) std::abort();
        std::set<std::string> sent;
        for (const auto & [k, v] : h) {
            std::string l = k;
            for (auto & c : l)
                c = char(std::tolower(static_cast<unsigned char>(c)));
            sent.insert(l);
        }
        for (const auto & [k, v] : seen.headers) {
            std::string l = k;
            for (auto & c : l)
                c = char(std::tolower(static_cast<unsigned char>(c)));
            if (l == "host" || l == "content-length") continue;
            if (!sent.count(l)) std::abort();  // a header the gateway did not set
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size > 64 * 1024) return 0;
    const std::string text(reinterpret_cast<const char *>(data), size);
    const auto fields = split(text, '\x1e');
    armada::api::HttpRequest req;
    req.method = fields.size() > 0 ? fields[0] : "GET";
    req.path = fields.size() > 1 ? fields[1] : "/";
    req.query = fields.size() > 2 ? fields[2] : "";
    size_t i = 3;
    armada::routing::HeaderList raw_headers;
    for (; i < fields.size() && !fields[i].empty(); ++i) {
        const auto kv = split(fields[i], '\x1f');
        std::string k = kv[0], v = kv.size() > 1 ? kv[1] : "";
        raw_headers.emplace_back(k, v);
        for (auto & c : k)
            c = char(std::tolower(static_cast<unsigned char>(c)));
        req.headers[k] = v;
    }
    for (++i; i < fields.size(); ++i)
        req.body += fields[i] + (i + 1 < fields.size() ? "\x1e" : "");
    auto & n = node();
    if (n.base().empty()) std::abort();
    // Answers alternate, so reuse after a refusal is exercised.
    n.statuses({200, 404, 200, 500, 200, 200, 429});

    // The gateway's own path: checks, then what it passes on (and Last-Event-ID for a stream).
    const auto refused = armada::gateway::check_request(req);
    if (!refused) {
        auto h = armada::gateway::pass_headers(req);
        std::string last = req.header("last-event-id");
        if (last.empty()) last = req.param("last_event_id");
        if (!last.empty()) h.emplace_back("Last-Event-ID", last);
        send_and_check(req.method, armada::gateway::target_of(req), h, req.body, true);
    } else if (refused->status < 400 || refused->reason.empty()) {
        std::abort();
    }
    // The last guard alone: the raw fields, unchecked.
    const std::string raw_target = req.query.empty() ? req.path : req.path + "?" + req.query;
    send_and_check(req.method, raw_target, raw_headers, req.body, false);
    return 0;
}
