#include "cluster/local_servers.h"

#include "cluster/etcd.h"
#include "common/hash.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

namespace armada::cluster {

namespace fs = std::filesystem;

namespace {

//! Gives `path` (recursively) to `user`, so a server started as that user can write there.
void chown_tree(const std::string & path, uid_t uid, gid_t gid) {
    std::error_code ec;
    if (::chown(path.c_str(), uid, gid) != 0) return;
    if (!fs::is_directory(path, ec)) return;
    for (const auto & de : fs::recursive_directory_iterator(path, ec))
        if (::lchown(de.path().c_str(), uid, gid) != 0) break;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PostgreSQL

namespace {
constexpr const char * kPgUser = "postgres";       // the system user the Debian package creates
constexpr const char * kPgRole = "armada";         // the database role the cluster connects as
constexpr const char * kPgAdmin = "armada_admin";  // the superuser (set-up only)
}  // namespace

std::string closed_ancestor(const std::string & dir) {
    for (fs::path p = fs::absolute(dir).parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
        std::error_code ec;
        const auto perms = fs::status(p, ec).permissions();
        if (!ec && (perms & fs::perms::others_exec) == fs::perms::none) return p.string();
    }
    return {};
}

std::string postgres_home_for(const std::string & data_dir) {
    // FNV-1a of the absolute path: the same data directory finds its database again.
    const uint64_t h = common::fnv1a64(fs::absolute(data_dir).lexically_normal().string());
    char name[17];
    std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
    return std::string("/var/lib/armada/postgres/") + name;
}

std::string write_private(const std::string & path, const std::string & text) {
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
    (void)::fchmod(fd, 0600);
    const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) return "cannot write " + path + ": " + std::strerror(errno);
    return {};
}

std::string ensure_secret(const std::string & path, std::string & error) {
    std::error_code ec;
    const fs::path dir = fs::path(path).parent_path();
    fs::create_directories(dir, ec);
    ::chmod(dir.c_str(), 0700);
    if (fs::exists(path, ec)) {
        std::ifstream f(path);
        std::string s;
        std::getline(f, s);
        if (!s.empty()) {
            ::chmod(path.c_str(), 0600);
            return s;
        }
    }
    unsigned char b[32];
    std::ifstream rnd("/dev/urandom", std::ios::binary);
    if (!rnd.read(reinterpret_cast<char *>(b), sizeof b)) {
        error = "cannot read /dev/urandom for a new secret";
        return {};
    }
    static const char * hex = "0123456789abcdef";
    std::string s;
    for (unsigned char c : b) {
        s += hex[c >> 4];
        s += hex[c & 15];
    }
    if (auto e = write_private(path, s + "\n"); !e.empty()) {
        error = e;
        return {};
    }
    return s;
}

std::string LocalPostgres::bin_dir() {
    if (const char * e = std::getenv("ARMADA_PG_BIN"); e && *e) return e;
    std::string best;
    int best_v = -1;
    std::error_code ec;
    for (const auto & de : fs::directory_iterator("/usr/lib/postgresql", ec)) {
        const std::string name = de.path().filename().string();
        const int v = std::atoi(name.c_str());
        if (v > best_v && fs::exists(de.path() / "bin" / "postgres", ec)) {
            best_v = v;
            best = (de.path() / "bin").string();
        }
    }
    return best;
}

LocalPostgres::~LocalPostgres() {
    if (child_) stop();
}

std::string LocalPostgres::start(const std::string & dir, int port, const std::string & secrets_dir) {
    const std::string bin = bin_dir();
    if (bin.empty())
        return "PostgreSQL server binaries not found (install the postgresql package, or set ARMADA_PG_BIN)";
    dir_ = dir;
    port_ = port > 0 ? port : free_port();
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) return "cannot create " + dir_ + ": " + ec.message();
    const std::string data = dir_ + "/data";
    if (::geteuid() == 0) {
        const passwd * pw = ::getpwnam(kPgUser);
        if (!pw) return "PostgreSQL refuses to run as root, and there is no 'postgres' user to run it as";
        // The directory must sit where that user can reach it: every directory above it must let
        // other users through.
        if (const std::string p = closed_ancestor(dir_); !p.empty())
            return "the postgres user cannot reach " + dir_ + ": " + p +
                   " does not let other users through (chmod o+x it, or choose another directory)";
        chown_tree(dir_, pw->pw_uid, pw->pw_gid);
    }
    secrets_ = secrets_dir.empty() ? dir_ + "-secrets" : secrets_dir;
    const bool fresh = !fs::exists(data + "/PG_VERSION", ec);
    if (!fresh && !fs::exists(secrets_ + "/postgres-superuser", ec))
        return "the PostgreSQL data in " + data + " has no credentials in " + secrets_ +
               " (it was made by an older Armada, which let anyone on this machine in); remove it, or move it aside, "
               "and start again";
    std::string err;
    su_password_ = ensure_secret(secrets_ + "/postgres-superuser", err);
    if (su_password_.empty()) return err;
    app_password_ = ensure_secret(secrets_ + "/postgres", err);
    if (app_password_.empty()) return err;
    if (auto e = write_private(secrets_ + "/pgpass",
                               "127.0.0.1:" + std::to_string(port_) + ":*:" + kPgRole + ":" + app_password_ + "\n");
        !e.empty())
        return e;
    if (fresh) {
        // initdb reads the superuser's password from a file the postgres user can read, removed
        // straight after; every line of pg_hba.conf then asks for a SCRAM password.
        const std::string pwfile = dir_ + "/.initdb-pw";
        if (auto e = write_private(pwfile, su_password_ + "\n"); !e.empty()) return e;
        if (::geteuid() == 0) {
            if (const passwd * pw = ::getpwnam(kPgUser)) (void)::chown(pwfile.c_str(), pw->pw_uid, pw->pw_gid);
        }
        const int rc = run_command({bin + "/initdb", "-D", data, "-U", kPgAdmin, "--pwfile=" + pwfile, "-A",
                                    "scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"},
                                   dir_ + "/initdb.log", kPgUser, err);
        ::unlink(pwfile.c_str());
        if (rc != 0)
            return "initdb failed (" + (err.empty() ? std::to_string(rc) : err) + "): " + tail_of(dir_ + "/initdb.log");
    }
    if (auto e = launch(); !e.empty()) return e;
    return ensure_role();
}

std::string LocalPostgres::launch() {
    const std::string bin = bin_dir();
    std::string err;
    std::vector<std::string> argv = {bin + "/postgres", "-D", dir_ + "/data", "-p", std::to_string(port_), "-c",
                                     "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir_, "-c",
                                     "max_connections=300", "-c", "shared_buffers=64MB",
                                     // A checkpoint each 128 MB of WAL keeps a local server's disk
                                     // to a few hundred MB (the default lets WAL grow to 1 GB).
                                     "-c", "max_wal_size=128MB", "-c", "min_wal_size=32MB"};
    // Every TCP line asks for a SCRAM password; with TLS, only over TLS (hostssl).
    const std::string host_kind = tls_.on() ? "hostssl" : "host";
    if (auto e = write_private(dir_ + "/pg_hba.conf", "local all all scram-sha-256\n" + host_kind +
                                                          " all all 127.0.0.1/32 scram-sha-256\n" + host_kind +
                                                          " all all ::1/128 scram-sha-256\n");
        !e.empty())
        return e;
    argv.insert(argv.end(), {"-c", "hba_file=" + dir_ + "/pg_hba.conf"});
    if (tls_.on()) {
        // The server reads its key as its own user, and only a key no one else may read.
        for (const auto & [from, to] :
             {std::pair{tls_.cert_file, dir_ + "/server.crt"}, std::pair{tls_.key_file, dir_ + "/server.key"}}) {
            std::error_code ec;
            fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
            if (ec) return "cannot copy " + from + " for PostgreSQL: " + ec.message();
            ::chmod(to.c_str(), 0600);
        }
        argv.insert(argv.end(), {"-c", "ssl=on", "-c", "ssl_cert_file=" + dir_ + "/server.crt", "-c",
                                 "ssl_key_file=" + dir_ + "/server.key"});
    }
    if (::geteuid() == 0) {
        if (const passwd * pw = ::getpwnam(kPgUser))
            for (const char * f : {"/pg_hba.conf", "/server.crt", "/server.key"})
                (void)::chown((dir_ + f).c_str(), pw->pw_uid, pw->pw_gid);
    }
    child_ = Child::spawn(argv, dir_ + "/postgres.log", kPgUser, err);
    if (!child_) return "cannot start postgres: " + err;
    const std::string conninfo = "host=127.0.0.1 port=" + std::to_string(port_) + " user=" + kPgRole +
                                 " dbname=postgres connect_timeout=2" + client_tls_params(" ");
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
        if (!child_->running()) {
            child_.reset();
            return "postgres exited at start: " + tail_of(dir_ + "/postgres.log");
        }
        if (PQping(conninfo.c_str()) == PQPING_OK) return {};
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    child_->stop(SIGKILL, 5000);
    child_.reset();
    return "postgres did not accept connections within 60 s: " + tail_of(dir_ + "/postgres.log");
}

ServerTls make_local_tls(const std::string & dir, std::string & error) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    ::chmod(dir.c_str(), 0700);
    ServerTls t{dir + "/ca.crt", dir + "/server.crt", dir + "/server.key"};
    if (fs::exists(t.cert_file, ec) && fs::exists(t.ca_file, ec) && fs::exists(t.key_file, ec)) return t;
    const auto openssl = [&](std::vector<std::string> args) {
        args.insert(args.begin(), "/usr/bin/openssl");
        std::string err;
        if (run_command(args, dir + "/openssl.log", "", err) == 0) return true;
        error = "openssl failed (" + err + "): " + tail_of(dir + "/openssl.log");
        return false;
    };
    if (auto e = write_private(dir + "/san.cnf", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"); !e.empty()) {
        error = e;
        return {};
    }
    const std::vector<std::string> ec_key = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"};
    std::vector<std::string> ca = {"req", "-x509"};
    ca.insert(ca.end(), ec_key.begin(), ec_key.end());
    ca.insert(ca.end(),
              {"-keyout", dir + "/ca.key", "-out", t.ca_file, "-days", "825", "-subj", "/CN=armada local CA"});
    std::vector<std::string> csr = {"req", "-new"};
    csr.insert(csr.end(), ec_key.begin(), ec_key.end());
    csr.insert(csr.end(), {"-keyout", t.key_file, "-out", dir + "/server.csr", "-subj", "/CN=localhost"});
    if (!openssl(ca) || !openssl(csr) ||
        !openssl({"x509", "-req", "-in", dir + "/server.csr", "-CA", t.ca_file, "-CAkey", dir + "/ca.key",
                  "-CAcreateserial", "-out", t.cert_file, "-days", "825", "-extfile", dir + "/san.cnf"}))
        return {};
    for (const auto & f : {dir + "/ca.key", t.key_file})
        ::chmod(f.c_str(), 0600);
    return t;
}

std::string LocalPostgres::stop() {
    if (!child_) return {};
    // SIGINT is PostgreSQL's fast shutdown: sessions are disconnected, the data is flushed.
    const int code = child_->stop(SIGINT, 30000);
    child_.reset();
    return code == 0 ? std::string() : "postgres exited with " + std::to_string(code);
}

std::string LocalPostgres::restart() {
    if (auto e = stop(); !e.empty()) return e;
    return launch();
}

std::string LocalPostgres::superuser_conninfo(const std::string & db) const {
    return "host=127.0.0.1 port=" + std::to_string(port_) + " user=" + kPgAdmin + " password=" + su_password_ +
           " dbname=" + db + " connect_timeout=5" + client_tls_params(" ");
}

std::string LocalPostgres::client_tls_params(const char * sep) const {
    if (!tls_.on()) return {};
    const std::string s = sep;
    return s + "sslmode=verify-full" + (s == " " ? " " : "&") + "sslrootcert=" + tls_.ca_file;
}

std::string LocalPostgres::ensure_role() {
    PGconn * c = PQconnectdb(superuser_conninfo().c_str());
    std::string err;
    if (PQstatus(c) != CONNECTION_OK) {
        err = "PostgreSQL: the superuser cannot connect: " + std::string(PQerrorMessage(c));
    } else {
        // The application role: no superuser, no roles or databases of its own making; it owns
        // the databases made for it (create_database) and so its tables, and nothing else.
        // Sent as its SCRAM verifier, never as the password: a statement that fails is logged.
        char * verifier = PQencryptPasswordConn(c, app_password_.c_str(), kPgRole, "scram-sha-256");
        char * pw = verifier ? PQescapeLiteral(c, verifier, std::strlen(verifier)) : nullptr;
        PQfreemem(verifier);
        const std::string attrs =
            std::string(" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD ") +
            (pw ? pw : "''");
        PQfreemem(pw);
        PGresult * q = PQexec(c, ("SELECT 1 FROM pg_roles WHERE rolname = '" + std::string(kPgRole) + "'").c_str());
        const bool exists = PQresultStatus(q) == PGRES_TUPLES_OK && PQntuples(q) == 1;
        PQclear(q);
        PGresult * r = PQexec(c, ((exists ? "ALTER ROLE " : "CREATE ROLE ") + std::string(kPgRole) + attrs).c_str());
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            err = "PostgreSQL: cannot set up role armada: " + std::string(PQerrorMessage(c));
        PQclear(r);
        // The maintenance databases are the superuser's: by default PUBLIC may connect to them.
        for (const char * sql : {"REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC",
                                 "REVOKE CONNECT, TEMPORARY ON DATABASE template1 FROM PUBLIC"}) {
            if (!err.empty()) break;
            PGresult * v = PQexec(c, sql);
            if (PQresultStatus(v) != PGRES_COMMAND_OK)
                err = "PostgreSQL: cannot revoke PUBLIC's access: " + std::string(PQerrorMessage(c));
            PQclear(v);
        }
    }
    PQfinish(c);
    return err;
}

std::string LocalPostgres::create_database(const std::string & name) {
    PGconn * c = PQconnectdb(superuser_conninfo().c_str());
    std::string err;
    if (PQstatus(c) != CONNECTION_OK) {
        err = PQerrorMessage(c);
    } else {
        char * quoted = PQescapeIdentifier(c, name.c_str(), name.size());
        const std::string quoted_name = quoted ? quoted : "";
        PQfreemem(quoted);
        PGresult * r = PQexec(c, ("CREATE DATABASE " + quoted_name + " OWNER " + std::string(kPgRole)).c_str());
        const char * state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && !(state && std::string(state) == "42P04")) err = PQerrorMessage(c);
        PQclear(r);
        if (err.empty()) {
            // Only its owner (and the superuser) may connect: no other role sees Armada's tables.
            PGresult * v = PQexec(
                c, ("REVOKE CONNECT, TEMPORARY ON DATABASE " + std::string(quoted_name) + " FROM PUBLIC").c_str());
            if (PQresultStatus(v) != PGRES_COMMAND_OK) err = PQerrorMessage(c);
            PQclear(v);
        }
    }
    PQfinish(c);
    return err;
}

std::string LocalPostgres::url_via(int port, const std::string & db) const {
    // The password file says which host and port its password is for: the proxy's too.
    const std::string line = "127.0.0.1:" + std::to_string(port) + ":*:" + kPgRole + ":" + app_password_ + "\n";
    std::string have;
    {
        std::ifstream in(secrets_ + "/pgpass");
        std::stringstream ss;
        ss << in.rdbuf();
        have = ss.str();
    }
    if (have.find(line) == std::string::npos) write_private(secrets_ + "/pgpass", have + line);
    return std::string("postgres://") + kPgRole + "@127.0.0.1:" + std::to_string(port) + "/" + db +
           "?passfile=" + fs::absolute(secrets_ + "/pgpass").string() + client_tls_params("&");
}

std::string LocalPostgres::url(const std::string & db) const {
    return std::string("postgres://") + kPgRole + "@127.0.0.1:" + std::to_string(port_) + "/" + db +
           "?passfile=" + fs::absolute(secrets_ + "/pgpass").string() + client_tls_params("&");
}

// ---------------------------------------------------------------------------------------------
// etcd

std::string LocalEtcd::binary() {
    if (const char * e = std::getenv("ARMADA_ETCD_BIN"); e && *e) return e;
    return "/usr/bin/etcd";
}

LocalEtcd::~LocalEtcd() {
    if (child_) stop();
}

std::string LocalEtcd::start(const std::string & dir, int port) {
    if (::access(binary().c_str(), X_OK) != 0) return "etcd not found at " + binary() + " (install etcd-server)";
    dir_ = dir;
    port_ = port > 0 ? port : free_port();
    peer_port_ = free_port();
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) return "cannot create " + dir_ + ": " + ec.message();
    return launch();
}

std::string LocalEtcd::launch() {
    const std::string client_url = (tls_.on() ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::string err;
    std::vector<std::string> argv = {binary(),
                                     "--name",
                                     "armada",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     client_url,
                                     "--advertise-client-urls",
                                     client_url,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "armada=" + peer,
                                     "--log-level",
                                     "warn",
                                     "--logger",
                                     "zap"};
    // Without compaction every put stays in etcd's history until the quota (2 GiB by default)
    // fills, and then it refuses every write: at thousands of load reports a second that is
    // within the hour. Periodic compaction keeps `retention_` of history; a watcher further
    // behind lists again.
    argv.insert(argv.end(), {"--auto-compaction-mode", "periodic", "--auto-compaction-retention", retention_,
                             "--quota-backend-bytes", std::to_string(quota_bytes_)});
    if (tls_.on()) argv.insert(argv.end(), {"--cert-file", tls_.cert_file, "--key-file", tls_.key_file});
    child_ = Child::spawn(argv, dir_ + "/etcd.log", "", err);
    if (!child_) return "cannot start etcd: " + err;
    EtcdClient c = client(500);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < until) {
        if (!child_->running()) {
            child_.reset();
            return "etcd exited at start: " + tail_of(dir_ + "/etcd.log");
        }
        std::optional<EtcdKv> kv;
        const std::string e = c.get("/armada/ping", kv);
        // An etcd whose data has auth on (from an earlier run) answers, if only to refuse.
        if (e.empty() || (user_.empty() && (e.find("user name is empty") != std::string::npos ||
                                            e.find("permission denied") != std::string::npos)))
            return {};
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    child_->stop(SIGKILL, 5000);
    child_.reset();
    return "etcd did not answer within 30 s: " + tail_of(dir_ + "/etcd.log");
}

std::string LocalEtcd::stop() {
    if (!child_) return {};
    const int code = child_->stop(SIGTERM, 20000);
    child_.reset();
    return code == 0 || code == 128 + SIGTERM ? std::string() : "etcd exited with " + std::to_string(code);
}

std::string LocalEtcd::enable_auth(const std::string & secrets_dir, const std::string & user,
                                   const std::string & prefix) {
    std::string err;
    const std::string root_pw = ensure_secret(secrets_dir + "/etcd-root", err);
    if (root_pw.empty()) return err;
    const std::string pw = ensure_secret(secrets_dir + "/etcd", err);
    if (pw.empty()) return err;
    // A data directory whose etcd has auth on already (an earlier run): the user's own
    // credentials work, and there is nothing to add.
    EtcdClient mine = client(5000);
    mine.set_credentials(user, pw);
    std::optional<EtcdKv> kv;
    const std::string probe = mine.get(prefix + "/ping", kv);
    EtcdClient c = client(5000);
    c.set_credentials({}, {});
    // Each step is the JSON gateway's own route; "already exists" is not an error (a restart).
    auto step = [&](const std::string & path, const std::string & body) -> std::string {
        std::string reply;
        const std::string e = c.admin_call(path, body, reply);
        if (!e.empty() && e.find("already exists") == std::string::npos && e.find("already") == std::string::npos)
            return path + ": " + e;
        return {};
    };
    const std::string b_prefix = EtcdClient::base64(prefix), b_end = EtcdClient::base64(EtcdClient::prefix_end(prefix));
    const std::vector<std::pair<std::string, std::string>> steps = {
        {"/v3/auth/user/add", "{\"name\":\"root\",\"password\":\"" + root_pw + "\"}"},
        {"/v3/auth/role/add", "{\"name\":\"root\"}"},
        {"/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}"},
        {"/v3/auth/user/add", "{\"name\":\"" + user + "\",\"password\":\"" + pw + "\"}"},
        {"/v3/auth/role/add", "{\"name\":\"" + user + "\"}"},
        {"/v3/auth/role/grant", "{\"name\":\"" + user + "\",\"perm\":{\"permType\":\"READWRITE\",\"key\":\"" +
                                    b_prefix + "\",\"range_end\":\"" + b_end + "\"}}"},
        {"/v3/auth/user/grant", "{\"user\":\"" + user + "\",\"role\":\"" + user + "\"}"},
        {"/v3/auth/enable", "{}"},
    };
    if (!probe.empty()) {
        for (const auto & [path, body] : steps) {
            if (auto e = step(path, body); !e.empty()) return "etcd auth: " + e;
        }
    }
    secrets_ = secrets_dir;
    user_ = user;
    password_ = pw;
    return {};
}

EtcdClient LocalEtcd::client(int timeout_ms) const {
    EtcdClient c({endpoint()}, timeout_ms);
    c.set_credentials(user_, password_);
    if (tls_.on()) {
        ServiceCredentials sc;
        sc.ca_file = tls_.ca_file;
        std::string err;
        auto ctx = service_tls(sc, "etcd", err);
        c.set_tls(std::move(ctx), err);
    }
    return c;
}

std::string LocalEtcd::restart() {
    if (auto e = stop(); !e.empty()) return e;
    return launch();
}

std::string LocalEtcd::endpoint() const {
    return "127.0.0.1:" + std::to_string(port_);
}

// ---------------------------------------------------------------------------------------------
// NATS and Redis

bool port_open(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
}

LocalDaemon::~LocalDaemon() {
    if (child_) stop();
}

std::string LocalDaemon::password_file() const {
    return secrets_ + (kind_ == Kind::Nats ? "/nats" : "/redis");
}

std::string LocalDaemon::start(const std::string & dir, int port, const std::string & secrets_dir) {
    dir_ = dir;
    port_ = port > 0 ? port : free_port();
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) return "cannot create " + dir_ + ": " + ec.message();
    secrets_ = secrets_dir.empty() ? dir_ + "-secrets" : secrets_dir;
    std::string err;
    password_ = ensure_secret(password_file(), err);
    if (password_.empty()) return err;
    if (kind_ == Kind::Redis) {
        // No default user; `armada` may use the armada: keys and every command but the admin
        // ones (CONFIG, SHUTDOWN, DEBUG, MODULE, ACL, ...) and the flushes.
        if (auto e = write_private(dir_ + "/users.acl", "user default off\nuser " + user_ + " on >" + password_ +
                                                            " ~armada:* &* +@all -@admin -flushall -flushdb\n");
            !e.empty())
            return e;
    } else {
        // Armada's subjects, JetStream's API and acknowledgements, and reply inboxes; nothing else.
        const std::string conf =
            "authorization {\n  users = [\n    { user: \"" + user_ + "\", password: \"" + password_ +
            "\",\n      permissions: {\n"
            "        publish: [\"armada.>\", \"$JS.API.>\", \"$JS.ACK.>\", \"$JS.FC.>\", \"_INBOX.>\"]\n"
            "        subscribe: [\"armada.>\", \"_INBOX.>\"]\n      } }\n  ]\n}\n" +
            (tls_.on() ? "tls {\n  cert_file: \"" + tls_.cert_file + "\"\n  key_file: \"" + tls_.key_file + "\"\n}\n"
                       : std::string());
        if (auto e = write_private(dir_ + "/nats.conf", conf); !e.empty()) return e;
    }
    return launch();
}

std::string LocalDaemon::launch() {
    const bool nats = kind_ == Kind::Nats;
    const char * env = std::getenv(nats ? "ARMADA_NATS_BIN" : "ARMADA_REDIS_BIN");
    const std::string bin = env && *env ? env : nats ? "/usr/sbin/nats-server" : "/usr/bin/redis-server";
    const char * what = nats ? "nats-server" : "redis-server";
    if (::access(bin.c_str(), X_OK) != 0)
        return std::string(what) + " not found at " + bin + " (install " + (nats ? "nats-server" : "redis-server") +
               ")";
    std::vector<std::string> argv;
    if (nats) {
        argv = {bin,         "-c", dir_ + "/nats.conf",  "-js", "-sd", dir_ + "/jetstream", "-a",
                "127.0.0.1", "-p", std::to_string(port_)};
    } else {
        argv = {bin,  "--bind",    "127.0.0.1",        "--dir", dir_, "--save", "", "--appendonly", "no", "--daemonize",
                "no", "--aclfile", dir_ + "/users.acl"};
        if (tls_.on()) {
            // TLS only: no plain port. Clients show no certificate (they have a password).
            argv.insert(argv.end(), {"--port", "0", "--tls-port", std::to_string(port_), "--tls-cert-file",
                                     tls_.cert_file, "--tls-key-file", tls_.key_file, "--tls-ca-cert-file",
                                     tls_.ca_file, "--tls-auth-clients", "no"});
        } else {
            argv.insert(argv.end(), {"--port", std::to_string(port_)});
        }
    }
    std::string err;
    child_ = Child::spawn(argv, dir_ + "/" + what + ".log", "", err);
    if (!child_) return std::string("cannot start ") + what + ": " + err;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < until) {
        if (!child_->running()) {
            child_.reset();
            return std::string(what) + " exited at start: " + tail_of(dir_ + "/" + what + ".log");
        }
        if (port_open(port_)) return {};
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    child_->stop(SIGKILL, 5000);
    child_.reset();
    return std::string(what) + " did not listen within 30 s";
}

std::string LocalDaemon::stop() {
    if (!child_) return {};
    // nats-server exits 0 on SIGINT (1 on SIGTERM); redis-server saves nothing and exits 0 on either.
    const int code = child_->stop(SIGINT, 20000);
    child_.reset();
    return code == 0 || code == 128 + SIGTERM ? std::string() : "exited with " + std::to_string(code);
}

std::string LocalDaemon::restart() {
    if (auto e = stop(); !e.empty()) return e;
    return launch();
}

std::string LocalDaemon::url() const {
    return (kind_ == Kind::Nats ? "nats://127.0.0.1:" : "127.0.0.1:") + std::to_string(port_);
}

}  // namespace armada::cluster
