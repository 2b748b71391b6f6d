#include "cli/operator.h"

#include "common/cli_exit.h"
#include "common/json_fields.h"
#include "common/url.h"
#include "net/http_client.h"
#include "net/sse.h"
#include "net/tls.h"

#include <fmt/format.h>
#include <boost/asio/ssl/context.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

namespace armada::cli {

using common::fail;

namespace {

using json = nlohmann::json;

//! What an operator types never changes the route it is sent to.
std::string escape(const std::string & s) {
    return common::percent_encode(s);
}

//! One gateway and the key to speak to it with.
class Gateway {
  public:
    // The operator names the gateway: any address may be reached (a laptop's loopback included).
    explicit Gateway(const OperatorOptions & o) : o_(o) {
        base_ = o.gateway;
        while (!base_.empty() && base_.back() == '/')
            base_.pop_back();
    }

    //! Sets up TLS for an https gateway; "" when ready.
    std::string ready() {
        if (base_.rfind("http://", 0) != 0 && base_.rfind("https://", 0) != 0)
            return "--gateway must be an http:// or https:// URL, not '" + base_ + "'";
        if (base_.rfind("https://", 0) == 0) {
            std::string err;
            tls_ = armada::net::client_tls(o_.cacert, err, "--cacert");
            if (!tls_) return "TLS: " + err;
        }
        return {};
    }

    //! The exchange. `error` is set when no answer came, and for any answer of 400 or more: for a
    //! refused key (401, 403) it says what to do about it.
    struct Reply {
        int status = 0;
        json body;
        std::string text, error;
    };
    Reply call(const std::string & method, const std::string & path, const std::string & body = "",
               const std::string & content_type = "application/json") {
        net::HttpRequest rq;
        rq.method = method;
        rq.url = base_ + path;
        rq.body = body;
        if (!o_.api_key.empty()) rq.headers.emplace_back("Authorization", "Bearer " + o_.api_key);
        if (!body.empty()) rq.headers.emplace_back("Content-Type", content_type);
        net::HttpOptions ho;
        ho.timeout_ms = o_.timeout_s * 1000;
        ho.max_body = 8ull << 20;  // as before it went through net/ directly
        ho.tls = tls_.get();
        ho.ca_setting = "--cacert";
        const net::HttpReply r = net::http_call(rq, ho);
        Reply out;
        if (!r.error.empty()) {
            out.error = "cannot reach the gateway at " + base_ + ": " + r.error +
                        " (is it running? --gateway or ARMADA_GATEWAY names it)";
            return out;
        }
        out.status = r.status;
        out.text = r.body;
        out.body = json::parse(r.body, nullptr, false);
        if (r.status == 401)
            out.error = "the gateway at " + base_ + " refused the key (HTTP 401): " +
                        (o_.api_key.empty() ? "give one with --api-key or ARMADA_API_KEY"
                                            : "it does not know this key; check --api-key or ARMADA_API_KEY");
        else if (r.status == 403)
            out.error =
                "the key may not do this (HTTP 403): " + message(out) +
                (path.rfind("/admin", 0) == 0 || path.rfind("/dashboard", 0) == 0 ? " (it needs an admin key)" : "");
        else if (r.status >= 400)
            out.error = method + " " + path + ": HTTP " + std::to_string(r.status) + ": " + message(out);
        return out;
    }

    const std::string & base() const { return base_; }
    boost::asio::ssl::context * tls() const { return tls_.get(); }

    static std::string message(const Reply & r) {
        if (const auto * e = common::object_field(r.body, "error"))
            if (auto m = common::string_field(*e, "message")) return *m;
        return r.text.substr(0, 300);
    }

  private:
    const OperatorOptions & o_;
    std::string base_;
    std::shared_ptr<boost::asio::ssl::context> tls_;
};

std::string text_of(const json & v) {
    if (v.is_null()) return "-";
    if (v.is_string()) return v.get<std::string>().empty() ? "-" : v.get<std::string>();
    if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
    if (v.is_number_float()) {
        char b[32];
        std::snprintf(b, sizeof b, "%.3g", v.get<double>());
        return b;
    }
    if (v.is_number()) return v.dump();
    if (v.is_array()) return std::to_string(v.size()) + " items";
    return v.dump();
}

//! A table with a header row, columns as wide as their widest cell (kubectl's look).
void table(const std::vector<std::string> & head, const std::vector<std::vector<std::string>> & rows) {
    std::vector<size_t> w(head.size());
    for (size_t c = 0; c < head.size(); ++c) {
        w[c] = head[c].size();
        for (const auto & r : rows)
            w[c] = std::max(w[c], c < r.size() ? r[c].size() : 0);
    }
    const auto line = [&](const std::vector<std::string> & r) {
        std::string s;
        for (size_t c = 0; c < head.size(); ++c) {
            const std::string cell = c < r.size() ? r[c] : "";
            s += cell;
            if (c + 1 < head.size()) s += std::string(w[c] - cell.size() + 3, ' ');
        }
        while (!s.empty() && s.back() == ' ')
            s.pop_back();
        printf("%s\n", s.c_str());
    };
    line(head);
    for (const auto & r : rows)
        line(r);
}

//! The rows of `list.data`, each with the fields named in `keys`.
std::vector<std::vector<std::string>> rows_of(const json & list, const std::vector<std::string> & keys) {
    std::vector<std::vector<std::string>> rows;
    if (!list.is_object() || !list.contains("data") || !list["data"].is_array()) return rows;
    for (const auto & item : list["data"]) {
        std::vector<std::string> row;
        for (const auto & k : keys)
            row.push_back(item.is_object() && item.contains(k) ? text_of(item[k]) : "-");
        rows.push_back(std::move(row));
    }
    return rows;
}

//! A JSON answer as the operator asked for it: the API's JSON, or `human`.
int show(const OperatorOptions & o, const Gateway::Reply & r, const std::function<void()> & human) {
    if (!r.error.empty()) return fail(r.error);
    if (o.json) {
        printf("%s\n", r.body.is_discarded() ? r.text.c_str() : r.body.dump(2).c_str());
        return 0;
    }
    if (r.body.is_discarded())
        return fail("the gateway answered with something that is not JSON: " + r.text.substr(0, 200));
    human();
    return 0;
}

void fields(const json & obj) {
    if (!obj.is_object()) return;
    size_t w = 0;
    for (const auto & [k, v] : obj.items())
        w = std::max(w, k.size());
    for (const auto & [k, v] : obj.items())
        printf("%s:%s %s\n", k.c_str(), std::string(w - k.size(), ' ').c_str(), text_of(v).c_str());
}

int need_name(const OperatorOptions & o, const char * what) {
    return common::fail(fmt::format("armada {} {} needs {}", o.resource, o.verb, what), 2);
}

//! GET `url` and hand the body to `piece` as it arrives (an event stream). Ends cleanly when the
//! server ends the body, or when it has sent nothing for `idle_ms` (what has come is all there
//! is); otherwise returns the error. `status` is the reply's.
std::string stream_get(const std::string & url, const std::vector<std::pair<std::string, std::string>> & headers,
                       int connect_ms, int idle_ms, boost::asio::ssl::context * tls_ctx,
                       const std::function<void(std::string_view)> & piece, int & status) {
    net::HttpRequest req;
    req.url = url;
    req.headers = headers;
    req.headers.emplace_back("Accept", "text/event-stream");
    net::HttpOptions ho;
    ho.timeout_ms = connect_ms;  // the connection and the head; the body streams
    ho.idle_ms = idle_ms;
    ho.tls = tls_ctx;
    ho.ca_setting = "--cacert";
    ho.on_head = [](const net::HttpReply & head) { return head.status == 200; };
    ho.on_chunk = [&](std::string_view p) {
        piece(p);
        return true;
    };
    const net::HttpReply r = net::http_call(req, ho);
    status = r.status;
    if (r.failure == net::HttpFailure::idle) return {};  // quiet: what came is all there is
    if (!r.error.empty()) return r.error;
    if (r.status != 200) return "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300);
    return {};
}

// ---- sessions ----

int sessions(const OperatorOptions & o, Gateway & gw) {
    if (o.verb == "list") {
        std::string q = "?limit=" + std::to_string(o.limit);
        if (!o.state.empty()) q += "&state=" + escape(o.state);
        const auto r = gw.call("GET", "/v1/sessions" + q);
        return show(o, r, [&] {
            table({"ID", "AGENT", "STATE", "CELL", "NODE", "CREATED"},
                  rows_of(r.body, {"id", "agent", "state", "cell", "node", "created_at"}));
        });
    }
    if (o.name.empty()) return need_name(o, "a session id");
    const std::string path = "/v1/sessions/" + escape(o.name);
    if (o.verb == "show") {
        const auto r = gw.call("GET", path);
        return show(o, r, [&] { fields(r.body); });
    }
    if (o.verb == "cancel") {
        const auto r = gw.call("POST", path + "/cancel", "{}");
        return show(o, r, [&] { printf("session %s cancelled\n", o.name.c_str()); });
    }
    if (o.verb == "events") {
        // The session's events from its start. Without --follow: those there are, until the
        // stream has been quiet for two seconds (or ends); with it, as they come, until the
        // session ends.
        std::vector<std::pair<std::string, std::string>> headers;
        if (!o.api_key.empty()) headers.emplace_back("Authorization", "Bearer " + o.api_key);
        const bool raw = o.follow && !o.json;  // as it comes, SSE as it is
        std::string text;
        int status = 0;
        const std::string err = stream_get(
            gw.base() + path + "/events", headers, o.timeout_s * 1000, o.follow ? 24 * 3600 * 1000 : 2000, gw.tls(),
            [&](std::string_view p) {
                if (raw) {
                    fwrite(p.data(), 1, p.size(), stdout);
                    fflush(stdout);
                } else {
                    text += p;
                }
            },
            status);
        if (!err.empty()) {
            if (status == 401) return fail("the gateway at " + gw.base() + " refused the key (HTTP 401)");
            if (status == 404) return fail("no session with id '" + o.name + "'");
            if (status == 0)
                return fail("cannot reach the gateway at " + gw.base() + ": " + err +
                            " (is it running? --gateway or ARMADA_GATEWAY names it)");
            return fail("events of " + o.name + ": " + err);
        }
        if (raw) return 0;
        const auto print = [&](net::SseEvent & ev) {
            if (o.json) {
                json e = {{"id", ev.id}, {"event", ev.type()}};
                const json parsed = json::parse(ev.data, nullptr, false);
                e["data"] = parsed.is_discarded() ? json(ev.data) : parsed;
                printf("%s\n", e.dump().c_str());
            } else {
                printf("%-8s %-18s %s\n", ev.id.c_str(), ev.type().c_str(), ev.data.c_str());
            }
            return true;
        };
        net::SseReader events;
        events.feed(text, print);
        events.finish(print);
        return 0;
    }
    return common::fail(fmt::format("armada sessions has list, show, events and cancel, not '{}'", o.verb), 2);
}

// ---- agents ----

int agents(const OperatorOptions & o, Gateway & gw) {
    if (o.verb == "list") {
        const auto r = gw.call("GET", "/v1/agents");
        return show(o, r, [&] {
            std::vector<std::vector<std::string>> rows;
            if (const auto * data = common::array_field(r.body, "data"))
                for (const auto & a : *data) {
                    if (!a.is_object()) continue;
                    const json tools = a.value("tools", json::array());
                    rows.push_back({text_of(a.value("id", json(nullptr))), text_of(a.value("model", json(nullptr))),
                                    std::to_string(tools.is_array() ? tools.size() : 0),
                                    text_of(a.value("tenant", json(nullptr)))});
                }
            table({"ID", "MODEL", "TOOLS", "TENANT"}, rows);
        });
    }
    if (o.verb == "apply") {
        if (o.file.empty()) return need_name(o, "-f FILE (an agent's YAML or JSON)");
        std::ifstream in(o.file);
        if (!in) return fail("cannot read " + o.file);
        std::stringstream ss;
        ss << in.rdbuf();
        const std::string body = ss.str();
        const bool is_json = !body.empty() && body.find_first_not_of(" \t\r\n") != std::string::npos &&
                             body[body.find_first_not_of(" \t\r\n")] == '{';
        const auto r = gw.call("POST", "/v1/agents", body, is_json ? "application/json" : "application/yaml");
        return show(o, r, [&] {
            if (const auto * data = common::array_field(r.body, "data")) {
                for (const auto & a : *data)
                    if (a.is_object()) printf("agent %s applied\n", text_of(a.value("id", json(nullptr))).c_str());
            } else {
                printf("agent %s applied\n", text_of(r.body.value("id", json(nullptr))).c_str());
            }
        });
    }
    if (o.verb == "delete") {
        if (o.name.empty()) return need_name(o, "an agent id");
        const auto r = gw.call("DELETE", "/v1/agents/" + escape(o.name));
        return show(o, r, [&] { printf("agent %s deleted\n", o.name.c_str()); });
    }
    if (o.verb == "show") {
        if (o.name.empty()) return need_name(o, "an agent id");
        const auto r = gw.call("GET", "/v1/agents/" + escape(o.name));
        return show(o, r, [&] { fields(r.body); });
    }
    return common::fail(fmt::format("armada agents has list, show, apply and delete, not '{}'", o.verb), 2);
}

// ---- tenants ----

int tenants(const OperatorOptions & o, Gateway & gw) {
    if (o.verb == "list") {
        const auto r = gw.call("GET", "/admin/tenants");
        return show(o, r, [&] {
            table({"NAME", "RPM", "TPM", "LIVE SESSIONS", "KV BYTES", "CREATED"},
                  rows_of(r.body, {"name", "requests_per_minute", "tokens_per_minute", "live_sessions", "kv_bytes",
                                   "created_at"}));
        });
    }
    if (o.name.empty()) return need_name(o, "a tenant name");
    if (o.verb == "create") {
        const json body = {{"name", o.name},
                           {"requests_per_minute", o.rpm},
                           {"tokens_per_minute", o.tpm},
                           {"live_sessions", o.live_sessions}};
        const auto r = gw.call("POST", "/admin/tenants", body.dump());
        return show(o, r, [&] { printf("tenant %s created\n", o.name.c_str()); });
    }
    if (o.verb == "keys") {
        if (o.new_key) {
            const auto r = gw.call("POST", "/admin/keys", json{{"tenant", o.name}}.dump());
            return show(o, r, [&] {
                printf("key %s for tenant %s: %s\n(shown once: only its hash is kept)\n",
                       text_of(r.body.value("id", json(nullptr))).c_str(), o.name.c_str(),
                       text_of(r.body.value("key", json(nullptr))).c_str());
            });
        }
        const auto r = gw.call("GET", "/admin/keys?tenant=" + escape(o.name));
        return show(o, r, [&] {
            table({"ID", "PREFIX", "ADMIN", "CREATED"}, rows_of(r.body, {"id", "prefix", "admin", "created_at"}));
        });
    }
    return common::fail(fmt::format("armada tenants has list, create and keys, not '{}'", o.verb), 2);
}

// ---- cluster status ----

int status(const OperatorOptions & o, Gateway & gw) {
    const auto r = gw.call("GET", "/dashboard/snapshot");
    return show(o, r, [&] {
        const json & s = r.body;
        const json totals = s.value("totals", json::object());
        printf("gateway %s (%s live); etcd %s\n", text_of(s.value("gateway", json(nullptr))).c_str(),
               text_of(s.value("gateways", json(nullptr))).c_str(), s.value("etcd_ok", false) ? "ok" : "NOT READ");
        printf("%s cells, %s nodes, %s live sessions, %s queued\n\n", text_of(totals.value("cells", json(0))).c_str(),
               text_of(totals.value("nodes", json(0))).c_str(), text_of(totals.value("live_sessions", json(0))).c_str(),
               text_of(totals.value("queued", json(0))).c_str());
        std::vector<std::vector<std::string>> rows;
        for (const auto & c : s.value("cells", json::array())) {
            if (!c.is_object()) continue;
            const json nodes = c.value("node_list", json::array());
            std::string names;
            for (const auto & n : nodes)
                if (n.is_object()) names += (names.empty() ? "" : ",") + text_of(n.value("name", json(nullptr)));
            rows.push_back({text_of(c.value("name", json(nullptr))), text_of(c.value("leader", json(nullptr))),
                            text_of(c.value("nodes", json(0))), text_of(c.value("live_sessions", json(0))),
                            text_of(c.value("free_seqs", json(0))), text_of(c.value("queued", json(0))),
                            text_of(c.value("kv_watermark", json(nullptr))), names.empty() ? "-" : names});
        }
        table({"CELL", "LEADER", "NODES", "LIVE", "FREE", "QUEUED", "KV", "NODE NAMES"}, rows);
        const json ro = s.value("rollout", json(nullptr));
        if (ro.is_object())
            printf("\nrollout %s to %s: %s, wave %s of %s\n", text_of(ro.value("id", json(nullptr))).c_str(),
                   text_of(ro.value("version", json(nullptr))).c_str(),
                   text_of(ro.value("phase", json(nullptr))).c_str(), text_of(ro.value("wave", json(0))).c_str(),
                   text_of(ro.value("waves", json(0))).c_str());
        else
            printf("\nno rollout\n");
    });
}

}  // namespace

int operator_command(const OperatorOptions & o) {
    Gateway gw(o);
    if (auto e = gw.ready(); !e.empty()) return fail(e);
    if (o.resource == "sessions") return sessions(o, gw);
    if (o.resource == "agents") return agents(o, gw);
    if (o.resource == "tenants") return tenants(o, gw);
    if (o.resource == "cluster" && o.verb == "status") return status(o, gw);
    return common::fail(fmt::format("no verb {} {}", o.resource, o.verb), 2);
}

}  // namespace armada::cli
