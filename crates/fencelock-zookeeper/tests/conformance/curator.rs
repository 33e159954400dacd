//! The conformance suite on `layout=curator`: the cases of
//! `tests/conformance.rs`, each case's store under a chroot of its own
//! (the layout's keys are paths under the chroot, so the `prefix=` option
//! that isolates cases elsewhere would not), as far as the layout's
//! capabilities go (no read-write locks).

use fencelock_core::{Backend, Driver};
use fencelock_testkit::servers::{url_factory::UrlFactory, zookeeper::ZkServer};

/// `zk://HOSTS?prefix=caseN…` (the factory's case URL) as
/// `zk://HOSTS/caseN?layout=curator…`.
fn curator_url(url: &str) -> String {
    let (location, query) = url.split_once('?').unwrap_or((url, ""));
    let mut chroot = String::new();
    let mut rest = vec!["layout=curator".to_owned()];
    for option in query.split('&').filter(|o| !o.is_empty()) {
        match option.strip_prefix("prefix=") {
            Some(case) => chroot = format!("/{case}"),
            None => rest.push(option.to_owned()),
        }
    }
    format!("{location}{chroot}?{}", rest.join("&"))
}

async fn open(url: String) -> fencelock_core::Result<std::sync::Arc<dyn Backend>> {
    fencelock_zookeeper::ZkDriver
        .open_backend(&curator_url(&url))
        .await
}

/// The layout's contender nodes belong to the backend's session
/// (`docs/zookeeper.md`, "Leases and the session in `layout=curator`"),
/// which three cases contradict; `tests/it/interop.rs` checks what the
/// layout does instead.
pub fn suite() -> fencelock_testkit::Suite {
    fencelock_testkit::Suite::new(UrlFactory::<ZkServer>::new(
        "zookeeper-curator",
        |url| Box::pin(open(url)),
        Some(|url| {
            Box::pin(async move {
                fencelock_zookeeper::ZkDriver
                    .open_fence(&curator_url(&url))
                    .await
            })
        }),
    ))
    // Asks for a 60 s renewal and wants at least that: granted at most
    // half the session timeout (`a_lease_never_outlives_its_session`).
    .except(
        "capabilities::renew_many_answers_each_lease",
        "grants are capped at half the session timeout",
    )
    // Renews through another backend's session, which cannot prove the
    // holder's session alive (`a_lease_is_renewed_only_through_its_session`).
    .except(
        "resume::resume_reattaches_to_the_exact_lease",
        "a lease is renewed only through its own session",
    )
    // Drops the waiter's backend and wants its entry listed until its
    // TTL: it goes with the session at once
    // (`a_crashed_waiters_entry_goes_with_its_session`).
    .except(
        "fair::a_crashed_waiters_entry_blocks_at_most_its_ttl",
        "a closed session takes its queue entries with it",
    )
}
