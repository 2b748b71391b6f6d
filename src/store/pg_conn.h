#pragma once

// PostgreSQL connections as the store uses them (inside store/ only): results that free
// themselves, statements bounded in time, connections with keepalives and a server-side
// statement timeout, and connection strings safe to print.

#include <libpq-fe.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace armada::store::pg {

//! Owns a PGresult.
struct Res {
    PGresult * r = nullptr;
    std::string failure;  // set when the server did not answer in time (then r may be null)
    Res() = default;
    explicit Res(PGresult * p) : r(p) {}
    Res(Res && o) noexcept : r(o.r), failure(std::move(o.failure)) { o.r = nullptr; }
    Res & operator=(Res && o) noexcept {
        std::swap(r, o.r);
        std::swap(failure, o.failure);
        return *this;
    }
    ~Res() { PQclear(r); }
    bool ok() const {
        const auto s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
        return s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
    }
    int rows() const { return r ? PQntuples(r) : 0; }
    std::string text(int row, int col) const {
        return std::string(PQgetvalue(r, row, col), size_t(PQgetlength(r, row, col)));
    }
    int64_t i64(int row, int col) const { return std::strtoll(PQgetvalue(r, row, col), nullptr, 10); }
    int64_t affected() const { return r ? std::strtoll(PQcmdTuples(r), nullptr, 10) : 0; }
};

//! libpq's words, without the trailing newline.
std::string trim(std::string s);
//! What went wrong with `r`: a timeout of ours, else the server's words, else the connection's.
std::string error_of(PGconn * c, const Res & r);
//! Runs `sql` with text parameters, waiting at most `timeout_ms` (0: no limit) for the answer. A
//! server that accepts and never answers (hung, or cut off without a reset) is given up on: the
//! connection is shut down, so it reads as broken and is reset before its next use.
Res run(PGconn * c, const std::string & sql, const std::vector<std::string> & params = {}, int timeout_ms = 0);
//! libpq's settings for every connection, before the URL's own (which win): TCP keepalives and a
//! user timeout, so a peer that vanishes without a reset is noticed in seconds, and a statement
//! timeout on the server's side.
PGconn * connect(const std::string & url, int timeout_s, int statement_timeout_ms);
//! A connection string with any password left out, for messages.
std::string redact(const std::string & url);

}  // namespace armada::store::pg
