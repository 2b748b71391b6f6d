// http_download (a moving session's KV journal between nodes) against the real HTTP server: a
// body streamed to a file, a transfer that breaks off, a reply refused by its headers.
#include "api/http_server.h"
#include "tools/http_sync.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

using namespace armada;

namespace {

tools::SsrfGuard allow_all() {
    tools::SsrfGuard g;
    for (const char * all : {"0.0.0.0/0", "::/0"}) {
        tools::Cidr c;
        if (tools::parse_cidr(all, c)) g.allow(c);
    }
    return g;
}

std::string piece(size_t i, size_t n) {
    std::string s(n, char('a' + i % 26));
    s[0] = char('0' + i % 10);
    return s;
}

std::string temp_file(const char * name) {
    return (std::filesystem::temp_directory_path() / (std::string(name) + "." + std::to_string(::getpid()))).string();
}

std::string slurp(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Serves `pieces` of 1 MiB as a stream, paced on the client's reading; `cut_at`: aborts there.
struct Source {
    explicit Source(size_t pieces, size_t cut_at = SIZE_MAX, int status = 200)
        : http(cfg(), [this, pieces, cut_at, status](api::HttpRequest &&, std::shared_ptr<api::Responder> out) {
              if (status != 200) {
                  out->send(status, "application/json", R"({"error":"no such session"})");
                  return;
              }
              writer = std::thread([this, out, pieces, cut_at] {
                  out->start_stream(
                      200, {{"Content-Type", "application/octet-stream"}, {"X-Size", std::to_string(pieces << 20)}});
                  for (size_t i = 0; i < pieces && !out->closed(); ++i) {
                      while (out->backlog() > (4u << 20))
                          std::this_thread::sleep_for(std::chrono::milliseconds(1));
                      max_backlog = std::max(max_backlog.load(), out->backlog());
                      if (i == cut_at) {
                          out->abort();
                          return;
                      }
                      out->write(piece(i, 1u << 20));
                  }
                  out->end();
              });
          }) {
        EXPECT_EQ(http.listen(), "");
        http.run();
        url = "http://127.0.0.1:" + std::to_string(http.port()) + "/admin/kv/s1";
    }
    ~Source() {
        if (writer.joinable()) writer.join();
        http.stop();
    }
    static api::HttpConfig cfg() {
        api::HttpConfig c;
        c.port = 0;
        c.max_stream_backlog = 8u << 20;
        return c;
    }
    api::HttpServer http;
    std::thread writer;
    std::atomic<size_t> max_backlog{0};
    std::string url;
};

}  // namespace

TEST(HttpDownload, StreamsALargeBodyToAFileWithTheSenderPacedOnTheReader) {
    Source src(24);
    const std::string path = temp_file("armada-dl");
    tools::DownloadOptions o;
    std::string seen_size;
    o.check = [&](int status, const std::map<std::string, std::string> & h) {
        EXPECT_EQ(status, 200);
        seen_size = h.count("x-size") ? h.at("x-size") : "";
        return std::string();
    };
    const auto d = tools::http_download(src.url, {}, path, o, allow_all());
    EXPECT_EQ(d.error, "");
    EXPECT_EQ(d.status, 200);
    EXPECT_EQ(d.bytes, 24u << 20);
    EXPECT_EQ(seen_size, std::to_string(24u << 20));
    std::string want;
    for (size_t i = 0; i < 24; ++i)
        want += piece(i, 1u << 20);
    EXPECT_TRUE(slurp(path) == want) << "the file differs from what was sent";
    // The sender never queued past its pace (a backlog over 8 MiB would have closed the stream).
    EXPECT_LE(src.max_backlog.load(), size_t(5u << 20));
    std::filesystem::remove(path);
}

TEST(HttpDownload, ATransferThatBreaksOffIsAnError) {
    Source src(16, 8);
    const std::string path = temp_file("armada-dl-cut");
    const auto t0 = std::chrono::steady_clock::now();
    const auto d = tools::http_download(src.url, {}, path, {}, allow_all());
    // At once, from the closed connection, not after the idle timeout.
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
    EXPECT_NE(d.error.find("broke off"), std::string::npos) << d.error;
    EXPECT_LT(d.bytes, 16u << 20);
    std::filesystem::remove(path);
}

TEST(HttpDownload, AReplyItsCheckRefusesStopsBeforeTheBody) {
    Source src(4);
    const std::string path = temp_file("armada-dl-refused");
    std::filesystem::remove(path);
    tools::DownloadOptions o;
    o.check = [](int, const std::map<std::string, std::string> &) { return std::string("fingerprint differs"); };
    const auto d = tools::http_download(src.url, {}, path, o, allow_all());
    EXPECT_EQ(d.error, "fingerprint differs");
    EXPECT_EQ(d.bytes, 0u);
    EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(HttpDownload, AnErrorReplyQuotesItsBody) {
    Source src(1, SIZE_MAX, 404);
    const std::string path = temp_file("armada-dl-404");
    const auto d = tools::http_download(src.url, {}, path, {}, allow_all());
    EXPECT_EQ(d.status, 404);
    EXPECT_NE(d.error.find("HTTP 404"), std::string::npos) << d.error;
    EXPECT_NE(d.error.find("no such session"), std::string::npos) << d.error;
    std::filesystem::remove(path);
}

TEST(HttpDownload, NoListenerIsAnErrorNotAHang) {
    tools::DownloadOptions o;
    o.connect_timeout_ms = 2000;
    const auto d =
        tools::http_download("http://127.0.0.1:1/admin/kv/s1", {}, temp_file("armada-dl-none"), o, allow_all());
    EXPECT_NE(d.error.find("cannot connect"), std::string::npos) << d.error;
}
