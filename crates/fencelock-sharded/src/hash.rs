//! Rendezvous (highest random weight) routing over a pinned hash.
//!
//! The score of shard `name` for `key` is XXH3-64 (seed 0) of the bytes
//! `name`, `0xFF`, `key`. `0xFF` never occurs in UTF-8, so no other
//! (name, key) pair has the same input. A key belongs to the shard with the
//! highest score (ties, which need a 64-bit collision, go to the smaller
//! name). The hash is part of the file format: every process must route a
//! key to the same shard, whatever its version or platform, so it is never
//! `std`'s `DefaultHasher` (whose algorithm may change between releases).

use xxhash_rust::xxh3::xxh3_64;

/// The score of shard `name` for `key`.
pub(crate) fn score(name: &str, key: &str) -> u64 {
    let mut input = Vec::with_capacity(name.len() + 1 + key.len());
    input.extend_from_slice(name.as_bytes());
    input.push(0xFF);
    input.extend_from_slice(key.as_bytes());
    xxh3_64(&input)
}

/// The index in `names` of the shard that owns `key` (`names` not empty).
pub(crate) fn owner<'a>(names: impl IntoIterator<Item = &'a str>, key: &str) -> usize {
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| (score(name, key), std::cmp::Reverse(name), i))
        .max()
        .map_or(0, |(_, _, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// XXH3-64's published value for the empty input, and pinned scores
    /// (computed once with this crate): if any of these changes, keys would
    /// move between shards on upgrade.
    #[test]
    fn pinned_vectors() {
        assert_eq!(xxh3_64(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(score("a", "order:1"), PINNED[0]);
        assert_eq!(score("b", "order:1"), PINNED[1]);
        assert_eq!(score("shard-eu", "workflow:123"), PINNED[2]);
    }

    const PINNED: [u64; 3] = [
        0x0862_4348_28EF_531B,
        0x1AB7_6F3E_6137_7404,
        0x2F4B_D12C_81BE_8358,
    ];

    #[test]
    fn the_separator_keeps_pairs_apart() {
        assert_ne!(score("a", "bc"), score("ab", "c"));
    }

    /// Adding a shard moves only the keys the new shard wins (about 1/n of
    /// them); every other key keeps its owner.
    #[test]
    fn adding_a_shard_moves_only_keys_to_it() {
        let before = ["a", "b", "c"];
        let after = ["a", "b", "c", "d"];
        let mut moved = 0;
        for i in 0..4000 {
            let key = format!("key:{i}");
            let (old, new) = (owner(before, &key), owner(after, &key));
            if old != new {
                assert_eq!(
                    after[new], "d",
                    "{key} moved from {} to {}",
                    before[old], after[new]
                );
                moved += 1;
            }
        }
        assert!((700..1300).contains(&moved), "{moved} of 4000 moved");
    }

    #[test]
    fn order_of_the_list_does_not_matter() {
        for i in 0..200 {
            let key = format!("k{i}");
            let one = ["x", "y", "z"];
            let other = ["z", "x", "y"];
            assert_eq!(one[owner(one, &key)], other[owner(other, &key)]);
        }
    }
}
