#pragma once

#include <boost/asio/ssl/context.hpp>

#include <memory>
#include <string>

namespace armada::cluster {

//! How a process proves itself to one of the cluster's servers, and how it knows the server
//! (`credentials:` in the cluster file). The password lives in a file of its own, mode 0600,
//! named here; the file is read when the cluster file is. With a CA (or a client certificate)
//! the connection is TLS, and the server's certificate must name the host it is reached at.
//!
//!     credentials:
//!       redis: {user: armada, password_file: /var/lib/armada/secrets/redis,
//!               ca_file: /etc/armada/ca.crt, cert_file: /etc/armada/client.crt, key_file: ...}
struct ServiceCredentials {
    std::string user;
    std::string password_file;
    std::string password;             // read from password_file
    std::string ca_file;              // PEM; trusted besides the system's CA store
    std::string cert_file, key_file;  // a client certificate, for servers that ask for one
    bool empty() const { return user.empty() && password.empty(); }
    bool tls() const { return !ca_file.empty() || !cert_file.empty(); }
};

//! The TLS client context for a server with these settings (TLS 1.2 or later, the server's
//! certificate checked against the system store and `ca_file`, and the client certificate when
//! one is named); null with `error` set when a file cannot be used. `what` names the server in
//! the error.
std::shared_ptr<boost::asio::ssl::context> service_tls(const ServiceCredentials & c, const std::string & what,
                                                       std::string & error);

}  // namespace armada::cluster
