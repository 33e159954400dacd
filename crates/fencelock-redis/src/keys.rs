//! Key layout: `PREFIX:{ENC}` (the lease hash), `PREFIX:{ENC}:token` (the
//! token counter) and `PREFIX:fence:{ENC}` (a fence record), where `ENC` is
//! the user's key with `% { } * ? [ ] \` percent-encoded.
//!
//! Encoding those characters keeps the hash tag well-formed (the user key
//! can never close it early), makes every SCAN pattern built from an encoded
//! prefix literal, and is prefix-preserving (`enc(a + b) == enc(a) + enc(b)`),
//! so `list(prefix)` is a SCAN for `PREFIX:{enc(prefix)*}`.

use fencelock_core::{Error, LockKey, Result};

const SPECIAL: &[char] = &['%', '{', '}', '*', '?', '[', ']', '\\'];

/// The suffix of a key's readers set (docs/rwlock.md).
const READERS: &str = ":readers";

/// Percent-encodes the characters that matter to hash tags and globs.
pub(crate) fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    encode_into(&mut out, key);
    out
}

/// Appends [`encode`]`(key)` to `out`. Every special character is ASCII, so
/// the key is copied in runs between them: this runs for every key of every
/// command.
fn encode_into(out: &mut String, key: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut rest = key;
    while let Some(i) = rest.find(SPECIAL) {
        out.push_str(&rest[..i]);
        let byte = rest.as_bytes()[i];
        out.push('%');
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xF)]));
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
}

/// Reverses [`encode`]; `None` for text [`encode`] never produces.
pub(crate) fn decode(enc: &str) -> Option<String> {
    let mut out = String::with_capacity(enc.len());
    let mut rest = enc;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let hex = rest.get(i + 1..i + 3)?;
        out.push(char::from(u8::from_str_radix(hex, 16).ok()?));
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Checks a key prefix: it must not contain characters that would break the
/// hash tag or act as SCAN wildcards.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.len() > 100 {
        return Err(Error::InvalidUrl(
            "the key prefix must be 1-100 characters long".into(),
        ));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| SPECIAL.contains(c) || c.is_control())
    {
        return Err(Error::InvalidUrl(format!(
            "the key prefix must not contain {c:?}"
        )));
    }
    Ok(())
}

/// The key names of one backend.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Result<Self> {
        validate_prefix(prefix)?;
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    /// `PREFIX:{ENC}` followed by `suffix`, built without `format!`: it
    /// names the key of every command.
    fn tagged(&self, key: &str, suffix: &str) -> String {
        let mut out = String::with_capacity(self.prefix.len() + key.len() + suffix.len() + 12);
        out.push_str(&self.prefix);
        out.push_str(":{");
        encode_into(&mut out, key);
        out.push('}');
        out.push_str(suffix);
        out
    }

    pub(crate) fn lease(&self, key: &LockKey) -> String {
        self.tagged(key.as_str(), "")
    }

    pub(crate) fn counter(&self, key: &LockKey) -> String {
        self.tagged(key.as_str(), ":token")
    }

    /// The key's readers (a sorted set of tokens by lease end).
    pub(crate) fn readers(&self, key: &LockKey) -> String {
        self.tagged(key.as_str(), READERS)
    }

    /// The details of the key's readers (a hash by token).
    pub(crate) fn readers_info(&self, key: &LockKey) -> String {
        self.tagged(key.as_str(), ":readers:info")
    }

    /// A waiting writer's intent on the key.
    pub(crate) fn intent(&self, key: &LockKey) -> String {
        self.tagged(key.as_str(), ":intent")
    }

    pub(crate) fn fence(&self, resource: &str) -> String {
        format!("{}:fence:{{{}}}", self.prefix, encode(resource))
    }

    /// The highest writer token of a fenced resource, in its slot.
    pub(crate) fn fence_writer(&self, resource: &str) -> String {
        format!("{}:fence:{{{}}}:writer", self.prefix, encode(resource))
    }

    /// The pub/sub channel release notices of `key` go to (under the key's
    /// hash tag); the payload is the user key.
    pub(crate) fn channel(&self, key: &str) -> String {
        self.tagged(key, ":released")
    }

    /// A SCAN pattern matching the lease hashes (not counters) of keys that
    /// start with `prefix`. Literal because both parts contain no glob
    /// characters.
    pub(crate) fn lease_pattern(&self, prefix: Option<&str>) -> String {
        format!("{}:{{{}*}}", self.prefix, encode(prefix.unwrap_or("")))
    }

    /// A SCAN pattern matching the readers sets of keys that start with
    /// `prefix`.
    pub(crate) fn readers_pattern(&self, prefix: Option<&str>) -> String {
        format!("{}{READERS}", self.lease_pattern(prefix))
    }

    /// The user key of a lease hash name found by SCAN.
    pub(crate) fn user_key(&self, lease: &[u8]) -> Option<LockKey> {
        let s = std::str::from_utf8(lease).ok()?;
        let inner = s
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        LockKey::new(decode(inner)?).ok()
    }

    /// The user key of a readers set name found by SCAN.
    pub(crate) fn readers_user_key(&self, readers: &[u8]) -> Option<LockKey> {
        self.user_key(readers.strip_suffix(READERS.as_bytes())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_hides_specials() {
        for k in [
            "plain",
            "{braces}:tag",
            "glob*?[a-z]{x}%_\\",
            "emoji 🔒",
            "%41",
        ] {
            let e = encode(k);
            assert!(!e.contains(['{', '}', '*', '?', '[', ']', '\\']), "{e}");
            assert_eq!(decode(&e).as_deref(), Some(k));
        }
    }

    #[test]
    fn lease_names_parse_back() -> Result<()> {
        let keys = Keys::new("fl")?;
        let k = LockKey::new("a}{b")?;
        let name = keys.lease(&k);
        assert_eq!(name, "fl:{a%7D%7Bb}");
        assert_eq!(keys.counter(&k), "fl:{a%7D%7Bb}:token");
        assert_eq!(keys.channel("a*%"), "fl:{a%2A%25}:released");
        assert_eq!(encode("é[x]\\"), "é%5Bx%5D%5C");
        assert_eq!(keys.user_key(name.as_bytes()), Some(k.clone()));
        assert_eq!(keys.user_key(keys.counter(&k).as_bytes()), None);
        assert_eq!(keys.readers(&k), "fl:{a%7D%7Bb}:readers");
        assert_eq!(
            keys.readers_user_key(keys.readers(&k).as_bytes()),
            Some(k.clone())
        );
        assert_eq!(keys.user_key(keys.readers(&k).as_bytes()), None);
        assert_eq!(keys.readers_user_key(name.as_bytes()), None);
        Ok(())
    }

    #[test]
    fn prefixes_with_specials_are_refused() {
        assert!(Keys::new("a{b").is_err());
        assert!(Keys::new("a*").is_err());
        assert!(Keys::new("").is_err());
    }
}
