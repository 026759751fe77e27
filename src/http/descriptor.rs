//! A descriptor written as text: `key=value,key=value`, the one syntax of nginx's
//! `X-Ratelimit-Descriptor` header, `DELETE /counters/{domain}?descriptor=...` and the
//! explain client's `--descriptor`, parsed by one function with one set of rules:
//!
//! - entries are separated by commas, in order; spaces and tabs around an entry are
//!   trimmed; an empty entry, or one without `=`, is an error;
//! - the key and the value are percent-decoded after the split (`%2C` is a comma, `%3D` an
//!   `=`, `%25` a `%`; a `%` not followed by two hex digits stays as it is, `+` stays `+`),
//!   and bytes that are not UTF-8 are decoded lossily, never refused, so client data copied
//!   into a value cannot turn into an error;
//! - the key must not be empty; an empty value is kept (what it means is the caller's:
//!   nginx drops such a descriptor);
//! - bounds: the limiter's ([`bounds`]): entries per descriptor, key and value lengths.
//!
//! Errors name the place: `{field}.entries[N]`, `.key` or `.value`.

use std::borrow::Cow;

use crate::limiter::bounds;

/// The entries of `raw` (see the module docs); `field` names it in errors.
pub fn parse(raw: &[u8], field: &str) -> Result<Vec<(String, String)>, String> {
    let count = raw.split(|&byte| byte == b',').count();
    if count > bounds::MAX_ENTRIES {
        return Err(format!(
            "{field}: {count} entries, at most {} allowed",
            bounds::MAX_ENTRIES
        ));
    }
    let mut entries = Vec::with_capacity(count);
    for (position, item) in raw.split(|&byte| byte == b',').enumerate() {
        let field = format!("{field}.entries[{position}]");
        let item = item.trim_ascii();
        if item.is_empty() {
            return Err(format!("{field}: empty entry (expected key=value)"));
        }
        let Some(equals) = item.iter().position(|&byte| byte == b'=') else {
            return Err(format!(
                "{field}: no `=` in {:?} (expected key=value)",
                String::from_utf8_lossy(item)
            ));
        };
        let (key, value) = (&item[..equals], &item[equals + 1..]);
        let key = String::from_utf8_lossy(&percent_decode(key)).into_owned();
        let value = String::from_utf8_lossy(&percent_decode(value)).into_owned();
        if key.is_empty() {
            return Err(format!("{field}.key: must not be empty"));
        }
        if key.len() > bounds::MAX_KEY_LEN {
            return Err(format!(
                "{field}.key: {} bytes, at most {} allowed",
                key.len(),
                bounds::MAX_KEY_LEN
            ));
        }
        if value.len() > bounds::MAX_VALUE_LEN {
            return Err(format!(
                "{field}.value: {} bytes, at most {} allowed",
                value.len(),
                bounds::MAX_VALUE_LEN
            ));
        }
        entries.push((key, value));
    }
    Ok(entries)
}

/// Percent-decodes `raw`: `%` and two hex digits become that byte; anything else stays.
pub fn percent_decode(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'%') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%'
            && let [high, low, after @ ..] = tail
            && let (Some(high), Some(low)) = (hex(*high), hex(*low))
        {
            out.push(high << 4 | low);
            rest = after;
            continue;
        }
        out.push(byte);
        rest = tail;
    }
    Cow::Owned(out)
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn one_syntax_trimmed_decoded_and_bounded() {
        assert_eq!(
            parse(b" api_key=k1 ,\tpath=/a%2Cb%3Dc ,empty=", "d"),
            Ok(pairs(&[
                ("api_key", "k1"),
                ("path", "/a,b=c"),
                ("empty", "")
            ]))
        );
        assert_eq!(
            parse(b"k=%zz+%4", "d"),
            Ok(pairs(&[("k", "%zz+%4")])),
            "a % without two hex digits stays, + stays"
        );
        assert_eq!(
            parse(b"k=%FF", "d"),
            Ok(pairs(&[("k", "\u{fffd}")])),
            "not UTF-8: decoded lossily, never refused"
        );
        for (raw, problem) in [
            (&b"a=1,,b=2"[..], "d.entries[1]: empty entry"),
            (b"api_key", "d.entries[0]: no `=`"),
            (b"=v", "d.entries[0].key: must not be empty"),
        ] {
            let error = parse(raw, "d").expect_err("malformed");
            assert!(
                error.starts_with(problem) || error.contains(problem),
                "{raw:?}: {error}"
            );
        }
        let many = vec!["k=v"; 33].join(",");
        assert_eq!(
            parse(many.as_bytes(), "d"),
            Err("d: 33 entries, at most 32 allowed".to_owned())
        );
        let long = format!("k={}", "v".repeat(4097));
        assert!(
            parse(long.as_bytes(), "d")
                .expect_err("too long")
                .starts_with("d.entries[0].value: 4097 bytes")
        );
    }
}
