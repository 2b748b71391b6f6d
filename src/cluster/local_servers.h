#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "cluster/etcd.h"
#include "cluster/service_auth.h"

namespace armada::cluster {

//! A process this process started. It is signalled by its own PID only, and killed when the
//! object goes if it still runs.
class Child {
  public:
    //! Starts `argv` (argv[0] a path) with stdout and stderr appended to `log`. When this process
    //! is root and `as_user` is set, the child runs as that user (servers such as PostgreSQL
    //! refuse to run as root). `env` ("NAME=value") is added to the environment it inherits: a
    //! secret passed there is not visible in `ps` as an argument would be.
    static std::optional<Child> spawn(const std::vector<std::string> & argv, const std::string & log,
                                      const std::string & as_user, std::string & error,
                                      const std::vector<std::string> & env = {});
    Child(Child && o) noexcept;
    Child & operator=(Child && o) noexcept;
    Child(const Child &) = delete;
    ~Child();

    pid_t pid() const { return pid_; }
    //! False once it has exited (its status is then kept).
    bool running();
    //! After `running()` said false: how it ended, as a shell reports it (the exit code, or
    //! 128 + the signal that killed it).
    int exit_code() const;
    void signal(int sig) const;
    //! Sends `sig`, waits up to `wait_ms`, then SIGKILL. Returns the exit code, or 128+signal.
    int stop(int sig, int wait_ms);
    //! Waits for it to exit by itself, up to `wait_ms`; the exit code or -1 on timeout.
    int wait(int wait_ms);

  private:
    Child() = default;
    pid_t pid_ = -1;
    int status_ = 0;
    bool exited_ = false;
};

//! Runs a command to completion (output to `log`); its exit code, or -1 if it could not start.
int run_command(const std::vector<std::string> & argv, const std::string & log, const std::string & as_user,
                std::string & error);

//! A free TCP port on 127.0.0.1 at the time of asking.
int free_port();

//! The last `n` bytes of a file, for error messages.
std::string tail_of(const std::string & path, size_t n = 2000);

//! The secret in `path` (hex, one line), made from 32 random bytes the first time; the file is
//! mode 0600 and its directory 0700. "" with `error` when it cannot be read or written.
std::string ensure_secret(const std::string & path, std::string & error);

//! Writes `text` to `path` with mode 0600 (replacing it whole).
std::string write_private(const std::string & path, const std::string & text);
//! The first directory above `dir` that does not let other users through (no o+x), or "" when
//! every one does: a service user (PostgreSQL's) cannot reach `dir` past it.
std::string closed_ancestor(const std::string & dir);
//! Where `cluster up` keeps PostgreSQL's data for a data directory that user cannot reach (a
//! checkout under /root): a directory of its own under /var/lib/armada/postgres, named by the
//! data directory's path.
std::string postgres_home_for(const std::string & data_dir);

//! A PostgreSQL server from the Debian binaries, in a directory of its own, on a loopback port.
//! Used by the tests, the benchmarks and `armada cluster up`. Every connection needs a password
//! (SCRAM-SHA-256, no `trust` line): the superuser `armada_admin`, and the application role
//! `armada`, which is not a superuser and owns only the databases made for it. Both passwords sit
//! in 0600 files in the secrets directory; `url()` names a libpq passfile there, so the URL itself
//! holds no secret.
//! A server's TLS: its certificate and key, and the CA its clients check it against.
struct ServerTls {
    std::string ca_file, cert_file, key_file;
    bool on() const { return !cert_file.empty(); }
};

//! A CA of its own in `dir` (ca.crt, ca.key) and a certificate it signed for this machine's
//! loopback names (server.crt, server.key; DNS:localhost, IP:127.0.0.1), made once with the
//! openssl command and kept on later calls. Keys are 0600, the directory 0700. On failure the
//! result is off() and `error` says why.
ServerTls make_local_tls(const std::string & dir, std::string & error);

class LocalPostgres {
  public:
    //! Before start: the server speaks TLS, and takes no connection without it (hostssl only).
    void use_tls(const ServerTls & t) { tls_ = t; }
    LocalPostgres() = default;
    LocalPostgres(const LocalPostgres &) = delete;
    ~LocalPostgres();

    //! Creates the cluster in `dir` if it has none (initdb), then starts the server on `port` (0:
    //! a free one) and waits until it accepts connections. Secrets go to `secrets_dir` (default:
    //! `dir` + "-secrets"). Returns an error message.
    std::string start(const std::string & dir, int port = 0, const std::string & secrets_dir = {});
    //! Fast shutdown; waits for it to finish.
    std::string stop();
    //! Stops and starts again on the same directory and port.
    std::string restart();
    //! Creates a database owned by the application role (no error if it exists).
    std::string create_database(const std::string & name);
    //! postgres://armada@127.0.0.1:PORT/DB?passfile=SECRETS/pgpass: the application role's URL.
    std::string url(const std::string & db = "postgres") const;
    //! The same, reached at `port` (a proxy in front of the server); its password file lists it.
    std::string url_via(int port, const std::string & db) const;
    //! The superuser's libpq connection string (with its password): for tests and set-up only.
    std::string superuser_conninfo(const std::string & db = "postgres") const;
    const std::string & secrets_dir() const { return secrets_; }
    int port() const { return port_; }
    pid_t pid() const { return child_ ? child_->pid() : -1; }
    bool running() { return child_ && child_->running(); }
    //! Where the server binaries are: $ARMADA_PG_BIN, else the newest /usr/lib/postgresql/*/bin.
    static std::string bin_dir();

  private:
    std::string launch();
    std::string ensure_role();
    std::string dir_, secrets_;
    std::string su_password_, app_password_;
    ServerTls tls_;
    //! libpq's TLS settings for a client of this server ("" without TLS).
    std::string client_tls_params(const char * sep) const;
    int port_ = 0;
    std::optional<Child> child_;
};

//! A server that needs only a port and a directory, started from a Debian binary: NATS with
//! JetStream (file storage in the directory) or Redis (no persistence: it holds only what can be
//! rebuilt). Restarting keeps the port and, for NATS, the streams. Each takes only the user
//! `armada` with a password (in `secrets_dir`, mode 0600): Redis through an ACL that keeps it to
//! the `armada:` keys and off the admin commands, NATS through a user that may publish and
//! subscribe on Armada's subjects and JetStream's API only.
class LocalDaemon {
  public:
    enum class Kind { Nats, Redis };
    explicit LocalDaemon(Kind k) : kind_(k) {}
    LocalDaemon(const LocalDaemon &) = delete;
    //! Before start: clients must speak TLS to it (Redis: TLS only; NATS: TLS required).
    void use_tls(const ServerTls & t) { tls_ = t; }
    ~LocalDaemon();
    //! Secrets go to `secrets_dir` (default: `dir` + "-secrets").
    std::string start(const std::string & dir, int port = 0, const std::string & secrets_dir = {});
    const std::string & user() const { return user_; }
    const std::string & password() const { return password_; }
    //! What a client needs to reach this server: its user and password (and password file).
    ServiceCredentials credentials() const {
        ServiceCredentials c;
        c.user = user_;
        c.password = password_;
        c.password_file = password_file();
        c.ca_file = tls_.ca_file;
        return c;
    }
    //! The file that holds the password (mode 0600).
    std::string password_file() const;
    std::string stop();
    std::string restart();
    int port() const { return port_; }
    pid_t pid() const { return child_ ? child_->pid() : -1; }
    bool running() { return child_ && child_->running(); }
    //! nats://127.0.0.1:PORT or 127.0.0.1:PORT.
    std::string url() const;

  private:
    std::string launch();
    Kind kind_;
    ServerTls tls_;
    std::string dir_, secrets_;
    std::string user_ = "armada", password_;
    int port_ = 0;
    std::optional<Child> child_;
};

//! True when something accepts TCP connections on 127.0.0.1:port.
bool port_open(int port);

//! An etcd server (the Debian `etcd-server` binary), one member, in a directory of its own, on
//! loopback ports. Restarting it on the same directory keeps every key and lease.
class LocalEtcd {
  public:
    LocalEtcd() = default;
    LocalEtcd(const LocalEtcd &) = delete;
    ~LocalEtcd();
    std::string start(const std::string & dir, int port = 0);
    //! Before start: the client port speaks HTTPS only.
    void use_tls(const ServerTls & t) { tls_ = t; }
    const ServerTls & tls() const { return tls_; }
    //! Before start: how much history etcd keeps (its periodic auto-compaction's retention, a
    //! duration such as "1m"; the default) and its backend quota (8 GiB by default).
    void set_compaction(std::string retention, int64_t quota_bytes = kQuotaBytes) {
        retention_ = std::move(retention);
        quota_bytes_ = quota_bytes;
    }
    static constexpr int64_t kQuotaBytes = int64_t(8) << 30;
    std::string stop();
    std::string restart();
    //! host:port of the client endpoint.
    std::string endpoint() const;
    int port() const { return port_; }
    pid_t pid() const { return child_ ? child_->pid() : -1; }
    bool running() { return child_ && child_->running(); }
    //! $ARMADA_ETCD_BIN, else /usr/bin/etcd.
    static std::string binary();
    //! Turns etcd's authentication on: a `root` user, and `user` whose role may read and write
    //! the keys under `prefix` only. Passwords come from (and are made in) 0600 files in
    //! `secrets_dir` (`etcd-root`, `etcd`). From then on every client needs credentials.
    //! On a restart it only checks that the credentials in `secrets_dir` still work.
    std::string enable_auth(const std::string & secrets_dir, const std::string & user, const std::string & prefix);
    //! The user and password file that enable_auth set up (empty before).
    const std::string & user() const { return user_; }
    std::string password_file() const { return user_.empty() ? std::string() : secrets_ + "/etcd"; }
    //! A client of this etcd, with those credentials when auth is on.
    EtcdClient client(int timeout_ms) const;

  private:
    std::string launch();
    std::string dir_, secrets_, user_, password_;
    ServerTls tls_;
    std::string retention_ = "1m";
    int64_t quota_bytes_ = kQuotaBytes;
    int port_ = 0, peer_port_ = 0;
    std::optional<Child> child_;
};

}  // namespace armada::cluster
