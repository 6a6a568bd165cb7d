//! Which network addresses a callback may connect to. Private targets are refused unless the
//! operator allows them (`FLEET_ALLOW_PRIVATE_CALLBACKS`); the check runs on the address actually
//! connected to, so a DNS name that resolves (or rebinds) to a private address fails too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `ip` is loopback, private, link-local (which covers cloud metadata), shared, reserved or
/// otherwise not a public unicast address.
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
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated)
        || first == 0x2001 && ip.segments()[1] == 0x0db8 // documentation
        || first == 0x0064 && ip.segments()[1] == 0xff9b // NAT64 can reach private IPv4
        || ip.segments()[..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible (deprecated)
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
        ] {
            assert!(forbidden(ip), "{ip} must be forbidden");
        }
    }

    #[test]
    fn public_addresses_are_allowed() {
        for ip in ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(!forbidden(ip), "{ip} must be allowed");
        }
    }
}
