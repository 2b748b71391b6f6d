#pragma once

#include <boost/asio/ssl/context.hpp>

#include <memory>
#include <string>

namespace armada::cluster {

//! A TLS connection for a client library that speaks plain TCP only (hiredis 0.14, as Debian 12
//! ships it): connects to host:port, makes the TLS handshake with `tls` (the certificate must
//! name `host`), and returns one end of a socket pair for the library to use as its socket; a
//! thread of its own relays between that pair and the TLS connection, and ends when either side
//! closes. -1 with `error` in words when the connection or the handshake fails within
//! `timeout_ms`.
int open_tls_relay(const std::string & host, int port, const std::shared_ptr<boost::asio::ssl::context> & tls,
                   int timeout_ms, std::string & error);

}  // namespace armada::cluster
