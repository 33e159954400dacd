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
    /// `[[previous]]` without `phase`, or `phase` without `[[previous]]`.
    #[error("a transition needs both [[previous]] and phase = \"join\" or \"handover\"")]
    Transition,
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

/// A checked shard map (see docs/sharding.md for the file).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardMap {
    /// Raised with every change of the map; reported, not used to route.
    pub epoch: u64,
    /// The owners of keys.
    pub shards: Vec<Shard>,
    /// During a transition, the map before it, and which side issues tokens.
    pub transition: Option<(Phase, Vec<Shard>)>,
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
    previous: Vec<Shard>,
}

impl ShardMap {
    /// A stable map (no transition) of `shards`, checked.
    pub fn new(epoch: u64, shards: Vec<Shard>) -> Result<Self, MapError> {
        Self::checked(epoch, shards, None)
    }

    /// The same map in a transition from `previous` (docs/sharding.md).
    pub fn in_transition(self, phase: Phase, previous: Vec<Shard>) -> Result<Self, MapError> {
        Self::checked(self.epoch, self.shards, Some((phase, previous)))
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
        let transition = match (file.phase, file.previous.is_empty()) {
            (Some(phase), false) => Some((phase, file.previous)),
            (None, true) => None,
            _ => return Err(MapError::Transition),
        };
        Self::checked(file.epoch, file.shard, transition)
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
            previous,
        };
        // A struct of strings, integers and lists always has a TOML form.
        toml::to_string(&file).unwrap_or_else(|e| unreachable!("a shard map has no TOML form: {e}"))
    }

    /// The shard that owns `key` in this map's current list (its previous
    /// list is only consulted during a transition, by the backend).
    pub fn owner(&self, key: &str) -> &Shard {
        let names = self.shards.iter().map(|s| s.name.as_str());
        &self.shards[crate::hash::owner(names, key)]
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
        shards: Vec<Shard>,
        transition: Option<(Phase, Vec<Shard>)>,
    ) -> Result<Self, MapError> {
        if epoch == 0 {
            return Err(MapError::Epoch);
        }
        if shards.is_empty() {
            return Err(MapError::NoShards);
        }
        check_list(&shards, "shard")?;
        if let Some((_, previous)) = &transition {
            if previous.is_empty() {
                return Err(MapError::Transition);
            }
            check_list(previous, "previous")?;
        }
        Ok(Self {
            epoch,
            shards,
            transition,
        })
    }
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

    #[test]
    fn a_missing_file_is_a_read_error() {
        let e = ShardMap::read(Path::new("/nonexistent/shards.toml"));
        assert!(matches!(e, Err(MapError::Read { .. })), "{e:?}");
    }
}
