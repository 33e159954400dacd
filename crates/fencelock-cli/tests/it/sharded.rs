//! `sharded://` maps through the binary, as an operator steps a deployment
//! through a move (docs/sharding.md): a lease taken by a process on one
//! step is renewed and released by a process on the next, and a process two
//! steps behind is refused with exit 2.
//!
//! Time: real processes. The lease must outlast the commands that renew
//! and release it, so its TTL is scaled from 60 s by a
//! [`Patience`](fencelock_testkit::Patience) measured first; a failure
//! names the budget.
#![cfg(feature = "sharded")]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use fencelock::sharded::{Shard, ShardMap};

use crate::support::{ms, patience};

const BIN: &str = env!("CARGO_BIN_EXE_fencelock");

fn run(map: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("RUST_LOG")
        .env("FENCELOCK_URL", format!("sharded://{}", map.display()))
        .args(args)
        .output()
        .expect("fencelock runs")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The four steps of shard `b` joining `a` (SQLite files in `dir`).
fn steps(dir: &Path) -> Vec<std::path::PathBuf> {
    let a = Shard::new("a", format!("sqlite://{}", dir.join("a.db").display()));
    let b = Shard::new("b", format!("sqlite://{}", dir.join("b.db").display()));
    let both = || vec![a.clone(), b.clone()];
    let maps = [
        ShardMap::new(1, vec![a.clone()]).unwrap(),
        ShardMap::new(2, both())
            .unwrap()
            .in_transition(fencelock::sharded::Phase::Join, vec![a.clone()])
            .unwrap(),
        ShardMap::new(3, both())
            .unwrap()
            .in_transition(fencelock::sharded::Phase::Handover, vec![a.clone()])
            .unwrap(),
        ShardMap::new(4, both()).unwrap(),
    ];
    maps.iter()
        .enumerate()
        .map(|(i, map)| {
            let path = dir.join(format!("step{}.toml", i + 1));
            std::fs::write(&path, map.to_toml()).unwrap();
            path
        })
        .collect()
}

#[test]
fn a_lease_of_join_is_renewed_and_released_on_handover_and_old_maps_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let steps = steps(dir.path());
    let new = ShardMap::read(&steps[3]).unwrap();
    let key = (0..1000)
        .map(|i| format!("job:{i}"))
        .find(|k| new.owner(k).name == "b")
        .unwrap();
    let p = patience();
    let ttl = ms(p.ttl(Duration::from_secs(60)));
    let taken = run(
        &steps[1],
        &["acquire", &key, "--owner", "holder", "--ttl", &ttl],
    );
    assert_eq!(code(&taken), 0, "{}", text(&taken));
    let token = text(&taken)
        .split(' ')
        .find_map(|f| f.strip_prefix("token="))
        .unwrap()
        .to_owned();
    for step in &steps[1..3] {
        let shown = run(step, &["inspect", &key]);
        assert_eq!(code(&shown), 0, "{} [{p}]", text(&shown));
        assert!(
            text(&shown).contains(&format!("(token {token})")),
            "{}",
            text(&shown)
        );
    }
    let lease = ["--owner", "holder", "--token", &token];
    let renewed = run(
        &steps[2],
        &[&["renew", &key, "--ttl", &ttl][..], &lease].concat(),
    );
    assert_eq!(code(&renewed), 0, "{} [{p}]", text(&renewed));
    let released = run(&steps[2], &[&["release", &key][..], &lease].concat());
    assert_eq!(code(&released), 0, "{} [{p}]", text(&released));
    assert_eq!(code(&run(&steps[1], &["inspect", &key])), 1);
    // Handover has used the shards: the old map is two steps behind.
    let old = run(&steps[0], &["acquire", &key, "--owner", "old"]);
    assert_eq!(code(&old), 2, "{}", text(&old));
    assert!(
        text(&old).contains("epoch 1 is too old") && text(&old).contains("adjacent steps"),
        "{}",
        text(&old)
    );
}
