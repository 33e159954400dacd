//! Key layout: `PREFIX:{ENC}` (the lease hash), `PREFIX:{ENC}:token` (the
//! token counter) and `PREFIX:fence:{ENC}` (a fence record), where `ENC` is
//! the user's key with `% { } * ? [ ] \` percent-encoded.
//!
//! Encoding those characters keeps the hash tag well-formed (the user key
//! can never close it early), makes every SCAN pattern built from an encoded
//! prefix literal, and is prefix-preserving (`enc(a + b) == enc(a) + enc(b)`),
//! so `list(prefix)` is a SCAN for `PREFIX:{enc(prefix)*}`.

use std::{fmt, io::Write};

use fencelock_core::{Error, LockKey, Result};
use redis::{RedisWrite, ToRedisArgs};

const SPECIAL: &[char] = &['%', '{', '}', '*', '?', '[', ']', '\\'];

/// The suffix of a key's readers set (docs/rwlock.md).
const READERS: &str = ":readers";

/// Percent-encodes the characters that matter to hash tags and globs.
pub(crate) fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    encode_into(&mut out, key);
    out
}

/// Appends [`encode`]`(key)` to `out`.
fn encode_into(out: &mut String, key: &str) {
    encode_runs(key, |run| out.push_str(run));
}

/// Hands [`encode`]`(key)` to `push` in pieces. Every special character is
/// ASCII, so the key goes out in runs between them, found by a table
/// lookup per byte: this runs for every key of every command, renewals
/// included, and most keys have no special character at all.
fn encode_runs(key: &str, mut push: impl FnMut(&str)) {
    let bytes = key.as_bytes();
    let mut run_start = 0;
    while let Some(offset) = bytes[run_start..]
        .iter()
        .position(|&b| ESCAPED[usize::from(b)])
    {
        let at = run_start + offset;
        push(&key[run_start..at]);
        push(escape(bytes[at]).unwrap_or_default());
        run_start = at + 1;
    }
    push(&key[run_start..]);
}

/// `ESCAPED[b]`: whether byte `b` is one of [`SPECIAL`].
static ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = escape(b as u8).is_some();
        b += 1;
    }
    table
};

/// The percent-encoding of a byte of [`SPECIAL`], `None` for the rest.
const fn escape(byte: u8) -> Option<&'static str> {
    Some(match byte {
        b'%' => "%25",
        b'{' => "%7B",
        b'}' => "%7D",
        b'*' => "%2A",
        b'?' => "%3F",
        b'[' => "%5B",
        b']' => "%5D",
        b'\\' => "%5C",
        _ => return None,
    })
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

/// A key name, `PREFIX:{ENC}SUFFIX`, not yet written anywhere. As a command
/// argument it is encoded straight into the command's buffer: every lock
/// operation names one or two keys, and building each as a `String` first
/// cost an allocation and a copy per key.
#[derive(Clone, Copy, Debug)]
pub struct Tagged<'a> {
    prefix: &'a str,
    key: &'a str,
    suffix: &'static str,
    /// The user's key as it is (the `plain` layout's lease).
    raw: bool,
}

impl Tagged<'_> {
    fn write_runs(&self, mut push: impl FnMut(&str)) {
        if self.raw {
            push(self.key);
            return;
        }
        push(self.prefix);
        push(":{");
        encode_runs(self.key, &mut push);
        push("}");
        push(self.suffix);
    }
}

impl fmt::Display for Tagged<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut result = Ok(());
        self.write_runs(|run| result = result.and_then(|()| f.write_str(run)));
        result
    }
}

impl ToRedisArgs for Tagged<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // The writer appends to the command's own buffer, which cannot fail.
        self.write_runs(|run| {
            let _ = arg.write_all(run.as_bytes());
        });
    }
}

/// The key names of one backend.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
    /// `layout=plain`: a lock's lease is the user's key itself.
    plain: bool,
}

impl Keys {
    /// The key names under `prefix` (checked).
    pub fn new(prefix: &str) -> Result<Self> {
        Self::with_layout(prefix, false)
    }

    /// The key names under `prefix`, with the leases at the users' keys
    /// themselves when `plain` (every other key stays under the prefix).
    pub(crate) fn with_layout(prefix: &str, plain: bool) -> Result<Self> {
        validate_prefix(prefix)?;
        Ok(Self {
            prefix: prefix.to_owned(),
            plain,
        })
    }

    /// `PREFIX:{ENC}` followed by `suffix`: the name of a key of `key`'s
    /// lock, written where it is used (see [`Tagged`]).
    fn tagged<'a>(&'a self, key: &'a str, suffix: &'static str) -> Tagged<'a> {
        Tagged {
            prefix: &self.prefix,
            key,
            suffix,
            raw: false,
        }
    }

    /// The lease of `key`: a hash `PREFIX:{ENC}`, or in the `plain` layout
    /// the string at the key itself.
    pub fn lease<'a>(&'a self, key: &'a LockKey) -> Tagged<'a> {
        Tagged {
            raw: self.plain,
            ..self.tagged(key.as_str(), "")
        }
    }

    /// The token counter of `key`.
    pub fn counter<'a>(&'a self, key: &'a LockKey) -> Tagged<'a> {
        self.tagged(key.as_str(), ":token")
    }

    /// `PREFIX:NAME`: a key of the backend's own, outside every lock's
    /// namespace (lock keys are `PREFIX:{…}`, fences `PREFIX:fence:{…}`).
    /// `name` must not start with `{` or `fence:`.
    pub fn own(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// The key's readers (a sorted set of tokens by lease end).
    pub(crate) fn readers<'a>(&'a self, key: &'a LockKey) -> Tagged<'a> {
        self.tagged(key.as_str(), READERS)
    }

    /// The details of the key's readers (a hash by token).
    pub(crate) fn readers_info<'a>(&'a self, key: &'a LockKey) -> Tagged<'a> {
        self.tagged(key.as_str(), ":readers:info")
    }

    /// A waiting writer's intent on the key.
    pub(crate) fn intent<'a>(&'a self, key: &'a LockKey) -> Tagged<'a> {
        self.tagged(key.as_str(), ":intent")
    }

    pub(crate) fn fence(&self, resource: &str) -> String {
        format!("{}:fence:{{{}}}", self.prefix, encode(resource))
    }

    /// The highest writer token of a fenced resource, in its slot.
    pub(crate) fn fence_writer(&self, resource: &str) -> String {
        format!("{}:fence:{{{}}}:writer", self.prefix, encode(resource))
    }

    /// The fenced value of a resource (a hash of `token` and `value`), in
    /// its slot.
    pub(crate) fn fence_value(&self, resource: &str) -> String {
        format!("{}:fence:{{{}}}:value", self.prefix, encode(resource))
    }

    /// The pub/sub channel release notices of `key` go to (under the key's
    /// hash tag); the payload is the user key.
    pub(crate) fn channel<'a>(&'a self, key: &'a str) -> Tagged<'a> {
        self.tagged(key, ":released")
    }

    /// The pub/sub channel every grant and release of the store publishes
    /// its user key on, which the lock service's event stream follows
    /// (`Backend::changes`); a channel, not a key, so no slot applies.
    pub(crate) fn changes(&self) -> String {
        self.own("changes")
    }

    /// The Redis Cluster slot of every key of `key`'s lock (they share the
    /// hash tag `{ENC}`, never empty since keys are not): where its scripts
    /// run, and the unit by which a Cluster backend splits batches.
    pub(crate) fn slot(&self, key: &LockKey) -> u16 {
        let mut crc = Crc16::default();
        encode_runs(key.as_str(), |run| crc.update(run.as_bytes()));
        crc.0 % 16384
    }

    /// A SCAN pattern matching the lease hashes (not counters) of keys that
    /// start with `prefix`. Literal because both parts contain no glob
    /// characters.
    pub(crate) fn lease_pattern(&self, prefix: Option<&str>) -> String {
        format!("{}:{{{}*}}", self.prefix, encode(prefix.unwrap_or("")))
    }

    /// A SCAN pattern matching the token counters of keys that start with
    /// `prefix`: in the `plain` layout, the keys fencelock has locked
    /// within the counters' idle expiry.
    pub(crate) fn counter_pattern(&self, prefix: Option<&str>) -> String {
        format!("{}:token", self.lease_pattern(prefix))
    }

    /// The user key of a token counter name found by SCAN.
    pub(crate) fn counter_user_key(&self, counter: &[u8]) -> Option<LockKey> {
        self.user_key(counter.strip_suffix(b":token")?)
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

/// CRC-16/XMODEM, the checksum of Redis Cluster's key slots
/// (`CRC16(tag) mod 16384`, see the cluster specification). A few lines
/// here rather than a crate: the slot of a lock is needed only to group a
/// batch by slot before sending it.
#[derive(Default)]
struct Crc16(u16);

impl Crc16 {
    fn update(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u16::from(byte) << 8;
            for _ in 0..8 {
                self.0 = if self.0 & 0x8000 != 0 {
                    (self.0 << 1) ^ 0x1021
                } else {
                    self.0 << 1
                };
            }
        }
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
    fn exactly_the_special_characters_are_escaped_as_their_hex() {
        for byte in 0..=u8::MAX {
            let expected = SPECIAL
                .contains(&char::from(byte))
                .then(|| format!("%{byte:02X}"));
            assert_eq!(escape(byte).map(str::to_owned), expected, "byte {byte}");
        }
    }

    #[test]
    fn lease_names_parse_back() -> Result<()> {
        let keys = Keys::new("fl")?;
        let k = LockKey::new("a}{b")?;
        let name = keys.lease(&k).to_string();
        assert_eq!(name, "fl:{a%7D%7Bb}");
        assert_eq!(keys.counter(&k).to_string(), "fl:{a%7D%7Bb}:token");
        assert_eq!(keys.channel("a*%").to_string(), "fl:{a%2A%25}:released");
        assert_eq!(encode("é[x]\\"), "é%5Bx%5D%5C");
        assert_eq!(keys.user_key(name.as_bytes()), Some(k.clone()));
        assert_eq!(keys.user_key(keys.counter(&k).to_string().as_bytes()), None);
        assert_eq!(keys.readers(&k).to_string(), "fl:{a%7D%7Bb}:readers");
        assert_eq!(
            keys.readers_user_key(keys.readers(&k).to_string().as_bytes()),
            Some(k.clone())
        );
        assert_eq!(keys.user_key(keys.readers(&k).to_string().as_bytes()), None);
        assert_eq!(keys.readers_user_key(name.as_bytes()), None);
        Ok(())
    }

    #[test]
    fn a_name_written_into_a_command_is_its_display_form() -> Result<()> {
        let keys = Keys::new("fl")?;
        let k = LockKey::new("glob*?[a-z]{x}%_\\ 🔒")?;
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(keys.lease(&k)).arg(keys.counter(&k));
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .skip(1)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                redis::Arg::Cursor => Vec::new(),
            })
            .collect();
        assert_eq!(
            args,
            [
                keys.lease(&k).to_string().into_bytes(),
                keys.counter(&k).to_string().into_bytes()
            ]
        );
        assert_eq!(keys.user_key(&args[0]), Some(k));
        Ok(())
    }

    #[test]
    fn slots_are_redis_clusters() -> Result<()> {
        // The cluster specification's check value: CRC16("123456789").
        let mut crc = Crc16::default();
        crc.update(b"123456789");
        assert_eq!(crc.0, 0x31C3);
        // `CLUSTER KEYSLOT` of these tags, read from a Redis 7 server; the
        // encoded form is what is hashed (`{` becomes `%7B`).
        let keys = Keys::new("fl")?;
        for (key, slot) in [("a", 15495), ("job:1", 11113), ("{x", 7951)] {
            assert_eq!(keys.slot(&LockKey::new(key)?), slot, "{key}");
        }
        Ok(())
    }

    #[test]
    fn plain_leases_are_the_users_keys() -> Result<()> {
        let keys = Keys::with_layout("fl", true)?;
        let k = LockKey::new("jobs:{nightly}*")?;
        assert_eq!(keys.lease(&k).to_string(), "jobs:{nightly}*");
        assert_eq!(
            keys.counter(&k).to_string(),
            "fl:{jobs:%7Bnightly%7D%2A}:token"
        );
        assert_eq!(
            keys.counter_user_key(keys.counter(&k).to_string().as_bytes()),
            Some(k)
        );
        Ok(())
    }

    #[test]
    fn prefixes_with_specials_are_refused() {
        assert!(Keys::new("a{b").is_err());
        assert!(Keys::new("a*").is_err());
        assert!(Keys::new("").is_err());
    }
}
