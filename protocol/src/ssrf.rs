//! Which network addresses a callback may connect to. Private targets are refused unless the
//! operator allows them (`FLEET_ALLOW_PRIVATE_CALLBACKS`); the check runs on the address actually
//! connected to, so a DNS name that resolves (or rebinds) to a private address fails too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The addresses a connection may use of those a name resolved to: every one when private targets
/// are allowed, else the public ones. None left means the name is refused: the callback client's
/// resolver and the data sources' connections both decide here.
pub fn permitted(addrs: impl IntoIterator<Item = SocketAddr>, allow_private: bool) -> Vec<SocketAddr> {
    addrs.into_iter().filter(|a| allow_private || !is_forbidden(a.ip())).collect()
}

/// Whether `ip` is loopback, private, link-local (which covers cloud metadata), shared, reserved or
/// otherwise not a public unicast address, or an IPv6 address that tunnels or translates to one
/// (IPv4-mapped and -compatible, NAT64, Teredo, and 6to4 of such an address).
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_forbidden_v4(v4),
            None => is_forbidden_v6(v6),
        },
    }
}

fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240 // reserved
}

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let first = segments[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated)
        || first == 0x2001 && segments[1] == 0x0db8 // documentation
        // NAT64 can reach private IPv4: the /32 covers the well-known 64:ff9b::/96 and local-use
        // 64:ff9b:1::/48 (a site's own translator) alike.
        || first == 0x0064 && segments[1] == 0xff9b
        || first == 0x2001 && segments[1] == 0 // Teredo 2001::/32
        || first == 0x2002 && is_forbidden_v4(embedded_6to4(segments)) // 6to4 2002::/16
        || segments[..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible (deprecated)
}

/// The IPv4 address a 6to4 address (2002:AABB:CCDD::/48) is routed to.
///
/// A 6to4 address is forbidden only when this embedded address is: its relay delivers to that
/// IPv4 address, so it is exactly as reachable as the address itself, and a public one is a
/// public target like any other. Teredo (2001::/32) is refused outright instead: the client's
/// address is stored obfuscated and its server's may be anything, so no check of it would hold.
fn embedded_6to4(segments: [u16; 8]) -> Ipv4Addr {
    let [a, b] = segments[1].to_be_bytes();
    let [c, d] = segments[2].to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(s: &str) -> bool {
        is_forbidden(s.parse().unwrap())
    }

    #[test]
    fn private_and_special_addresses_are_forbidden() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b::808:808", // NAT64 reaches whatever the translator does: refused whole
            "64:ff9b:1::a00:1",
            "64:ff9b:1:ffff::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2", // Teredo, whatever it embeds
            "2002:7f00:1::",                        // 6to4 of 127.0.0.1
            "2002:a00:1::1",                        // 6to4 of 10.0.0.1
            "2002:a9fe:a9fe::1",                    // 6to4 of 169.254.169.254 (metadata)
            "2002:c0a8:101:1::1",                   // 6to4 of 192.168.1.1
            "2002::1",                              // 6to4 of 0.0.0.0
        ] {
            assert!(forbidden(ip), "{ip} must be forbidden");
        }
    }

    #[test]
    fn only_public_addresses_are_permitted_unless_private_ones_are_allowed() {
        let addrs: Vec<SocketAddr> = vec!["127.0.0.1:5432".parse().unwrap(), "8.8.8.8:5432".parse().unwrap()];
        assert_eq!(permitted(addrs.clone(), false), vec![addrs[1]]);
        assert_eq!(permitted(addrs.clone(), true), addrs);
        assert!(permitted(vec![addrs[0]], false).is_empty());
    }

    #[test]
    fn public_addresses_are_allowed() {
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "2002:0808:0808::1",    // 6to4 of 8.8.8.8
            "2002:5db8:d822:1::5",  // 6to4 of 93.184.216.34
            "2001:4860:4860::8888", // in 2001::/23, outside Teredo's /32
        ] {
            assert!(!forbidden(ip), "{ip} must be allowed");
        }
    }
}
