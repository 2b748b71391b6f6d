#include "cluster/service_auth.h"

#include "net/tls.h"

namespace armada::cluster {

std::shared_ptr<boost::asio::ssl::context> service_tls(const ServiceCredentials & c, const std::string & what,
                                                       std::string & error) {
    std::string err;
    auto ctx = armada::net::client_tls({}, err);
    if (!ctx) {
        error = what + ": " + err;
        return nullptr;
    }
    boost::system::error_code ec;
    if (!c.ca_file.empty()) {
        ctx->load_verify_file(c.ca_file, ec);
        if (ec) {
            error = what + ": ca_file " + c.ca_file + ": " + ec.message();
            return nullptr;
        }
    }
    if (!c.cert_file.empty()) {
        ctx->use_certificate_chain_file(c.cert_file, ec);
        if (ec) {
            error = what + ": cert_file " + c.cert_file + ": " + ec.message();
            return nullptr;
        }
        ctx->use_private_key_file(c.key_file, boost::asio::ssl::context::pem, ec);
        if (ec) {
            error = what + ": key_file " + c.key_file + ": " + ec.message();
            return nullptr;
        }
    }
    return ctx;
}

}  // namespace armada::cluster
