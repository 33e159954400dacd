//! `torture --server sharded`: a shard map over two SQLite shards that the
//! `reshard` fault steps through a move and back, so that the torture key
//! changes shards while the workers run (docs/sharding.md, "Resharding").
//!
//! The cycle, one step per fault, each written with a new epoch:
//!
//! | step | shards | previous | phase |
//! |---|---|---|---|
//! | 0 | a | – | – |
//! | 1 | a, b | a | join |
//! | 2 | a, b | a | handover |
//! | 3 | a, b | – | – |
//! | 4 | a | a, b | join |
//! | 5 | a | a, b | handover |
//!
//! and then step 0 again. Shard `b`'s name is chosen so that the torture
//! key moves: it belongs to `a` in steps 0 and to `b` in step 3.
//!
//! Only adjacent steps may run at once, so the nemesis writes the next step
//! only after every worker has reopened its backend on the current one
//! (each does between rounds, holding nothing, and records a `map` event),
//! and one lease more, for a lease whose release failed.

use std::path::PathBuf;

use fencelock::sharded::{Phase, Shard, ShardMap};
use fencelock_testkit::TestResult;

/// Steps in one move and back.
const STEPS: usize = 6;

/// The map file and where the cycle stands.
#[derive(Debug)]
pub struct ShardSteps {
    _dir: tempfile::TempDir,
    map: PathBuf,
    a: Shard,
    b: Shard,
    step: usize,
    epoch: u64,
}

impl ShardSteps {
    /// Two SQLite shards in a temporary directory, and the map at step 0,
    /// with `b` named so that `key` moves to it when it joins.
    pub fn start(key: &str) -> TestResult<Self> {
        let dir = tempfile::Builder::new()
            .prefix("fencelock-shards-")
            .tempdir()?;
        let shard = |name: &str| {
            Shard::new(
                name,
                format!(
                    "sqlite://{}",
                    dir.path().join(format!("{name}.db")).display()
                ),
            )
        };
        let a = shard("a");
        let b = (0..)
            .map(|i| shard(&format!("b{i}")))
            .find(|b| {
                ShardMap::new(1, vec![a.clone(), b.clone()])
                    .is_ok_and(|map| map.owner(key).name == b.name)
            })
            .ok_or("no shard name takes the key")?;
        let steps = Self {
            map: dir.path().join("shards.toml"),
            _dir: dir,
            a,
            b,
            step: 0,
            epoch: 1,
        };
        steps.write()?;
        Ok(steps)
    }

    /// The `sharded://` URL of the map file.
    pub fn url(&self) -> String {
        format!("sharded://{}", self.map.display())
    }

    /// Writes the next step; its epoch.
    pub fn advance(&mut self) -> TestResult<u64> {
        self.step = (self.step + 1) % STEPS;
        self.epoch += 1;
        self.write()?;
        Ok(self.epoch)
    }

    fn map(&self) -> TestResult<ShardMap> {
        let one = vec![self.a.clone()];
        let two = vec![self.a.clone(), self.b.clone()];
        let map = match self.step {
            0 => ShardMap::new(self.epoch, one)?,
            1 => ShardMap::new(self.epoch, two)?.in_transition(Phase::Join, one)?,
            2 => ShardMap::new(self.epoch, two)?.in_transition(Phase::Handover, one)?,
            3 => ShardMap::new(self.epoch, two)?,
            4 => ShardMap::new(self.epoch, one)?.in_transition(Phase::Join, two)?,
            _ => ShardMap::new(self.epoch, one)?.in_transition(Phase::Handover, two)?,
        };
        Ok(map)
    }

    /// Replaces the file in one rename, so that a worker never reads half a
    /// map.
    fn write(&self) -> TestResult {
        let next = self.map.with_extension("toml.next");
        std::fs::write(&next, self.map()?.to_toml())?;
        std::fs::rename(&next, &self.map)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cycle_moves_the_key_and_back_with_a_new_epoch_each_step() -> TestResult {
        let key = "fencelock-torture";
        let mut steps = ShardSteps::start(key)?;
        let mut owners = Vec::new();
        let mut epochs = Vec::new();
        for _ in 0..=STEPS {
            let map = ShardMap::read(&steps.map)?;
            owners.push(map.owner(key).name.clone());
            epochs.push(map.epoch);
            steps.advance()?;
        }
        let b = steps.b.name.clone();
        assert_eq!(owners, ["a", &b, &b, &b, "a", "a", "a"]);
        assert_eq!(epochs, (1..=7).collect::<Vec<u64>>());
        Ok(())
    }
}
