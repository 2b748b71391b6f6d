#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace boost::asio::ssl {
class context;
}

namespace armada::cluster {

//! One key of etcd, as the JSON gateway reports it (keys and values decoded from base64).
struct EtcdKv {
    std::string key, value;
    int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

//! A condition of a transaction: `key`'s creation or last-modification revision equals
//! `revision` (0: the key does not exist).
struct EtcdCompare {
    enum class Target { Create, Mod } target = Target::Mod;
    std::string key;
    int64_t revision = 0;
};

struct EtcdEvent {
    enum class Type { Put, Delete } type = Type::Put;
    EtcdKv kv;
};

//! The holder of an election, as `campaign` and `leader` return it. `rev` (the leader key's
//! creation revision) only grows from one leader to the next: it is the leader's fencing epoch.
struct EtcdLeader {
    std::string name, key, value;
    int64_t rev = 0, lease = 0;
};

//! What etcd says of itself (maintenance status and alarms): the figures an operator watches so
//! that its quota is never reached.
struct EtcdStatus {
    int64_t db_bytes = 0;         // the backend file's size
    int64_t db_in_use_bytes = 0;  // what it holds after compaction (the rest is free pages)
    int64_t revision = 0;
    std::string version;
    std::vector<std::string> alarms;  // e.g. "NOSPACE", "CORRUPT"; empty when none
};

//! etcd v3 through its JSON gateway (`/v3/...`) over HTTP/1.1 with Beast: no gRPC. Every call
//! blocks its thread for at most `timeout_ms` and returns an error message ("" on success);
//! the adapters run it on threads of their own. Endpoints are tried in order, so a cluster of
//! three etcd members keeps working while one is down.
class EtcdClient {
  public:
    explicit EtcdClient(std::vector<std::string> endpoints, int timeout_ms = 5000);
    //! Authenticates as `user` with etcd's auth: a token from /v3/auth/authenticate goes with
    //! every call and stream, and is fetched again once when etcd says it is no longer valid.
    //! Copies of this client share the token.
    void set_credentials(const std::string & user, const std::string & password);
    //! Speaks TLS to every endpoint with `tls` (the server's certificate must name the host it is
    //! reached at). Null with `error`: TLS was asked for and cannot be had, and every call fails
    //! with that error rather than go out in the clear.
    void set_tls(std::shared_ptr<boost::asio::ssl::context> tls, std::string error = {});
    //! How long one call waits on each endpoint.
    int timeout_ms() const { return timeout_ms_; }
    size_t endpoint_count() const { return endpoints_.size(); }

    // Leases.
    std::string grant(int ttl_s, int64_t & lease);
    //! Renews the lease; `ttl` comes back as what is left (0 or less: the lease is gone).
    std::string keepalive(int64_t lease, int64_t & ttl);
    //! As above, waiting at most `timeout_ms` on each endpoint.
    std::string keepalive(int64_t lease, int64_t & ttl, int timeout_ms);
    std::string revoke(int64_t lease);
    //! The seconds `lease` has left (-1: it has expired or never was).
    std::string lease_ttl(int64_t lease, int64_t & ttl);

    // Keys.
    std::string put(const std::string & key, const std::string & value, int64_t lease = 0);
    std::string get(const std::string & key, std::optional<EtcdKv> & out);
    //! Every key under `prefix`, and the store's revision at the time (to watch from after it).
    std::string list(const std::string & prefix, std::vector<EtcdKv> & out, int64_t & revision);
    std::string erase(const std::string & key);
    //! Deletes `key` only while its create revision is `create_revision` (the same key, not one
    //! made again since); `erased` says whether it did.
    std::string erase_if_created(const std::string & key, int64_t create_revision, bool & erased);
    //! Puts every `puts` pair only if every compare holds, atomically (etcd's txn). `succeeded`
    //! says whether they held; `revision` is the store's revision after it.
    std::string txn(const std::vector<EtcdCompare> & compares,
                    const std::vector<std::pair<std::string, std::string>> & puts, bool & succeeded,
                    int64_t & revision);

    //! Streams the changes under `prefix` from `start_revision` (0: from now) to `on_events`,
    //! each batch with its revision, until `stop` is set, `on_events` returns false, or the
    //! stream breaks (the error says which; the caller lists again and watches from there).
    std::string watch(const std::string & prefix, int64_t start_revision,
                      const std::function<bool(const std::vector<EtcdEvent> &, int64_t revision)> & on_events,
                      const std::atomic<bool> & stop);

    //! The endpoint's status and the cluster's alarms. Alarms need etcd's root role when auth is
    //! on; without it `alarms_known` is false and the status alone comes back.
    std::string status(EtcdStatus & out, bool & alarms_known);

    // Elections (etcd's election API).
    //! Joins the election `name` with `value`, under `lease`, and waits up to `wait_ms` to lead,
    //! or until `*give_up` is set. Either way the error is then "not elected yet", and the server
    //! withdraws the candidacy (the call's end cancels it): campaign again to stand again.
    std::string campaign(const std::string & name, const std::string & value, int64_t lease, int wait_ms,
                         EtcdLeader & out, const std::atomic<bool> * give_up = nullptr);
    //! Who leads `name` now ("no leader" when nobody does).
    std::string leader(const std::string & name, EtcdLeader & out);
    std::string resign(const EtcdLeader & leader);
    //! Streams who leads `name` to `on_leader`: the leader now (if any), then each new one, until
    //! `stop` is set, `on_leader` returns false, or the stream breaks (the error says which).
    std::string observe(const std::string & name, const std::function<bool(const EtcdLeader &)> & on_leader,
                        const std::atomic<bool> & stop);

    //! One line of a watch stream: its events and revision appended; false (with `error`) when
    //! the stream ends (an error, or the watch was cancelled). Any bytes are safe.
    static bool parse_watch_message(const std::string & line, std::vector<EtcdEvent> & events, int64_t & revision,
                                    std::string & error);
    static std::string base64(const std::string & s);
    static std::optional<std::string> unbase64(const std::string & s);
    //! The smallest key greater than every key starting with `prefix` (etcd's range_end).
    static std::string prefix_end(const std::string & prefix);

    //! One POST of `body` to `path` with this client's credentials (set-up: etcd's auth API).
    std::string admin_call(const std::string & path, const std::string & body, std::string & reply) {
        return call(path, body, reply, timeout_ms_);
    }

  private:
    //! POSTs `body` to `path` on the first endpoint that answers; fills `reply` with the JSON.
    //! `stop`, when given and set, ends the wait early as a timeout does.
    std::string call(const std::string & path, const std::string & body, std::string & reply, int timeout_ms,
                     const std::atomic<bool> * stop = nullptr);
    //! `call` with `token` (when not empty) as its Authorization header.
    std::string call_raw(const std::string & path, const std::string & body, std::string & reply, int timeout_ms,
                         const std::atomic<bool> * stop, const std::string & token);
    //! The current token ("" with `error` when none can be had); `renew` asks etcd for a new one.
    std::string token(std::string & error, bool renew);
    //! POSTs `body` to a streaming `path` and hands each line of the reply to `on_line` (false
    //! ends the stream, with `error` set when it is one). `what` names it in errors.
    std::string stream(const std::string & path, const std::string & body, const char * what,
                       const std::function<bool(const std::string &, std::string &)> & on_line,
                       const std::atomic<bool> & stop);

    std::vector<std::string> endpoints_;  // host:port
    int timeout_ms_;
    struct Auth {
        std::mutex mu;
        std::string user, password, token;  // token: mu
    };
    std::shared_ptr<Auth> auth_;                      // null: no credentials
    std::shared_ptr<boost::asio::ssl::context> tls_;  // null: plain HTTP
    std::string tls_error_;                           // TLS asked for and not had
};

}  // namespace armada::cluster
