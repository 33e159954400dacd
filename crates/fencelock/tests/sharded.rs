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
    let listed = client.backend().list(None).await?;
    assert_eq!(listed.len(), 16);
    for name in ["a.db", "b.db"] {
        let on_shard = fencelock::open_backend(&shard(name))
            .await?
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
