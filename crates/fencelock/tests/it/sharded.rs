//! `sharded://` through the facade's driver registry: a map of two SQLite
//! shards opened by URL, and bad maps refused with typed errors.
#![cfg(all(feature = "sharded", feature = "sqlite"))]

use fencelock::Error;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::test]
async fn a_map_of_two_sqlite_shards_spreads_keys_over_both() -> TestResult {
    let dir = tempfile::tempdir()?;
    let shard = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    let map = dir.path().join("shards.toml");
    std::fs::write(
        &map,
        format!(
            "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"{}\"\n[[shard]]\nname = \"b\"\nurl = \"{}\"\n",
            shard("a.db"),
            shard("b.db")
        ),
    )?;
    let url = format!("sharded://{}", map.display());
    let client = fencelock::connect(&url).await?;
    let mut guards = Vec::new();
    for i in 0..16 {
        guards.push(client.lock(format!("job:{i}")).acquire().await?);
    }
    let listed = client.backend().administer()?.list(None).await?;
    assert_eq!(listed.len(), 16);
    for name in ["a.db", "b.db"] {
        let on_shard = fencelock::open_backend(&shard(name))
            .await?
            .administer()?
            .list(None)
            .await?;
        assert!(!on_shard.is_empty(), "no key on shard {name}");
    }
    for guard in guards {
        guard.release().await?;
    }
    assert!(matches!(
        fencelock::open_fence(&url).await,
        Err(Error::Unsupported(_))
    ));
    Ok(())
}

/// `[[place]]` rules in the file home keys on the shard they name: every
/// key of the prefix on `b`, the one exact key on `a`, whatever the
/// hashing would say; a rule naming a shard the map lacks is refused.
#[tokio::test]
async fn placement_rules_home_keys_on_their_shard() -> TestResult {
    let dir = tempfile::tempdir()?;
    let shard = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    let shards = format!(
        "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"{}\"\n[[shard]]\nname = \"b\"\nurl = \"{}\"\n",
        shard("a.db"),
        shard("b.db")
    );
    let map = dir.path().join("shards.toml");
    std::fs::write(
        &map,
        format!(
            "{shards}[[place]]\nprefix = \"east:\"\nshard = \"b\"\n\
             [[place]]\nkey = \"east:special\"\nshard = \"a\"\n"
        ),
    )?;
    let client = fencelock::connect(&format!("sharded://{}", map.display())).await?;
    let mut guards = Vec::new();
    for i in 0..8 {
        guards.push(client.lock(format!("east:{i}")).acquire().await?);
    }
    guards.push(client.lock("east:special").acquire().await?);
    let keys_on = |name: &'static str| {
        let url = shard(name);
        async move {
            let listed = fencelock::open_backend(&url)
                .await?
                .administer()?
                .list(None)
                .await?;
            Ok::<_, Error>(
                listed
                    .into_iter()
                    .map(|l| l.key.as_str().to_owned())
                    .filter(|k| k.starts_with("east:"))
                    .collect::<Vec<_>>(),
            )
        }
    };
    assert_eq!(keys_on("a.db").await?, ["east:special"]);
    assert_eq!(keys_on("b.db").await?.len(), 8);
    for guard in guards {
        guard.release().await?;
    }
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(
        &unknown,
        format!("{shards}[[place]]\nprefix = \"east:\"\nshard = \"c\"\n"),
    )?;
    match fencelock::open_backend(&format!("sharded://{}", unknown.display())).await {
        Err(Error::InvalidUrl(msg)) => assert!(msg.contains("\"c\""), "{msg}"),
        other => return Err(format!("a rule for shard c was accepted: {other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn bad_maps_are_invalid_urls_without_passwords() -> TestResult {
    let dir = tempfile::tempdir()?;
    let map = dir.path().join("shards.toml");
    std::fs::write(
        &map,
        "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"redis://:hunter2@h\n",
    )?;
    let bad_shard = dir.path().join("bad-shard.toml");
    std::fs::write(
        &bad_shard,
        "epoch = 1\n[[shard]]\nname = \"a\"\nurl = \"ftp://u:hunter2@h\"\n",
    )?;
    for url in [
        format!("sharded://{}", map.display()),
        format!("sharded://{}", dir.path().join("missing.toml").display()),
        format!("sharded://{}", bad_shard.display()),
    ] {
        match fencelock::open_backend(&url).await {
            Err(Error::InvalidUrl(msg)) => assert!(!msg.contains("hunter2"), "{msg}"),
            other => return Err(format!("{url}: {other:?}").into()),
        }
    }
    Ok(())
}

/// Writes the four steps of `b` joining `a` (SQLite shards in `dir`) as
/// map files; their `sharded://` URLs, in order.
fn step_urls(
    dir: &std::path::Path,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let shard = |name: &str| format!("sqlite://{}", dir.join(name).display());
    let a = format!("[[shard]]\nname = \"a\"\nurl = \"{}\"\n", shard("a.db"));
    let b = format!("[[shard]]\nname = \"b\"\nurl = \"{}\"\n", shard("b.db"));
    let previous = a.replace("[[shard]]", "[[previous]]");
    let texts = [
        format!("epoch = 1\n{a}"),
        format!("epoch = 2\nphase = \"join\"\n{a}{b}{previous}"),
        format!("epoch = 3\nphase = \"handover\"\n{a}{b}{previous}"),
        format!("epoch = 4\n{a}{b}"),
    ];
    let mut urls = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let path = dir.join(format!("step{}.toml", i + 1));
        std::fs::write(&path, text)?;
        urls.push(format!("sharded://{}", path.display()));
    }
    Ok(urls)
}

/// A key that moves from `a` to `b` (routing depends on shard names only).
fn moving_key() -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    use fencelock::sharded::{Shard, ShardMap};
    let map = ShardMap::new(
        1,
        vec![Shard::new("a", "mem://"), Shard::new("b", "mem://")],
    )?;
    (0..1000)
        .map(|i| format!("job:{i}"))
        .find(|key| map.owner(key).name == "b")
        .ok_or_else(|| "no key moves to b".into())
}

/// The issue: a lease taken by a process on step 2 could not be renewed or
/// released by one on step 3 ("not held by … with token 2"), and `inspect`
/// answered token 2 or 3 depending on the step. Now the step-3 process
/// renews and releases it, and both steps read the token the holder got.
#[tokio::test]
async fn a_lease_of_join_is_renewed_and_released_on_handover() -> TestResult {
    let dir = tempfile::tempdir()?;
    let urls = step_urls(dir.path())?;
    let key = fencelock::LockKey::new(moving_key()?)?;
    let owner = fencelock::Owner::new("holder")?;
    let ttl = std::time::Duration::from_secs(60);
    let join = fencelock::open_backend(&urls[1]).await?;
    let fencelock::Acquire::Granted(grant) = join
        .try_acquire(&fencelock::AcquireRequest::new(
            key.clone(),
            owner.clone(),
            ttl,
        ))
        .await?
    else {
        return Err("not granted".into());
    };
    let handover = fencelock::open_backend(&urls[2]).await?;
    for backend in [&join, &handover] {
        let info = backend.inspect(&key).await?.ok_or("free")?;
        assert_eq!((info.owner.as_str(), info.token), ("holder", grant.token));
    }
    let lease = fencelock::LeaseId::new(key.clone(), owner, grant.token);
    assert_eq!(handover.renew(&lease, ttl).await?.token, grant.token);
    handover.release(&lease).await?;
    assert!(join.inspect(&key).await?.is_none());
    assert!(handover.inspect(&key).await?.is_none());
    Ok(())
}

/// Steps two apart never run together: once step 3 has used the shards, a
/// process on step 1 (already running, or started later) is refused with
/// `InvalidArgument` (the CLI's exit 2), saying which epochs.
#[tokio::test]
async fn a_process_two_steps_behind_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let urls = step_urls(dir.path())?;
    let old = fencelock::connect(&urls[0]).await?;
    old.lock(moving_key()?).acquire().await?.release().await?;
    // Jumping straight to the new map is refused too.
    assert!(matches!(
        fencelock::open_backend(&urls[3]).await,
        Err(Error::InvalidArgument(msg)) if msg.contains("epoch 4 is too new")
    ));
    fencelock::open_backend(&urls[1]).await?;
    fencelock::open_backend(&urls[2]).await?;
    match old.lock(moving_key()?).acquire().await {
        Err(Error::InvalidArgument(msg)) => assert!(
            msg.contains("epoch 1 is too old")
                && msg.contains("has seen epoch 3")
                && msg.contains("only adjacent steps may run together"),
            "{msg}"
        ),
        other => return Err(format!("step 1 was not refused: {other:?}").into()),
    }
    assert!(matches!(
        fencelock::open_backend(&urls[0]).await,
        Err(Error::InvalidArgument(_))
    ));
    // The next step is still welcome.
    fencelock::open_backend(&urls[3]).await?;
    Ok(())
}
