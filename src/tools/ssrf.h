#pragma once

#include <boost/asio/ip/address.hpp>

#include <string>
#include <vector>

namespace armada::tools {

//! An address range, e.g. 127.0.0.1/32 or fd00::/8.
struct Cidr {
    boost::asio::ip::address base;
    int prefix = 0;
};

//! Parses "a.b.c.d[/n]" or an IPv6 form; returns false on a malformed entry.
bool parse_cidr(const std::string & text, Cidr & out);

//! Decides whether a tool may connect to an address. Loopback, private, link-local (including
//! the 169.254.169.254 metadata service), CGNAT, unspecified and multicast addresses are denied
//! unless an allow-list entry covers them. IPv4-mapped IPv6 addresses are judged as IPv4.
//! The check runs on resolved addresses, so a name or a numeric form (decimal, octal, hex)
//! that resolves to a denied address is denied too.
class SsrfGuard {
  public:
    void allow(const Cidr & c) { allow_.push_back(c); }
    bool permitted(const boost::asio::ip::address & a) const;
    //! Why `a` is denied, for the error the model sees; empty when permitted.
    std::string reason(const boost::asio::ip::address & a) const;

  private:
    std::vector<Cidr> allow_;
};

}  // namespace armada::tools
