#include "net/tls.h"

#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <boost/asio/ip/address.hpp>

namespace armada::net {

namespace ssl = boost::asio::ssl;

std::shared_ptr<ssl::context> client_tls(const std::string & extra_ca_file, std::string & err,
                                         const std::string & ca_setting) {
    auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
    boost::system::error_code ec;
    ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                         ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1,
                     ec);
    ctx->set_default_verify_paths(ec);
    if (ec) {
        err = "cannot load the system CA store: " + ec.message();
        return nullptr;
    }
    if (!extra_ca_file.empty()) {
        ctx->load_verify_file(extra_ca_file, ec);
        if (ec) {
            err = ca_setting + " " + extra_ca_file + ": " + ec.message();
            return nullptr;
        }
    }
    ctx->set_verify_mode(ssl::verify_peer);
    return ctx;
}

void expect_peer_name(void * native_ssl, const std::string & host) {
    SSL * ssl = static_cast<SSL *>(native_ssl);
    boost::system::error_code ec;
    boost::asio::ip::make_address(host, ec);
    if (!ec) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str());
    } else {
        SSL_set_tlsext_host_name(ssl, host.c_str());
        SSL_set1_host(ssl, host.c_str());
    }
}

std::string tls_failure(const boost::system::error_code & ec, void * native_ssl, const std::string & host,
                        const std::string & ca_setting) {
    const long v = native_ssl ? SSL_get_verify_result(static_cast<SSL *>(native_ssl)) : X509_V_OK;
    switch (v) {
        case X509_V_OK:
            break;
        case X509_V_ERR_CERT_HAS_EXPIRED:
            return "the TLS certificate of " + host + " has expired";
        case X509_V_ERR_CERT_NOT_YET_VALID:
            return "the TLS certificate of " + host + " is not valid yet";
        case X509_V_ERR_HOSTNAME_MISMATCH:
            return "the TLS certificate does not name " + host;
        case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
        case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
        case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
            return "the TLS certificate of " + host + " is not signed by a trusted CA (" +
                   X509_verify_cert_error_string(v) + "; add its CA with " + ca_setting + ")";
        default:
            return "the TLS certificate of " + host + " was refused: " + X509_verify_cert_error_string(v);
    }
    return "TLS handshake with " + host + " failed: " + ec.message();
}

}  // namespace armada::net
