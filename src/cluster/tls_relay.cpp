#include "cluster/tls_relay.h"

#include "net/tls.h"

#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

namespace armada::cluster {

namespace {

//! A TCP connection to host:port within `timeout_ms`, or -1 with `error`.
int connect_tcp(const std::string & host, int port, int timeout_ms, std::string & error) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * res = nullptr;
    if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
        error = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
        return -1;
    }
    int fd = -1;
    error = "no address";
    for (addrinfo * a = res; a && fd < 0; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            error = std::strerror(errno);
            ::close(fd);
            fd = -1;
            continue;
        }
        pollfd p{fd, POLLOUT, 0};
        int soerr = 0;
        socklen_t len = sizeof soerr;
        if (::poll(&p, 1, timeout_ms) != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
            error = soerr ? std::strerror(soerr) : "no answer in time";
            ::close(fd);
            fd = -1;
        }
    }
    ::freeaddrinfo(res);
    return fd;
}

//! Waits until `fd` can be read (`want_read`) or written, up to `ms`.
bool wait_fd(int fd, bool want_read, int ms) {
    pollfd p{fd, short(want_read ? POLLIN : POLLOUT), 0};
    return ::poll(&p, 1, ms) == 1;
}

//! Relays between `plain` (the library's side) and `ssl` until either closes; then frees both.
void relay(int plain, SSL * ssl, int tcp, std::shared_ptr<boost::asio::ssl::context> keep) {
    (void)keep;  // the context outlives the connection
    char buf[16384];
    bool open = true;
    while (open) {
        pollfd fds[2] = {{plain, POLLIN, 0}, {tcp, POLLIN, 0}};
        // Bytes OpenSSL has decrypted already are read before waiting for more.
        if (SSL_pending(ssl) == 0 && ::poll(fds, 2, -1) < 0 && errno != EINTR) break;
        if (SSL_pending(ssl) > 0 || (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            const int n = SSL_read(ssl, buf, sizeof buf);
            if (n > 0) {
                for (int off = 0; off < n && open;) {
                    const ssize_t w = ::send(plain, buf + off, size_t(n - off), MSG_NOSIGNAL);
                    if (w > 0)
                        off += int(w);
                    else if (w < 0 && (errno == EAGAIN || errno == EINTR))
                        wait_fd(plain, false, 1000);
                    else
                        open = false;
                }
            } else {
                // WANT_READ: a record not whole yet, or one with no data for us (TLS 1.3's session
                // tickets): the next poll waits for either side again.
                const int e = SSL_get_error(ssl, n);
                if (e == SSL_ERROR_WANT_WRITE)
                    wait_fd(tcp, false, 1000);
                else if (e != SSL_ERROR_WANT_READ)
                    open = false;  // closed, or broken
            }
        }
        if (open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            const ssize_t n = ::recv(plain, buf, sizeof buf, 0);
            if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
                open = false;  // the library closed its socket
            } else if (n > 0) {
                // A server that takes nothing for 30 s is given up on (the library's own timeout
                // has long passed).
                const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
                for (int off = 0; off < n && open;) {
                    const int w = SSL_write(ssl, buf + off, int(n - off));
                    if (w > 0) {
                        off += w;
                        continue;
                    }
                    const int e = SSL_get_error(ssl, w);
                    if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) ||
                        std::chrono::steady_clock::now() > until)
                        open = false;
                    else
                        wait_fd(tcp, e == SSL_ERROR_WANT_READ, 1000);
                }
            }
        }
    }
    SSL_shutdown(ssl);
    SSL_free(ssl);
    ::close(tcp);
    ::close(plain);
}

}  // namespace

int open_tls_relay(const std::string & host, int port, const std::shared_ptr<boost::asio::ssl::context> & tls,
                   int timeout_ms, std::string & error) {
    const int tcp = connect_tcp(host, port, timeout_ms, error);
    if (tcp < 0) return -1;
    SSL * ssl = SSL_new(tls->native_handle());
    if (!ssl) {
        ::close(tcp);
        error = "out of memory";
        return -1;
    }
    SSL_set_fd(ssl, tcp);
    armada::net::expect_peer_name(ssl, host);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        ERR_clear_error();
        const int rc = SSL_connect(ssl);
        if (rc == 1) break;
        const int e = SSL_get_error(ssl, rc);
        const int left = int(
            std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count());
        if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && left > 0 &&
            wait_fd(tcp, e == SSL_ERROR_WANT_READ, left))
            continue;
        const boost::system::error_code ec(int(ERR_get_error()), boost::asio::error::get_ssl_category());
        error = left <= 0 ? std::string("TLS handshake: no answer in time")
                          : armada::net::tls_failure(ec, ssl, host, "credentials.redis.ca_file");
        SSL_free(ssl);
        ::close(tcp);
        return -1;
    }
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        error = std::strerror(errno);
        SSL_free(ssl);
        ::close(tcp);
        return -1;
    }
    try {
        std::thread(relay, pair[1], ssl, tcp, tls).detach();
    } catch (const std::system_error & e) {
        error = std::string("no thread for the TLS relay: ") + e.what();
        SSL_free(ssl);
        ::close(tcp);
        ::close(pair[0]);
        ::close(pair[1]);
        return -1;
    }
    return pair[0];
}

}  // namespace armada::cluster
