#pragma once

// Client TLS for every outgoing connection: the context, the host-name check, and a failed
// handshake explained in words. Which CA a client trusts is its caller's policy (tools: the
// system store and --tool-ca-file; cluster: credentials.*.ca_file).

#include <boost/asio/ssl/context.hpp>

#include <memory>
#include <string>

namespace armada::net {

//! TLS for outgoing calls: TLS 1.2 or later, the peer's certificate checked against the system CA
//! store (Debian's ca-certificates) plus `extra_ca_file` (PEM, may be empty), and the host name
//! checked against the certificate (expect_peer_name). Returns null and sets `err` on a bad file;
//! `ca_setting` names the setting that gave the file.
std::shared_ptr<boost::asio::ssl::context> client_tls(const std::string & extra_ca_file, std::string & err,
                                                      const std::string & ca_setting = "--tool-ca-file");

//! Makes the handshake on `native_ssl` (an SSL*) check that the certificate names `host` (a DNS
//! name, or an IP address in the certificate's IP entries), and sends SNI for a name.
void expect_peer_name(void * native_ssl, const std::string & host);

//! What went wrong in a TLS handshake, in words a user can act on (expired, untrusted, wrong
//! host name), from the error and the verification result of `native` (an SSL*). `ca_setting`
//! names where the user adds a CA for this client.
std::string tls_failure(const boost::system::error_code & ec, void * native_ssl, const std::string & host,
                        const std::string & ca_setting = "--tool-ca-file");

}  // namespace armada::net
