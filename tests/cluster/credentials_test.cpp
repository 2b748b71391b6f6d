// The cluster's servers as `cluster up` and the tests start them: each refuses a client without
// credentials, takes Armada's, and gives Armada's no more than it uses.
#include "cluster/cluster_config.h"
#include "cluster/local_servers.h"
#include "cluster/queue.h"
#include "cluster/redis.h"
#include "cluster/service_auth.h"
#include "routing/upstream.h"
#include "servers.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <nats/nats.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

using namespace armada;
namespace fs = std::filesystem;

namespace {

//! The server's answer to one query on a fresh connection, or the connection's error.
std::string pg_query(const std::string & conninfo, const std::string & sql) {
    PGconn * c = PQconnectdb(conninfo.c_str());
    std::string out;
    if (PQstatus(c) != CONNECTION_OK) {
        out = std::string("connect: ") + PQerrorMessage(c);
    } else {
        PGresult * r = PQexec(c, sql.c_str());
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0)
            out = PQgetvalue(r, 0, 0);
        else if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
            out = std::string("error: ") + PQerrorMessage(c);
        PQclear(r);
    }
    PQfinish(c);
    return out;
}

mode_t mode_of(const std::string & path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 0777) : 0;
}

}  // namespace

TEST(Credentials, PostgresAsksEveryoneForAPasswordAndItsApplicationRoleIsNoSuperuser) {
    cluster::LocalPostgres pg;
    const std::string root = servers().root + "/pg-credentials";
    ASSERT_EQ(pg.start(root), "");
    ASSERT_EQ(pg.create_database("app"), "");
    const std::string port = std::to_string(pg.port());
    // No password: refused, for the application role and for the superuser, over TCP and over
    // the Unix socket (no `trust` line anywhere).
    for (const std::string & who : {"armada", "armada_admin", "postgres"}) {
        const std::string tcp = pg_query("host=127.0.0.1 port=" + port + " user=" + who + " dbname=app", "SELECT 1");
        EXPECT_EQ(tcp.rfind("connect:", 0), 0u) << who << " over TCP: " << tcp;
        const std::string sock =
            pg_query("host=" + root + " port=" + port + " user=" + who + " dbname=app", "SELECT 1");
        EXPECT_EQ(sock.rfind("connect:", 0), 0u) << who << " over the socket: " << sock;
    }
    EXPECT_EQ(pg_query(pg.url("app"), "SELECT 1"), "1");
    // The file the server reads (hba_file), as it says.
    const std::string hba_file = pg_query(pg.superuser_conninfo("app"), "SHOW hba_file");
    ASSERT_EQ(hba_file, root + "/pg_hba.conf");
    std::ifstream hba(hba_file);
    const std::string hba_text((std::istreambuf_iterator<char>(hba)), {});
    for (size_t at = 0; (at = hba_text.find("trust", at)) != std::string::npos; ++at) {
        const size_t line = hba_text.rfind('\n', at);
        EXPECT_EQ(hba_text[line + 1], '#') << "a trust line in pg_hba.conf";
    }
    // The application role: no superuser, and so no program run as the server's user.
    EXPECT_EQ(pg_query(pg.url("app"), "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user"), "false");
    const std::string prog = pg_query(pg.url("app"), "COPY (SELECT 1) TO PROGRAM 'id'");
    EXPECT_EQ(prog.rfind("error:", 0), 0u) << prog;
    EXPECT_EQ(pg_query(pg.url("app"), "CREATE ROLE intruder SUPERUSER").rfind("error:", 0), 0u);
    // The superuser's maintenance database takes no one else; nor does Armada's take other roles.
    const std::string maint = pg.url("app");
    const std::string to_postgres = pg_query(
        maint.substr(0, maint.find("/app?")) + "/postgres" + maint.substr(maint.find("/app?") + 4), "SELECT 1");
    EXPECT_NE(to_postgres.find("permission denied for database"), std::string::npos) << to_postgres;
    EXPECT_EQ(pg_query(pg.superuser_conninfo("app"), "SELECT has_database_privilege('public', 'app', 'CONNECT')::text"),
              "false");
    // It owns its database, so it makes its tables there.
    EXPECT_EQ(pg_query(pg.url("app"), "CREATE TABLE t (x int)"), "");
    // Secrets: 0600 files in a 0700 directory, and the URL names the passfile, not a password.
    for (const char * f : {"postgres", "postgres-superuser", "pgpass"})
        EXPECT_EQ(mode_of(pg.secrets_dir() + "/" + f), 0600u) << f;
    EXPECT_EQ(mode_of(pg.secrets_dir()), 0700u);
    std::ifstream app(pg.secrets_dir() + "/postgres");
    std::string password;
    std::getline(app, password);
    ASSERT_FALSE(password.empty());
    EXPECT_EQ(pg.url("app").find(password), std::string::npos);
}

namespace {
cluster::ServiceCredentials wrong_password() {
    cluster::ServiceCredentials c;
    c.user = "armada";
    c.password = "wrong";
    return c;
}
}  // namespace

TEST(Credentials, RedisRefusesAClientWithoutItsPasswordAndKeepsArmadasUserToItsKeys) {
    std::string err;
    EXPECT_FALSE(cluster::RedisPool::open(servers().redis.url(), 1, 1000, err)) << "no credentials";
    EXPECT_NE(err.find("NOAUTH"), std::string::npos) << err;
    EXPECT_FALSE(cluster::RedisPool::open(servers().redis.url(), 1, 1000, err, wrong_password()));
    EXPECT_NE(err.find("refused user 'armada'"), std::string::npos) << err;
    EXPECT_EQ(err.find("wrong"), std::string::npos) << "the error never shows the password: " << err;
    auto p = cluster::RedisPool::open(servers().redis.url(), 1, 1000, err, servers().redis.credentials());
    ASSERT_TRUE(p) << err;
    EXPECT_TRUE(p->set("armada:t:x:probe", "1", 10000));
    EXPECT_FALSE(p->set("other:probe", "1", 10000)) << "a key outside armada: is refused";
    // An admin command, as Armada's user: refused.
    redisContext * c = redisConnect("127.0.0.1", servers().redis.port());
    ASSERT_TRUE(c && !c->err);
    auto * a = static_cast<redisReply *>(
        redisCommand(c, "AUTH %s %s", servers().redis.user().c_str(), servers().redis.password().c_str()));
    ASSERT_TRUE(a && a->type == REDIS_REPLY_STATUS);
    freeReplyObject(a);
    for (const char * cmd : {"CONFIG GET dir", "FLUSHALL", "SHUTDOWN NOSAVE", "ACL LIST"}) {
        auto * r = static_cast<redisReply *>(redisCommand(c, cmd));
        ASSERT_TRUE(r) << cmd;
        EXPECT_EQ(r->type, REDIS_REPLY_ERROR) << cmd;
        freeReplyObject(r);
    }
    redisFree(c);
    EXPECT_EQ(mode_of(servers().redis.password_file()), 0600u);
}

TEST(Credentials, NatsRefusesAClientWithoutItsPasswordAndKeepsArmadasUserToItsSubjects) {
    std::string err;
    EXPECT_FALSE(cluster::JetStream::connect(servers().nats.url(), err)) << "no credentials";
    EXPECT_FALSE(err.empty());
    EXPECT_FALSE(cluster::JetStream::connect(servers().nats.url(), err, wrong_password()));
    EXPECT_EQ(err.find("wrong"), std::string::npos) << err;
    auto js = cluster::JetStream::connect(servers().nats.url(), err, servers().nats.credentials());
    ASSERT_TRUE(js) << err;
    EXPECT_EQ(mode_of(servers().nats.password_file()), 0600u);
    // As Armada's user: its own subjects, yes; any other, no. The server answers a violation
    // before the PONG that ends a flush.
    natsOptions * o = nullptr;
    ASSERT_EQ(natsOptions_Create(&o), NATS_OK);
    natsOptions_SetURL(o, servers().nats.url().c_str());
    natsOptions_SetUserInfo(o, servers().nats.user().c_str(), servers().nats.password().c_str());
    natsConnection * nc = nullptr;
    ASSERT_EQ(natsConnection_Connect(&nc, o), NATS_OK);
    natsOptions_Destroy(o);
    const auto last_error = [&] {
        const char * text = nullptr;
        const natsStatus st = natsConnection_GetLastError(nc, &text);
        return st == NATS_OK ? std::string() : std::string(text ? text : "error");
    };
    EXPECT_EQ(natsConnection_PublishString(nc, "armada.probe", "x"), NATS_OK);
    EXPECT_EQ(natsConnection_FlushTimeout(nc, 2000), NATS_OK);
    EXPECT_EQ(last_error(), "") << "armada.> is Armada's";
    natsConnection_PublishString(nc, "other.probe", "x");
    natsConnection_FlushTimeout(nc, 2000);
    const std::string pub = last_error();
    EXPECT_NE(pub.find("Permissions Violation"), std::string::npos) << "a publish outside armada.>: " << pub;
    natsConnection_Destroy(nc);
}

TEST(Credentials, AClusterFileReadsEachPasswordFromAPrivateFileAndRefusesOneOthersMayRead) {
    const std::string dir = servers().root + "/cfg-credentials";
    fs::create_directories(dir);
    const std::string pw = dir + "/redis";
    ASSERT_EQ(cluster::write_private(pw, "s3cret\n"), "");
    const std::string base = "etcd: [127.0.0.1:2379]\npostgres: [postgres://a@h/d]\n";
    std::string err;
    auto c =
        cluster::parse_cluster_config(base + "credentials:\n  redis: {user: armada, password_file: " + pw + "}\n", err);
    ASSERT_TRUE(c) << err;
    EXPECT_EQ(c->redis_auth.user, "armada");
    EXPECT_EQ(c->redis_auth.password, "s3cret");
    ::chmod(pw.c_str(), 0644);
    EXPECT_FALSE(cluster::parse_cluster_config(
        base + "credentials:\n  redis: {user: armada, password_file: " + pw + "}\n", err));
    EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
    EXPECT_EQ(err.find("s3cret"), std::string::npos);
    EXPECT_FALSE(
        cluster::parse_cluster_config(base + "credentials:\n  mysql: {user: a, password_file: " + pw + "}\n", err));
    EXPECT_NE(err.find("unknown server 'mysql'"), std::string::npos) << err;
}

TEST(Credentials, EtcdWithAuthOnRefusesAClientWithoutCredentialsAndKeepsArmadaToItsPrefix) {
    cluster::LocalEtcd etcd;
    const std::string root = servers().root + "/etcd-credentials";
    ASSERT_EQ(etcd.start(root + "/etcd"), "");
    ASSERT_EQ(etcd.enable_auth(root + "/secrets", "armada", "/armada"), "");
    std::ifstream pf(root + "/secrets/etcd");
    std::string password;
    std::getline(pf, password);
    ASSERT_FALSE(password.empty());
    EXPECT_EQ(mode_of(root + "/secrets/etcd"), 0600u);

    cluster::EtcdClient anon({etcd.endpoint()}, 3000);
    EXPECT_NE(anon.put("/armada/x", "1"), "") << "no credentials, no write";
    std::optional<cluster::EtcdKv> kv;
    EXPECT_NE(anon.get("/armada/x", kv), "") << "no credentials, no read";

    cluster::EtcdClient wrong({etcd.endpoint()}, 3000);
    wrong.set_credentials("armada", "not-it");
    const std::string e = wrong.put("/armada/x", "1");
    EXPECT_NE(e.find("refused user 'armada'"), std::string::npos) << e;
    EXPECT_EQ(e.find("not-it"), std::string::npos) << "the password never shows: " << e;

    cluster::EtcdClient c({etcd.endpoint()}, 3000);
    c.set_credentials("armada", password);
    EXPECT_EQ(c.put("/armada/cells/c0/nodes/n1", "v"), "");
    ASSERT_EQ(c.get("/armada/cells/c0/nodes/n1", kv), "");
    ASSERT_TRUE(kv);
    EXPECT_EQ(kv->value, "v");
    int64_t lease = 0;
    EXPECT_EQ(c.grant(5, lease), "");
    EXPECT_NE(lease, 0);
    std::vector<cluster::EtcdKv> kvs;
    int64_t rev = 0;
    EXPECT_EQ(c.list("/armada/", kvs, rev), "");
    EXPECT_EQ(kvs.size(), 1u);
    // Outside its prefix: refused, read and write.
    EXPECT_NE(c.put("/other/x", "1"), "");
    EXPECT_NE(c.get("/other/x", kv), "");
    EXPECT_EQ(etcd.stop(), "");
}

TEST(Credentials, AClusterFileTakesACaAndAClientCertificatePerServerAndChecksThemWhenRead) {
    const std::string dir = servers().root + "/cfg-tls";
    fs::create_directories(dir);
    // A CA and a client certificate it signed, made with the openssl command.
    std::string err;
    const auto ossl = [&](std::vector<std::string> args) {
        args.insert(args.begin(), "/usr/bin/openssl");
        return cluster::run_command(args, dir + "/openssl.log", "", err);
    };
    ASSERT_EQ(ossl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                    dir + "/ca.key", "-out", dir + "/ca.crt", "-days", "2", "-subj", "/CN=test CA"}),
              0)
        << cluster::tail_of(dir + "/openssl.log");
    ASSERT_EQ(ossl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                    dir + "/client.key", "-out", dir + "/client.crt", "-days", "2", "-subj", "/CN=client"}),
              0);
    ::chmod((dir + "/client.key").c_str(), 0600);
    const std::string pw = dir + "/pw";
    ASSERT_EQ(cluster::write_private(pw, "s3cret\n"), "");
    const std::string base = "etcd: [127.0.0.1:2379]\npostgres: [postgres://a@h/d, \"postgres://a@h/e?passfile=/p\"]\n";
    const std::string tls =
        "ca_file: " + dir + "/ca.crt, cert_file: " + dir + "/client.crt, key_file: " + dir + "/client.key";
    auto c =
        cluster::parse_cluster_config(base + "credentials:\n  nats: {user: armada, password_file: " + pw + ", " + tls +
                                          "}\n  postgres: {" + tls + "}\n  etcd: {ca_file: " + dir + "/ca.crt}\n",
                                      err);
    ASSERT_TRUE(c) << err;
    EXPECT_TRUE(c->nats_auth.tls());
    EXPECT_EQ(c->nats_auth.cert_file, dir + "/client.crt");
    EXPECT_TRUE(c->etcd_auth.tls());
    EXPECT_TRUE(c->etcd_auth.user.empty()) << "TLS alone, no password";
    EXPECT_FALSE(c->redis_auth.tls());
    // libpq's own TLS settings go on each PostgreSQL URL.
    EXPECT_EQ(c->postgres[0], "postgres://a@h/d?sslmode=verify-full&sslrootcert=" + dir + "/ca.crt&sslcert=" + dir +
                                  "/client.crt&sslkey=" + dir + "/client.key");
    EXPECT_EQ(c->postgres[1].rfind("postgres://a@h/e?passfile=/p&sslmode=verify-full&", 0), 0u) << c->postgres[1];

    const auto refused = [&](const std::string & creds, const std::string & why) {
        EXPECT_FALSE(cluster::parse_cluster_config(base + "credentials:\n" + creds + "\n", err)) << creds;
        EXPECT_NE(err.find(why), std::string::npos) << err;
    };
    refused("  redis: {ca_file: " + dir + "/nothing.crt}", "credentials.redis.ca_file: cannot read");
    refused("  redis: {cert_file: " + dir + "/client.crt}", "cert_file and key_file go together");
    refused("  redis: {ca_file: " + pw + "}", "credentials.redis: ca_file");  // not PEM
    refused("  postgres: {user: a, ca_file: " + dir + "/ca.crt}", "unknown setting 'user'");
    refused("  postgres: {cert_file: " + dir + "/client.crt, key_file: " + dir + "/client.key}", "name the CA");
    ::chmod((dir + "/client.key").c_str(), 0644);
    refused("  nats: {" + tls + "}", "chmod 600");
}

TEST(Credentials, EveryClientRefusesAServerWhoseCertificateAnotherCaSigned) {
    // Two CAs: the servers show a certificate from `ours`; a client that trusts only `theirs`
    // (a server on the network impersonating the cluster's, as it would see it) must not talk.
    std::string err;
    const std::string root = servers().root + "/foreign-ca";
    const cluster::ServerTls ours = cluster::make_local_tls(root + "/ours", err);
    ASSERT_TRUE(ours.on()) << err;
    const cluster::ServerTls theirs = cluster::make_local_tls(root + "/theirs", err);
    ASSERT_TRUE(theirs.on()) << err;
    EXPECT_EQ(mode_of(ours.key_file), 0600u);
    EXPECT_EQ(mode_of(root + "/ours/ca.key"), 0600u);

    cluster::LocalDaemon nats(cluster::LocalDaemon::Kind::Nats), redis(cluster::LocalDaemon::Kind::Redis);
    cluster::LocalEtcd etcd;
    nats.use_tls(ours);
    redis.use_tls(ours);
    etcd.use_tls(ours);
    ASSERT_EQ(nats.start(root + "/nats"), "");
    ASSERT_EQ(redis.start(root + "/redis"), "");
    ASSERT_EQ(etcd.start(root + "/etcd"), "");

    auto trusting = [](cluster::ServiceCredentials c, const cluster::ServerTls & ca) {
        c.ca_file = ca.ca_file;
        return c;
    };
    // NATS and Redis: the right password is not enough with the wrong CA.
    EXPECT_FALSE(cluster::JetStream::connect(nats.url(), err, trusting(nats.credentials(), theirs)));
    EXPECT_FALSE(err.empty());
    EXPECT_TRUE(cluster::JetStream::connect(nats.url(), err, trusting(nats.credentials(), ours))) << err;
    EXPECT_FALSE(cluster::RedisPool::open(redis.url(), 1, 2000, err, trusting(redis.credentials(), theirs)));
    EXPECT_NE(err.find("credentials.redis.ca_file"), std::string::npos) << err;
    EXPECT_TRUE(cluster::RedisPool::open(redis.url(), 1, 2000, err, trusting(redis.credentials(), ours))) << err;
    // etcd.
    const auto etcd_client = [&](const cluster::ServerTls & ca) {
        cluster::EtcdClient c({etcd.endpoint()}, 3000);
        cluster::ServiceCredentials sc;
        sc.ca_file = ca.ca_file;
        std::string e;
        auto ctx = cluster::service_tls(sc, "etcd", e);
        c.set_tls(std::move(ctx), e);
        return c;
    };
    auto foreign = etcd_client(theirs);
    const std::string refused = foreign.put("/armada/probe", "1");
    EXPECT_NE(refused.find("is not signed by a trusted CA"), std::string::npos) << refused;
    EXPECT_NE(refused.find("credentials.etcd.ca_file"), std::string::npos) << refused;
    auto member = etcd_client(ours);
    EXPECT_EQ(member.put("/armada/probe", "1"), "");

    // The gateway's forward() to a node over HTTPS (openssl's own test server stands in for the
    // node: only the handshake matters here).
    const int port = cluster::free_port();
    auto node = cluster::Child::spawn({"/usr/bin/openssl", "s_server", "-quiet", "-www", "-accept",
                                       std::to_string(port), "-cert", ours.cert_file, "-key", ours.key_file},
                                      root + "/s_server.log", "", err);
    ASSERT_TRUE(node) << err;
    for (int i = 0; i < 200 && !cluster::port_open(port); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
    const std::string base = "https://127.0.0.1:" + std::to_string(port);
    const auto forward_trusting = [&](const cluster::ServerTls & ca) {
        cluster::ServiceCredentials sc;
        sc.ca_file = ca.ca_file;
        std::string e;
        routing::set_upstream_tls(cluster::service_tls(sc, "credentials.nodes", e));
        return routing::forward(base, "GET", "/", {}, "", 3000);
    };
    const auto to_foreign = forward_trusting(theirs);
    EXPECT_EQ(to_foreign.status, 0);
    EXPECT_NE(to_foreign.error.find("is not signed by a trusted CA"), std::string::npos) << to_foreign.error;
    EXPECT_NE(to_foreign.error.find("credentials.nodes.ca_file"), std::string::npos) << to_foreign.error;
    const auto to_member = forward_trusting(ours);
    EXPECT_EQ(to_member.status, 200) << to_member.error;
    routing::set_upstream_tls(nullptr);
    node->stop(SIGTERM, 5000);
    EXPECT_EQ(etcd.stop(), "");
    EXPECT_EQ(redis.stop(), "");
    EXPECT_EQ(nats.stop(), "");
}
