//! The shape of the fleet's generated ids (`room_…`, `asst_…`: a prefix and 32 lowercase hex
//! digits): a bottom module, read where a key may or may not be such an id.

/// Whether `s` has the shape of an id with `prefix` (`asst_`, `room_`) that this module hands out.
pub fn is_id(prefix: &str, s: &str) -> bool {
    s.strip_prefix(prefix)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}
