//! The shard map: `shards.toml`, parsed and checked.

use std::{collections::BTreeSet, fmt, path::Path};

use fencelock_core::redact_url;
use serde::{Deserialize, Serialize};

/// Why a shard map was refused. Messages never contain a shard URL's
/// password, nor the text of the file around a syntax error (which could).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// The file could not be read.
    #[error("cannot read the shard map {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML, or not the map's fields and types.
    #[error("the shard map is not valid: {0}")]
    Syntax(String),
    /// `epoch` is 0.
    #[error("the shard map's epoch must be at least 1")]
    Epoch,
    /// No `[[shard]]`.
    #[error("the shard map has no [[shard]]")]
    NoShards,
    /// A shard without a name or URL.
    #[error("a shard in [[{0}]] has an empty name or URL")]
    Empty(&'static str),
    /// Two shards of one list share a name.
    #[error("shard name {0:?} appears twice in [[{1}]]")]
    DuplicateName(String, &'static str),
    /// A shard that is itself a sharded map.
    #[error("shard {0:?} is a sharded:// map itself; shards must be other backends")]
    Nested(String),
    /// `[[previous]]` without `phase`, or `phase` without `[[previous]]`
    /// (or `[[previous_place]]` without both).
    #[error("a transition needs both [[previous]] and phase = \"join\" or \"handover\"")]
    Transition,
    /// A placement rule with both `key` and `prefix`, or neither.
    #[error("a rule in [[{0}]] needs exactly one of `key` and `prefix`")]
    PlaceMatch(&'static str),
    /// A placement rule whose `key` or `prefix` is empty (an empty prefix
    /// would home every key: list one shard instead).
    #[error("a rule in [[{0}]] has an empty key, prefix or shard")]
    PlaceEmpty(&'static str),
    /// A placement rule naming a shard its map does not list.
    #[error(
        "the rule for {keys} in [[{list}]] names shard {shard:?}, which is not in [[{shards}]]"
    )]
    UnknownShard {
        /// The rule's keys, as `key "…"` or `prefix "…"`.
        keys: String,
        /// The shard it names.
        shard: String,
        /// `place` or `previous_place`.
        list: &'static str,
        /// The shard list it should be in: `shard` or `previous`.
        shards: &'static str,
    },
    /// Two placement rules for the same key, or the same prefix.
    #[error("two rules in [[{1}]] are for {0}")]
    DuplicateRule(String, &'static str),
}

impl From<MapError> for fencelock_core::Error {
    fn from(e: MapError) -> Self {
        fencelock_core::Error::InvalidUrl(e.to_string())
    }
}

/// Which shard of a moving key decides and issues its token during a
/// transition (docs/sharding.md): the key is taken on both its previous and
/// its current owner, first on the one that issues the token, then on the
/// other with that token as floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The previous owner issues tokens: the step after the old map, while
    /// processes with the old map may still run.
    Join,
    /// The current owner issues tokens: the step before the new map without
    /// `[[previous]]`, while processes with the `join` map may still run.
    Handover,
}

/// One shard: a name (what keys are hashed with) and any other backend's
/// URL.
#[derive(Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Shard {
    /// The name keys are routed by; renaming a shard moves keys.
    pub name: String,
    /// The backend's URL.
    pub url: String,
}

impl Shard {
    /// A shard named `name` at `url`.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
        }
    }
}

impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .finish()
    }
}

/// Which keys a [`Placement`] rule homes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyMatch {
    /// This one key (beats every prefix).
    Key(String),
    /// Every key starting with this (the longest matching prefix wins).
    Prefix(String),
}

impl fmt::Display for KeyMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyMatch::Key(key) => write!(f, "key {key:?}"),
            KeyMatch::Prefix(prefix) => write!(f, "prefix {prefix:?}"),
        }
    }
}

/// A placement rule (`[[place]]`): the keys it matches live on the shard
/// it names, whatever the hashing would say (docs/sharding.md,
/// "Placement").
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Placement {
    /// The keys it homes.
    pub keys: KeyMatch,
    /// The name of their shard.
    pub shard: String,
}

impl Placement {
    /// Homes every key starting with `prefix` on shard `shard`.
    pub fn prefix(prefix: impl Into<String>, shard: impl Into<String>) -> Self {
        Self {
            keys: KeyMatch::Prefix(prefix.into()),
            shard: shard.into(),
        }
    }

    /// Homes the one key `key` on shard `shard`.
    pub fn key(key: impl Into<String>, shard: impl Into<String>) -> Self {
        Self {
            keys: KeyMatch::Key(key.into()),
            shard: shard.into(),
        }
    }

    /// How well this rule matches `key`: `None` if it does not; else an
    /// exact key above every prefix, and a longer prefix above a shorter.
    fn rank(&self, key: &str) -> Option<usize> {
        match &self.keys {
            KeyMatch::Key(k) => (k == key).then_some(usize::MAX),
            KeyMatch::Prefix(p) => key.starts_with(p.as_str()).then_some(p.len()),
        }
    }
}

/// The index in `names` of the shard that owns `key`: the shard of the
/// best rule of `rules` that matches it (see [`Placement::rank`]), else
/// rendezvous hashing over `names`. The one place that decides a key's
/// owner, for the current list and the previous one alike, so that a
/// transition between two sets of rules moves exactly the keys whose
/// owner differs. `names` must not be empty; a checked map's rules only
/// name shards of their own list (one that did not would hash).
pub(crate) fn owner<'a>(
    names: impl IntoIterator<Item = &'a str> + Clone,
    rules: &[Placement],
    key: &str,
) -> usize {
    let ruled = rules
        .iter()
        .filter_map(|rule| rule.rank(key).map(|rank| (rank, rule)))
        .max_by_key(|(rank, _)| *rank)
        .and_then(|(_, rule)| names.clone().into_iter().position(|n| n == rule.shard));
    ruled.unwrap_or_else(|| crate::hash::owner(names, key))
}

/// A checked shard map (see docs/sharding.md for the file).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardMap {
    /// Raised with every change of the map; reported, not used to route.
    pub epoch: u64,
    /// The owners of keys.
    pub shards: Vec<Shard>,
    /// The placement rules of `shards` (`[[place]]`).
    pub placement: Vec<Placement>,
    /// During a transition, the map before it, and which side issues tokens.
    pub transition: Option<(Phase, Vec<Shard>)>,
    /// During a transition, the placement rules of the map before it
    /// (`[[previous_place]]`).
    pub previous_placement: Vec<Placement>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct File {
    epoch: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<Phase>,
    #[serde(default)]
    shard: Vec<Shard>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    place: Vec<PlaceFile>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    previous: Vec<Shard>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    previous_place: Vec<PlaceFile>,
}

/// A `[[place]]` table as written: exactly one of `key` and `prefix`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PlaceFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    shard: String,
}

impl PlaceFile {
    fn checked(self, list: &'static str) -> Result<Placement, MapError> {
        let keys = match (self.key, self.prefix) {
            (Some(key), None) => KeyMatch::Key(key),
            (None, Some(prefix)) => KeyMatch::Prefix(prefix),
            _ => return Err(MapError::PlaceMatch(list)),
        };
        Ok(Placement {
            keys,
            shard: self.shard,
        })
    }
}

impl From<&Placement> for PlaceFile {
    fn from(rule: &Placement) -> Self {
        let (key, prefix) = match &rule.keys {
            KeyMatch::Key(key) => (Some(key.clone()), None),
            KeyMatch::Prefix(prefix) => (None, Some(prefix.clone())),
        };
        Self {
            key,
            prefix,
            shard: rule.shard.clone(),
        }
    }
}

/// The rules of one list of a file, each checked for its form.
fn rules(files: Vec<PlaceFile>, list: &'static str) -> Result<Vec<Placement>, MapError> {
    files.into_iter().map(|f| f.checked(list)).collect()
}

/// One list of a map being checked: its shards and their rules.
struct Listed {
    shards: Vec<Shard>,
    rules: Vec<Placement>,
}

impl ShardMap {
    /// A stable map (no transition) of `shards`, checked.
    pub fn new(epoch: u64, shards: Vec<Shard>) -> Result<Self, MapError> {
        Self::checked(
            epoch,
            Listed {
                shards,
                rules: Vec::new(),
            },
            None,
        )
    }

    /// The same map with `rules` as its placement rules (replacing any),
    /// checked.
    pub fn with_placement(self, rules: Vec<Placement>) -> Result<Self, MapError> {
        let previous = self.previous();
        Self::checked(
            self.epoch,
            Listed {
                shards: self.shards,
                rules,
            },
            previous,
        )
    }

    /// The same map in a transition from `previous`, a map without
    /// placement rules (docs/sharding.md).
    pub fn in_transition(self, phase: Phase, previous: Vec<Shard>) -> Result<Self, MapError> {
        self.in_transition_placed(phase, previous, Vec::new())
    }

    /// The same map in a transition from `previous` with its placement
    /// rules `previous_rules`: a key whose rule changes moves as a key whose
    /// hashing changes does.
    pub fn in_transition_placed(
        self,
        phase: Phase,
        previous: Vec<Shard>,
        previous_rules: Vec<Placement>,
    ) -> Result<Self, MapError> {
        let current = Listed {
            shards: self.shards,
            rules: self.placement,
        };
        let previous = Listed {
            shards: previous,
            rules: previous_rules,
        };
        Self::checked(self.epoch, current, Some((phase, previous)))
    }

    /// The map before the transition, if in one.
    fn previous(&self) -> Option<(Phase, Listed)> {
        self.transition.as_ref().map(|(phase, shards)| {
            let listed = Listed {
                shards: shards.clone(),
                rules: self.previous_placement.clone(),
            };
            (*phase, listed)
        })
    }

    /// Parses the TOML text of a map.
    pub fn parse(text: &str) -> Result<Self, MapError> {
        // The message only: the error's Display quotes the line, which may
        // hold a URL with a password.
        let file: File = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| format!(" (line {})", text[..s.start].lines().count().max(1)))
                .unwrap_or_default();
            MapError::Syntax(format!("{}{line}", e.message().trim()))
        })?;
        let previous = Listed {
            shards: file.previous,
            rules: rules(file.previous_place, "previous_place")?,
        };
        let transition = match (file.phase, previous.shards.is_empty()) {
            (Some(phase), false) => Some((phase, previous)),
            (None, true) if previous.rules.is_empty() => None,
            _ => return Err(MapError::Transition),
        };
        let current = Listed {
            shards: file.shard,
            rules: rules(file.place, "place")?,
        };
        Self::checked(file.epoch, current, transition)
    }

    /// The map as the TOML text [`ShardMap::parse`] reads back: what a tool
    /// that steps a deployment through a transition writes.
    pub fn to_toml(&self) -> String {
        let (phase, previous) = match &self.transition {
            Some((phase, previous)) => (Some(*phase), previous.clone()),
            None => (None, Vec::new()),
        };
        let file = File {
            epoch: self.epoch,
            phase,
            shard: self.shards.clone(),
            place: self.placement.iter().map(PlaceFile::from).collect(),
            previous,
            previous_place: self
                .previous_placement
                .iter()
                .map(PlaceFile::from)
                .collect(),
        };
        // A struct of strings, integers and lists always has a TOML form.
        toml::to_string(&file).unwrap_or_else(|e| unreachable!("a shard map has no TOML form: {e}"))
    }

    /// The shard that owns `key` in this map's current list: its
    /// placement rule's, else the hashing's (its previous list is only
    /// consulted during a transition, by the backend, with the same rule).
    pub fn owner(&self, key: &str) -> &Shard {
        let names = self.shards.iter().map(|s| s.name.as_str());
        &self.shards[owner(names, &self.placement, key)]
    }

    /// Reads and parses the map in `path`.
    pub fn read(path: &Path) -> Result<Self, MapError> {
        let text = std::fs::read_to_string(path).map_err(|source| MapError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    fn checked(
        epoch: u64,
        current: Listed,
        transition: Option<(Phase, Listed)>,
    ) -> Result<Self, MapError> {
        if epoch == 0 {
            return Err(MapError::Epoch);
        }
        if current.shards.is_empty() {
            return Err(MapError::NoShards);
        }
        check_list(&current.shards, "shard")?;
        check_rules(&current, "place", "shard")?;
        let (transition, previous_placement) = match transition {
            Some((phase, previous)) => {
                if previous.shards.is_empty() {
                    return Err(MapError::Transition);
                }
                check_list(&previous.shards, "previous")?;
                check_rules(&previous, "previous_place", "previous")?;
                (Some((phase, previous.shards)), previous.rules)
            }
            None => (None, Vec::new()),
        };
        Ok(Self {
            epoch,
            shards: current.shards,
            placement: current.rules,
            transition,
            previous_placement,
        })
    }
}

/// Refuses a rule without keys or shard, for a shard not in its list, or
/// for the same keys as another rule of the list (which would make the
/// owner depend on the order of the file).
fn check_rules(listed: &Listed, list: &'static str, shards: &'static str) -> Result<(), MapError> {
    let mut seen = BTreeSet::new();
    for rule in &listed.rules {
        let (KeyMatch::Key(keys) | KeyMatch::Prefix(keys)) = &rule.keys;
        if keys.is_empty() || rule.shard.is_empty() {
            return Err(MapError::PlaceEmpty(list));
        }
        if !listed.shards.iter().any(|s| s.name == rule.shard) {
            return Err(MapError::UnknownShard {
                keys: rule.keys.to_string(),
                shard: rule.shard.clone(),
                list,
                shards,
            });
        }
        if !seen.insert(&rule.keys) {
            return Err(MapError::DuplicateRule(rule.keys.to_string(), list));
        }
    }
    Ok(())
}

fn check_list(shards: &[Shard], list: &'static str) -> Result<(), MapError> {
    let mut names = BTreeSet::new();
    for shard in shards {
        if shard.name.is_empty() || shard.url.trim().is_empty() {
            return Err(MapError::Empty(list));
        }
        if !names.insert(shard.name.as_str()) {
            return Err(MapError::DuplicateName(shard.name.clone(), list));
        }
        if scheme(&shard.url).as_deref() == Some(crate::SCHEME) {
            return Err(MapError::Nested(shard.name.clone()));
        }
    }
    Ok(())
}

/// The lower-case scheme of `url`, if it has one.
pub(crate) fn scheme(url: &str) -> Option<String> {
    url.split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_map_parses() -> Result<(), MapError> {
        let map = ShardMap::parse(
            r#"
            epoch = 3
            phase = "join"
            [[shard]]
            name = "a"
            url = "redis://127.0.0.1:6379"
            [[shard]]
            name = "b"
            url = "postgres://u:pw@h/db"
            [[previous]]
            name = "a"
            url = "redis://127.0.0.1:6379"
            "#,
        )?;
        assert_eq!(map.epoch, 3);
        assert_eq!(map.shards.len(), 2);
        assert!(matches!(&map.transition, Some((Phase::Join, p)) if p.len() == 1));
        assert!(!format!("{map:?}").contains("pw"));
        Ok(())
    }

    #[test]
    fn a_written_map_reads_back_the_same() -> Result<(), MapError> {
        let shards = vec![
            Shard::new("a", "sqlite:///tmp/a.db"),
            Shard::new("b", "redis://u:pw@127.0.0.1:6379"),
        ];
        let stable = ShardMap::new(4, shards.clone())?;
        let moving = ShardMap::new(5, shards.clone())?
            .in_transition(Phase::Handover, shards[..1].to_vec())?;
        for map in [stable, moving] {
            assert_eq!(ShardMap::parse(&map.to_toml())?, map);
        }
        Ok(())
    }

    #[test]
    fn the_owner_is_the_routing_of_the_current_list() -> Result<(), MapError> {
        let map = ShardMap::new(
            1,
            vec![Shard::new("a", "mem://"), Shard::new("b", "mem://")],
        )?;
        let owners: BTreeSet<&str> = (0..64)
            .map(|i| map.owner(&format!("k{i}")).name.as_str())
            .collect();
        assert_eq!(owners, BTreeSet::from(["a", "b"]));
        for i in 0..64 {
            let key = format!("k{i}");
            let winner = crate::hash::owner(["a", "b"], &key);
            assert_eq!(map.owner(&key).name, ["a", "b"][winner]);
        }
        Ok(())
    }

    #[test]
    fn bad_maps_are_typed_errors_without_secrets() {
        type Expected = fn(&MapError) -> bool;
        let cases: &[(&str, Expected)] = &[
            ("", |e| matches!(e, MapError::Syntax(_))),
            ("epoch = 1", |e| matches!(e, MapError::NoShards)),
            (
                "epoch = 0\n[[shard]]\nname = \"a\"\nurl = \"mem://\"",
                |e| matches!(e, MapError::Epoch),
            ),
            (
                "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"mem://\"\n[[shard]]\nname = \"a\"\nurl = \"mem://\"",
                |e| matches!(e, MapError::DuplicateName(..)),
            ),
            (
                "epoch = 1\n[[shard]]\nname = \"\"\nurl = \"mem://\"",
                |e| matches!(e, MapError::Empty(_)),
            ),
            (
                "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"Sharded:///x.toml\"",
                |e| matches!(e, MapError::Nested(_)),
            ),
            (
                "epoch = 1\nphase = \"join\"\n[[shard]]\nname = \"a\"\nurl = \"mem://\"",
                |e| matches!(e, MapError::Transition),
            ),
            (
                "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"mem://\"\n[[previous]]\nname = \"a\"\nurl = \"mem://\"",
                |e| matches!(e, MapError::Transition),
            ),
            (
                "epoch = 1\nphase = \"later\"\n[[shard]]\nname = \"a\"\nurl = \"mem://\"",
                |e| matches!(e, MapError::Syntax(_)),
            ),
            (
                "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"redis://:hunter2@h\"\nport = 1",
                |e| matches!(e, MapError::Syntax(_)),
            ),
            (
                "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"redis://:hunter2@h",
                |e| matches!(e, MapError::Syntax(_)),
            ),
        ];
        for (text, expected) in cases {
            match ShardMap::parse(text) {
                Err(e) => {
                    assert!(expected(&e), "{text:?}: {e:?}");
                    assert!(!e.to_string().contains("hunter2"), "{e}");
                }
                Ok(map) => panic!("{text:?} was accepted: {map:?}"),
            }
        }
    }

    /// Two shards `a` and `b` and the `[[place]]` tables of `rules`.
    fn placed(rules: &str) -> Result<ShardMap, MapError> {
        placed_in("", rules)
    }

    /// The same with `head` (top-level keys) before the tables.
    fn placed_in(head: &str, rules: &str) -> Result<ShardMap, MapError> {
        ShardMap::parse(&format!(
            "epoch = 1\n{head}[[shard]]\nname = \"a\"\nurl = \"redis://:hunter2@h\"\n\
             [[shard]]\nname = \"b\"\nurl = \"mem://\"\n{rules}"
        ))
    }

    #[test]
    fn the_longest_prefix_wins_and_an_exact_key_beats_it() -> Result<(), MapError> {
        // Keys the hashing alone sends to `b` and to `a`, so that each rule
        // below visibly overrides it.
        let hashed = ShardMap::new(
            1,
            vec![Shard::new("a", "mem://"), Shard::new("b", "mem://")],
        )?;
        let on = |shard: &str, prefix: &str| {
            (0..1000)
                .map(|i| format!("{prefix}{i}"))
                .find(|k| hashed.owner(k).name == shard)
                .expect("one of 1000 keys hashes to each shard")
        };
        let (east_on_b, deep_on_a, exact_on_a) = (
            on("b", "thread:east:"),
            on("a", "thread:east:x:"),
            on("a", "thread:east:"),
        );
        let loose = on("a", "loose:");
        let map = placed(&format!(
            "[[place]]\nprefix = \"thread:east:\"\nshard = \"a\"\n\
             [[place]]\nprefix = \"thread:east:x:\"\nshard = \"b\"\n\
             [[place]]\nkey = \"{exact_on_a}\"\nshard = \"b\"\n\
             [[place]]\nprefix = \"{exact_on_a}\"\nshard = \"a\"\n"
        ))?;
        assert_eq!(map.owner(&east_on_b).name, "a", "the prefix rule");
        assert_eq!(map.owner(&deep_on_a).name, "b", "the longer prefix");
        assert_eq!(map.owner(&exact_on_a).name, "b", "the exact key");
        // A key that only starts like a rule's key is the prefix's.
        assert_eq!(map.owner(&format!("{exact_on_a}0")).name, "a");
        // No rule: the hashing, as without rules.
        assert_eq!(map.owner(&loose).name, hashed.owner(&loose).name);
        assert_eq!(
            map.owner("thread:west:1").name,
            hashed.owner("thread:west:1").name
        );
        Ok(())
    }

    #[test]
    fn a_map_with_rules_reads_back_the_same() -> Result<(), MapError> {
        let shards = vec![Shard::new("a", "mem://a"), Shard::new("b", "mem://b")];
        let map = ShardMap::new(2, shards.clone())?
            .with_placement(vec![Placement::key("thread:1", "b")])?
            .in_transition_placed(
                Phase::Join,
                shards,
                vec![
                    Placement::key("thread:1", "a"),
                    Placement::prefix("t:", "b"),
                ],
            )?;
        let text = map.to_toml();
        assert!(
            text.contains("[[place]]") && text.contains("[[previous_place]]"),
            "{text}"
        );
        assert_eq!(ShardMap::parse(&text)?, map);
        Ok(())
    }

    #[test]
    fn bad_rules_are_typed_errors_without_secrets() {
        type Expected = fn(&MapError) -> bool;
        let cases: &[(&str, Expected)] = &[
            ("[[place]]\nprefix = \"t:\"\nshard = \"c\"", |e| {
                matches!(e, MapError::UnknownShard { shard, list: "place", .. } if shard == "c")
            }),
            ("[[place]]\nprefix = \"\"\nshard = \"a\"", |e| {
                matches!(e, MapError::PlaceEmpty("place"))
            }),
            ("[[place]]\nkey = \"\"\nshard = \"a\"", |e| {
                matches!(e, MapError::PlaceEmpty("place"))
            }),
            ("[[place]]\nprefix = \"t:\"\nshard = \"\"", |e| {
                matches!(e, MapError::PlaceEmpty("place"))
            }),
            ("[[place]]\nkey = \"t:1\"\nprefix = \"t:\"\nshard = \"a\"", |e| {
                matches!(e, MapError::PlaceMatch("place"))
            }),
            ("[[place]]\nshard = \"a\"", |e| matches!(e, MapError::PlaceMatch("place"))),
            (
                "[[place]]\nprefix = \"t:\"\nshard = \"a\"\n[[place]]\nprefix = \"t:\"\nshard = \"b\"",
                |e| matches!(e, MapError::DuplicateRule(keys, "place") if keys == "prefix \"t:\""),
            ),
            (
                "[[place]]\nkey = \"t:1\"\nshard = \"a\"\n[[place]]\nkey = \"t:1\"\nshard = \"a\"",
                |e| matches!(e, MapError::DuplicateRule(..)),
            ),
            ("[[place]]\nprefix = \"t:\"\nshard = \"a\"\nport = 1", |e| {
                matches!(e, MapError::Syntax(_))
            }),
            // Previous rules without a transition, and previous rules
            // naming a shard only the current list has.
            ("[[previous_place]]\nprefix = \"t:\"\nshard = \"a\"", |e| {
                matches!(e, MapError::Transition)
            }),
            (
                "phase = \"join\"\n[[previous]]\nname = \"a\"\nurl = \"mem://\"\n\
                 [[previous_place]]\nprefix = \"t:\"\nshard = \"b\"",
                |e| matches!(e, MapError::UnknownShard { list: "previous_place", shards: "previous", .. }),
            ),
        ];
        for (rules, expected) in cases {
            // A transition's `phase` goes before the tables.
            let result = match rules.strip_prefix("phase = \"join\"\n") {
                Some(tables) => placed_in("phase = \"join\"\n", tables),
                None => placed(rules),
            };
            match result {
                Err(e) => {
                    assert!(expected(&e), "{rules:?}: {e:?}");
                    assert!(!e.to_string().contains("hunter2"), "{e}");
                }
                Ok(map) => panic!("{rules:?} was accepted: {map:?}"),
            }
        }
    }

    #[test]
    fn a_missing_file_is_a_read_error() {
        let e = ShardMap::read(Path::new("/nonexistent/shards.toml"));
        assert!(matches!(e, Err(MapError::Read { .. })), "{e:?}");
    }
}
