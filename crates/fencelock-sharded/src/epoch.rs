//! The epoch record each shard store keeps, so that processes on shard-map
//! steps more than one apart are refused (docs/sharding.md, "Adjacent steps
//! only").
//!
//! The record is written with the operations every backend has (acquire,
//! renew, release, inspect; no `set_data`, which Redlock lacks): two
//! reserved keys, the **slots**, each either free or held by the owner
//! `fencelock-sharded:epoch:<E>`. The highest `E` held is the highest epoch
//! that has used the store. It is raised by replacing the *other* slot
//! (release, then acquire), never the one holding the highest epoch, so a
//! reader never sees the highest epoch vanish while it is raised, and two
//! racing writers can never lower it: a writer releases a slot only if the
//! other held a higher epoch when it read them, and that other slot is only
//! ever released by a writer that saw a still higher epoch in this one.

use std::time::Duration;

use fencelock_core::{
    Acquire, AcquireRequest, Backend, Error, LeaseId, LockInfo, LockKey, Owner, Result, MAX_TTL,
};

/// Keys starting with this are the sharded backend's own (the two slots);
/// a caller's operation on one is refused.
pub(crate) const RESERVED_PREFIX: &str = "fencelock-sharded:";

/// The slot keys.
const SLOTS: [&str; 2] = ["fencelock-sharded:epoch:0", "fencelock-sharded:epoch:1"];

/// The owner of a slot holding epoch `E` is this followed by `E`.
const OWNER_PREFIX: &str = "fencelock-sharded:epoch:";

/// The label a slot's lease carries, for people reading a store's table.
const KIND: &str = "fencelock-sharded-epoch";

/// A slot is held for the longest lease there is, and renewed by any
/// check that finds it shorter than half of that (or than the lease the
/// checked operation asks for), so that it lives as long as any store of
/// the map is in use (docs/sharding.md says what "forgetting" means).
const SLOT_TTL: Duration = MAX_TTL;
const REFRESH_BELOW: Duration = Duration::from_secs(MAX_TTL.as_secs() / 2);

/// Added to an operation's TTL when the slot must outlive its lease: the
/// lease is written after the check, up to a round trip later.
const MARGIN: Duration = Duration::from_secs(60);

/// Rounds of read-then-write before a check gives up (only a store whose
/// slots change on every round, e.g. many processes raising at once and
/// losing each race, gets there).
const ROUNDS: usize = 16;

/// Whether `key` is one of the sharded backend's own.
pub(crate) fn is_reserved(key: &str) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

/// The refusal of an operation (or open) of a process on `epoch` by a
/// store that has seen `seen`.
fn refusal(epoch: u64, shard: &str, seen: u64) -> Error {
    if epoch < seen {
        Error::InvalidArgument(format!(
            "shard map epoch {epoch} is too old: shard {shard:?} has seen epoch {seen} (only \
             adjacent steps may run together; reopen with the current map)"
        ))
    } else {
        Error::InvalidArgument(format!(
            "shard map epoch {epoch} is too new: shard {shard:?} has only seen epoch {seen} (only \
             adjacent steps may run together; raise the epoch by one per step and deploy each \
             step everywhere before the next)"
        ))
    }
}

/// A slot as read: its lease, and the epoch its owner names.
struct Slot {
    info: LockInfo,
    epoch: u64,
}

/// Checks (and records) that a process on `epoch` may use `store`, which
/// the map calls `shard`: refused if the store has seen an epoch more than
/// one away.
///
/// `need` is how long the record must still live after this check: a
/// slot closer to its end is renewed.
///
/// A store that `joins` at this step (in the map but not in its previous
/// one) was in no map of the step before, so no process of that step can
/// have recorded it: its record is older by construction (a shard removed
/// and added back later shows the epoch it was removed at), and only "too
/// old" is refused there. The step before is still checked on every store
/// it used, which the map's previous list names.
pub(crate) async fn check(
    store: &dyn Backend,
    shard: &str,
    epoch: u64,
    joins: bool,
    need: Duration,
) -> Result<()> {
    let need = need.saturating_add(MARGIN).max(REFRESH_BELOW);
    let keys = [LockKey::new(SLOTS[0])?, LockKey::new(SLOTS[1])?];
    for _ in 0..ROUNDS {
        // Both slots at once: one round trip of the operation's latency.
        let (slot0, slot1) = futures_util::future::try_join(
            read(store, shard, &keys[0]),
            read(store, shard, &keys[1]),
        )
        .await?;
        let slots = [slot0, slot1];
        // The slot holding the highest epoch (the first on a tie).
        let high = match (&slots[0], &slots[1]) {
            (None, None) => None,
            (Some(_), None) => Some(0),
            (None, Some(_)) => Some(1),
            (Some(a), Some(b)) => Some(if b.epoch > a.epoch { 1 } else { 0 }),
        };
        let Some(high) = high else {
            // No record: a store no process of any map has used since a
            // slot last expired (docs/sharding.md argues when that is
            // safe). Racers meet on slot 0; the loser reads the winner's.
            if take(store, &keys[0], epoch).await? {
                return Ok(());
            }
            continue;
        };
        let Some(seen) = slots[high].as_ref().map(|s| s.epoch) else {
            continue;
        };
        if epoch.saturating_add(1) < seen || (epoch > seen.saturating_add(1) && !joins) {
            return Err(refusal(epoch, shard, seen));
        }
        if epoch > seen {
            // Raise: replace the other slot, never the highest one.
            let other = 1 - high;
            match &slots[other] {
                Some(slot) => {
                    let lease = lease_of(&slot.info);
                    match store.release(&lease).await {
                        Ok(()) | Err(Error::NotHeld { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                None => {
                    if take(store, &keys[other], epoch).await? {
                        return Ok(());
                    }
                }
            }
            // Read again: the slot freed above is taken on the next round,
            // and a racer's raise is seen before deciding.
            continue;
        }
        let Some(slot) = &slots[high] else {
            continue;
        };
        if slot.info.expires_in >= need {
            return Ok(());
        }
        match store.renew(&lease_of(&slot.info), SLOT_TTL).await {
            Ok(_) => return Ok(()),
            // Replaced by a raise (or expired) since it was read.
            Err(Error::NotHeld { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Backend(fencelock_core::BackendError::message(
        "sharded",
        fencelock_core::ErrorStatus::Transient,
        format!("the epoch record of shard {shard:?} changed on every one of {ROUNDS} reads"),
    )))
}

fn lease_of(info: &LockInfo) -> LeaseId {
    LeaseId::new(info.key.clone(), info.owner.clone(), info.token)
}

/// Takes the free slot `key` for `epoch`; false if someone else was first.
async fn take(store: &dyn Backend, key: &LockKey, epoch: u64) -> Result<bool> {
    let owner = Owner::new(format!("{OWNER_PREFIX}{epoch}"))?;
    let request = AcquireRequest::new(key.clone(), owner, SLOT_TTL).with_kind(Some(KIND.into()));
    Ok(matches!(
        store.try_acquire(&request).await?,
        Acquire::Granted(_)
    ))
}

/// A slot's lease and epoch; a slot held by an owner that names no epoch
/// means the reserved key is used by something else, which is refused
/// rather than overwritten.
async fn read(store: &dyn Backend, shard: &str, key: &LockKey) -> Result<Option<Slot>> {
    let Some(info) = store.inspect(key).await? else {
        return Ok(None);
    };
    let epoch = info
        .owner
        .as_str()
        .strip_prefix(OWNER_PREFIX)
        .and_then(|e| e.parse::<u64>().ok())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "shard {shard:?}: the reserved key {key} is held by {}, not by the sharded \
                 backend's epoch record",
                info.owner.as_str()
            ))
        })?;
    Ok(Some(Slot { info, epoch }))
}

#[cfg(test)]
mod tests {
    use fencelock_core::MemoryBackend;

    use super::*;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    async fn slots(store: &dyn Backend) -> Result<Vec<Option<u64>>> {
        let mut epochs = Vec::new();
        for key in SLOTS {
            epochs.push(
                read(store, "s", &LockKey::new(key)?)
                    .await?
                    .map(|slot| slot.epoch),
            );
        }
        Ok(epochs)
    }

    fn refused(result: Result<()>, words: &str) -> bool {
        matches!(result, Err(Error::InvalidArgument(msg)) if msg.contains(words))
    }

    #[tokio::test(start_paused = true)]
    async fn adjacent_epochs_pass_and_raise_others_are_refused() -> TestResult {
        let store = MemoryBackend::new();
        check(&store, "a", 5, false, Duration::ZERO).await?;
        assert_eq!(slots(&store).await?, [Some(5), None]);
        // One step either way passes; only a newer one raises the record.
        check(&store, "a", 4, false, Duration::ZERO).await?;
        check(&store, "a", 6, false, Duration::ZERO).await?;
        assert_eq!(slots(&store).await?, [Some(5), Some(6)]);
        check(&store, "a", 7, false, Duration::ZERO).await?;
        // The raise replaced the lower slot, never the highest.
        assert_eq!(slots(&store).await?, [Some(7), Some(6)]);
        assert!(refused(
            check(&store, "a", 5, false, Duration::ZERO).await,
            "epoch 5 is too old: shard \"a\" has seen epoch 7 (only adjacent steps"
        ));
        assert!(refused(
            check(&store, "a", 9, false, Duration::ZERO).await,
            "epoch 9 is too new: shard \"a\" has only seen epoch 7"
        ));
        // Refusals write nothing.
        assert_eq!(slots(&store).await?, [Some(7), Some(6)]);
        Ok(())
    }

    /// A shard removed at epoch 6 and added back at 8 (in the join step of
    /// a move) shows 6: it joins, so it is not "too new" there, and the
    /// record is raised; a process that skips a step is still refused on
    /// a store it does not join.
    #[tokio::test(start_paused = true)]
    async fn a_store_that_joins_may_have_missed_the_step_before() -> TestResult {
        let store = MemoryBackend::new();
        check(&store, "b", 6, false, Duration::ZERO).await?;
        assert!(refused(
            check(&store, "b", 8, false, Duration::ZERO).await,
            "epoch 8 is too new"
        ));
        check(&store, "b", 8, true, Duration::ZERO).await?;
        assert_eq!(slots(&store).await?, [Some(6), Some(8)]);
        assert!(refused(
            check(&store, "b", 6, true, Duration::ZERO).await,
            "epoch 6 is too old"
        ));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_near_its_end_is_renewed() -> TestResult {
        let store = MemoryBackend::new();
        let owner = Owner::new(format!("{OWNER_PREFIX}3"))?;
        let short = AcquireRequest::new(LockKey::new(SLOTS[1])?, owner, Duration::from_secs(5));
        assert!(matches!(
            store.try_acquire(&short).await?,
            Acquire::Granted(_)
        ));
        check(&store, "a", 3, false, Duration::ZERO).await?;
        let info = store
            .inspect(&LockKey::new(SLOTS[1])?)
            .await?
            .ok_or("the slot is gone")?;
        assert!(info.expires_in > REFRESH_BELOW, "{:?}", info.expires_in);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_reserved_key_held_by_someone_else_is_an_error_not_overwritten() -> TestResult {
        let store = MemoryBackend::new();
        let stranger = AcquireRequest::new(
            LockKey::new(SLOTS[0])?,
            Owner::new("someone")?,
            Duration::from_secs(60),
        );
        assert!(matches!(
            store.try_acquire(&stranger).await?,
            Acquire::Granted(_)
        ));
        assert!(refused(
            check(&store, "a", 1, false, Duration::ZERO).await,
            "is held by someone"
        ));
        Ok(())
    }
}
