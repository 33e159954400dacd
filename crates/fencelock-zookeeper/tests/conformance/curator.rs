//! The conformance suite on `layout=curator`: the cases of
//! `tests/conformance.rs`, each case's store under a chroot of its own
//! (the layout's keys are paths under the chroot, so the `prefix=` option
//! that isolates cases elsewhere would not), as far as the layout's
//! capabilities go (no read-write locks).
//!
//! Time: as in `main.rs`, the harness's patience per case; this file sets
//! no figure.

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
}
