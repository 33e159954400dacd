//! Names of the `layout=curator` layout (`docs/zookeeper.md`): the key is
//! a path under the chroot, and its contenders are the children named as
//! Apache Curator's recipes and kazoo's `Lock` name theirs, ordered by the
//! parent's sequence counter.
//!
//! Curator's `InterProcessMutex` creates `_c_<uuid>-lock-<sequence>`
//! (a protected ephemeral-sequential node) and holds the lock while its
//! node is the lowest by the part after the last `lock-`;
//! `LeaderLatch` does the same with `latch-`; kazoo's `Lock` creates
//! `<uuid hex>__lock__<sequence>` and counts the children matching its
//! patterns (`extra_lock_patterns` adds `-lock-`). fencelock's own node is
//! named the Curator way, so each of them sorts it where it belongs.

use fencelock_core::ELECTION_PREFIX;

/// What precedes the ten-digit sequence in a contender's name: Curator's
/// mutex, Curator's leader latch, kazoo's lock.
const MARKERS: [&str; 3] = ["-lock-", "-latch-", "__lock__"];

/// How many digits ZooKeeper gives a sequence.
const DIGITS: usize = 10;

/// The sequence of a contender's node name, `None` for any other child.
pub(crate) fn sequence(name: &str) -> Option<&str> {
    let at = name.len().checked_sub(DIGITS)?;
    let (head, seq) = (name.get(..at)?, name.get(at..)?);
    let contender =
        seq.bytes().all(|b| b.is_ascii_digit()) && MARKERS.iter().any(|m| head.ends_with(m));
    contender.then_some(seq)
}

/// The node a key's contenders are children of: the key as a path under
/// the chroot (its leading `/` optional); an election's key names the path
/// after [`ELECTION_PREFIX`], where `LeaderLatch` would be pointed. `None`
/// when ZooKeeper refuses that path.
pub(crate) fn key_dir(chroot: &str, key: &str) -> Option<String> {
    let path = key.strip_prefix(ELECTION_PREFIX).unwrap_or(key);
    let path = path.trim_start_matches('/');
    nameable(path).then(|| format!("{chroot}/{path}"))
}

/// Whether ZooKeeper takes `path` (relative, without its leading `/`) as
/// a node path: its `PathUtils.validatePath` refuses empty, `.` and `..`
/// segments and, counting in UTF-16 units, controls, surrogates (every
/// character beyond the BMP), the private use area and U+FFF0–U+FFFF.
fn nameable(path: &str) -> bool {
    let refused = |c: char| {
        let c = u32::from(c);
        c <= 0x1f || (0x7f..=0x9f).contains(&c) || (0xd800..=0xf8ff).contains(&c) || c >= 0xfff0
    };
    !path.chars().any(refused)
        && path
            .split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

/// The key whose contenders are the children of `relative` (a path under
/// the chroot, without its leading `/`), given whether they are a leader
/// latch's: the inverse of [`key_dir`].
pub(crate) fn key_of(relative: &str, latch: bool) -> String {
    if latch {
        format!("{ELECTION_PREFIX}{relative}")
    } else {
        relative.to_owned()
    }
}

/// Whether `name` is a leader latch's contender.
pub(crate) fn is_latch(name: &str) -> bool {
    sequence(name).is_some() && name[..name.len() - DIGITS].ends_with("-latch-")
}

/// The name of a new node of fencelock's for `key`, before the sequence
/// ZooKeeper appends: a Curator protected name with a fresh UUID, `latch-`
/// for an election (so that `LeaderLatch` orders it), else `lock-`.
pub(crate) fn node_name(key: &str) -> String {
    let recipe = if key.starts_with(ELECTION_PREFIX) {
        "latch-"
    } else {
        "lock-"
    };
    let b: [u8; 16] = rand::random();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    // Curator recognises a protected name by its length and the `-` after
    // a 36-character UUID.
    format!(
        "_c_{}-{}-{}-{}-{}-{recipe}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The label `inspect` gives a foreign contender.
pub(crate) fn client_of(name: &str) -> &'static str {
    if name.contains("__lock__") {
        "kazoo"
    } else {
        "curator"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_of_every_recipe_are_recognised() {
        for (name, seq) in [
            (
                "_c_2f1f5e36-8d0b-4a8e-9d5e-0c3f0e9b2a11-lock-0000000042",
                "0000000042",
            ),
            (
                "_c_2f1f5e36-8d0b-4a8e-9d5e-0c3f0e9b2a11-latch-0000000007",
                "0000000007",
            ),
            (
                "5b0c9d4be3f64b8e9f1e8f3ad0c1b2a3__lock__0000000003",
                "0000000003",
            ),
        ] {
            assert_eq!(sequence(name), Some(seq), "{name}");
        }
        for other in [
            "lock-12",
            "leases",
            "_c_x-lock-00000000a1",
            "x__rlock__0000000001",
        ] {
            assert_eq!(sequence(other), None, "{other}");
        }
        let mine = format!("{}0000000001", node_name("jobs/nightly"));
        assert_eq!(sequence(&mine), Some("0000000001"));
        assert_eq!(mine.len(), 40 + "lock-".len() + 10);
        assert!(is_latch(&format!(
            "{}0000000001",
            node_name("fencelock/election/x")
        )));
    }

    #[test]
    fn keys_map_to_paths_and_back() {
        let dir = |chroot, key| key_dir(chroot, key).unwrap_or_default();
        assert_eq!(dir("", "/locks/nightly"), "/locks/nightly");
        assert_eq!(dir("/apps", "locks/nightly"), "/apps/locks/nightly");
        assert_eq!(dir("", "fencelock/election/svc/leader"), "/svc/leader");
        for refused in [
            "a//b",
            "a/",
            "./a",
            "a/..",
            "emoji 🔒",
            "pua \u{e000}",
            "\u{fff0}",
        ] {
            assert_eq!(key_dir("", refused), None, "{refused:?}");
        }
        assert_eq!(key_of("svc/leader", true), "fencelock/election/svc/leader");
        assert_eq!(key_of("locks/nightly", false), "locks/nightly");
    }
}
