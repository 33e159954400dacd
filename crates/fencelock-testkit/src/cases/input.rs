//! Bad input gives typed errors, never a panic; odd but valid input works.

use std::time::Duration;

use fencelock_core::{parse_duration, Error, LockClient, LockKey, MAX_TTL};

use super::{ensure, grant, long_ttl, owner};
use crate::suite::{Store, TestResult};

/// Empty, 256-byte and control-character keys are `InvalidKey` everywhere a
/// key is accepted.
pub async fn bad_keys_are_typed_errors(store: &dyn Store) -> TestResult {
    let client = LockClient::new(store.connect().await?);
    let long = "k".repeat(256);
    for bad in ["", long.as_str(), "nul\0key", "new\nline", "esc\u{1b}"] {
        let r = client.lock(bad).acquire().await;
        ensure!(
            matches!(r, Err(Error::InvalidKey(_))),
            "acquire({bad:?}) = {r:?}"
        );
        let r = client.inspect(bad).await;
        ensure!(
            matches!(r, Err(Error::InvalidKey(_))),
            "inspect({bad:?}) = {r:?}"
        );
        let r = client.force_release(bad).await;
        ensure!(
            matches!(r, Err(Error::InvalidKey(_))),
            "force_release({bad:?}) = {r:?}"
        );
    }
    Ok(())
}

/// Zero, sub-millisecond and absurd TTLs are `InvalidTtl`; negative and
/// unit-less durations do not parse.
pub async fn bad_ttls_are_typed_errors(store: &dyn Store) -> TestResult {
    let client = LockClient::new(store.connect().await?);
    for bad in [
        Duration::ZERO,
        Duration::from_nanos(1),
        MAX_TTL + Duration::from_secs(1),
        Duration::MAX,
    ] {
        let r = client.lock("ttl").ttl(bad).acquire().await;
        ensure!(
            matches!(r, Err(Error::InvalidTtl(_))),
            "ttl {bad:?} gave {r:?}"
        );
    }
    for bad in ["-5s", "-1ms", "", "abc", "10"] {
        ensure!(parse_duration(bad).is_err(), "{bad:?} parsed");
    }
    let r = client
        .lock("ttl")
        .ttl(Duration::from_secs(3))
        .renew_every(Duration::from_secs(5))
        .acquire()
        .await;
    ensure!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "renew_every past the TTL gave {r:?}"
    );
    ensure!(
        client.inspect("ttl").await?.is_none(),
        "a refused request left a lease"
    );
    Ok(())
}

/// Keys with quotes, SQL and glob metacharacters, unicode and the maximum
/// length are stored and returned exactly.
pub async fn odd_but_valid_keys_round_trip(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let long = "ü".repeat(127) + "x"; // 255 bytes
    let names = [
        "quote'\"`; DROP TABLE locks; --",
        "glob*?[a-z]{x}%_\\",
        "emoji 🔒 lock",
        "spaces and\u{a0}nbsp",
        "{braces}:hash-tag",
        long.as_str(),
    ];
    for name in names {
        let k = LockKey::new(name)?;
        let g = grant(&*b, &k, &owner("odd"), long_ttl()).await?;
        let info = b
            .inspect(&k)
            .await?
            .ok_or_else(|| format!("{name:?} not found"))?;
        ensure!(
            info.key.as_str() == name && info.token == g.token,
            "{name:?} came back as {info:?}"
        );
        ensure!(
            b.administer()?.list(Some(name)).await?.len() == 1,
            "list by the exact key {name:?}"
        );
    }
    Ok(())
}

/// Any valid JSON given as lease data comes back equal from `inspect`,
/// and `list`: NUL and other escapes, unicode outside the
/// BMP, deep nesting, big and small numbers.
pub async fn any_json_data_round_trips(store: &dyn Store) -> TestResult {
    let b = store.connect().await?;
    let values = [
        serde_json::json!({"a": "\u{0000}"}),
        serde_json::json!("nul \u{0000} in the middle, and at the end \u{0000}"),
        serde_json::json!({
            "escapes": "quote \" backslash \\ slash / \u{8} \u{c} \n \r \t \u{1f} \u{7f}",
            "unicode": "ü 🔒 \u{2028}\u{2029} \u{feff} 𝄞",
            "nested": [[[[[[1, [2, [3, [4, [5]]]]]]]]], {"x": [{"y": [null, true, false]}]}],
            "numbers": [0, -1, 1.5, 1e-7, 12345678901234567u64, -9007199254740993i64],
            "empty": [{}, [], ""],
            "\u{0000}key": "a NUL in a key",
        }),
        serde_json::json!([]),
        serde_json::json!(null),
    ];
    for (i, data) in values.into_iter().enumerate() {
        let k = LockKey::new(format!("data:{i}"))?;
        let mut req = super::request(&k, &owner("data"), long_ttl());
        req.data = Some(data.clone());
        match b.try_acquire(&req).await? {
            fencelock_core::Acquire::Granted(_) => {}
            held => return Err(format!("data:{i} was not granted: {held:?}").into()),
        }
        let inspected = b
            .inspect(&k)
            .await?
            .ok_or_else(|| format!("data:{i} not found"))?;
        // `null` as data may come back as no data.
        let expected = Some(data).filter(|d| !d.is_null());
        ensure!(
            inspected.data.clone().filter(|d| !d.is_null()) == expected,
            "inspect returned {:?} for {expected:?}",
            inspected.data
        );
        let listed = b.administer()?.list(Some(k.as_str())).await?;
        ensure!(
            listed.len() == 1 && listed[0].data.clone().filter(|d| !d.is_null()) == expected,
            "list returned {listed:?} for {expected:?}"
        );
    }
    Ok(())
}
