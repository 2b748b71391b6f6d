#include "store/pg_conn.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

namespace armada::store::pg {

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
        s.pop_back();
    return s;
}

std::string error_of(PGconn * c, const Res & r) {
    if (!r.failure.empty()) return r.failure;
    std::string e = r.r ? PQresultErrorMessage(r.r) : "";
    if (e.empty()) e = PQerrorMessage(c);
    return trim(e);
}

Res run(PGconn * c, const std::string & sql, const std::vector<std::string> & params, int timeout_ms) {
    std::vector<const char *> v;
    v.reserve(params.size());
    for (const auto & p : params)
        v.push_back(p.c_str());
    if (timeout_ms <= 0)
        return Res(PQexecParams(c, sql.c_str(), int(v.size()), nullptr, v.data(), nullptr, nullptr, 0));
    while (PGresult * left = PQgetResult(c))  // nothing may be pending from before
        PQclear(left);
    if (!PQsendQueryParams(c, sql.c_str(), int(v.size()), nullptr, v.data(), nullptr, nullptr, 0)) return Res();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string failure;
    while (PQconsumeInput(c) && PQisBusy(c)) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
            failure = "PostgreSQL did not answer within " + std::to_string(timeout_ms) +
                      " ms (the server hangs, or the network to it does); the connection is reset";
            ::shutdown(PQsocket(c), SHUT_RDWR);
            PQconsumeInput(c);  // sees the shut-down socket: the connection is now broken
            break;
        }
        pollfd p{PQsocket(c), POLLIN, 0};
        ::poll(&p, 1, int(std::min<int64_t>(left, 1000)));
    }
    Res out;
    while (PGresult * r = PQgetResult(c)) {
        if (out.r && PQresultStatus(out.r) == PGRES_FATAL_ERROR) {
            PQclear(r);  // the first error is the one to report
            continue;
        }
        out = Res(r);
    }
    out.failure = std::move(failure);
    if (!out.failure.empty()) {
        PQclear(out.r);
        out.r = nullptr;
    }
    return out;
}

PGconn * connect(const std::string & url, int timeout_s, int statement_timeout_ms) {
    const std::string t = std::to_string(timeout_s);
    const std::string options = "-c statement_timeout=" + std::to_string(statement_timeout_ms);
    const char * keys[] = {
        "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
        "options",    "dbname",          "connect_timeout",     "application_name", nullptr};
    const char * vals[] = {"1", "10", "3", "3", "15000", options.c_str(), url.c_str(), t.c_str(), "armada", nullptr};
    PGconn * c = PQconnectdbParams(keys, vals, 1);
    // Server notices ("relation already exists, skipping") are not errors: keep them out of logs.
    if (c)
        PQsetNoticeProcessor(
            c, [](void *, const char *) {}, nullptr);
    return c;
}

std::string redact(const std::string & url) {
    const auto scheme = url.find("://");
    const auto at = url.find('@');
    if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
    const auto colon = url.find(':', scheme + 3);
    if (colon == std::string::npos || colon > at) return url;
    return url.substr(0, colon) + ":***" + url.substr(at);
}

}  // namespace armada::store::pg
