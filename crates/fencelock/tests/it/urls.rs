//! Malformed URLs are typed errors without passwords; known schemes open.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use fencelock::{open_backend, open_fence, Error};

#[tokio::test]
async fn malformed_urls_are_invalid_url_errors() {
    for bad in [
        "",
        "locks.db",
        "://x",
        "sqlite:/x",
        "ftp://host/x",
        "sqlite://",
        "sqlite:///tmp/x?bogus=1",
    ] {
        let r = open_backend(bad).await;
        assert!(matches!(r, Err(Error::InvalidUrl(_))), "{bad:?}: {r:?}");
    }
}

#[tokio::test]
async fn errors_never_show_passwords() {
    for url in [
        "ftp://user:hunter2@host/x",
        "nonsense://:hunter2@h",
        "user:hunter2@host",
    ] {
        let err = open_backend(url).await.unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{url}: {err}");
    }
}

#[tokio::test]
async fn memory_and_sqlite_open() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("l.db").display());
    assert_eq!(open_backend(&url).await.unwrap().name(), "sqlite");
    assert_eq!(open_fence(&url).await.unwrap().name(), "sqlite");
    assert_eq!(open_backend("mem://").await.unwrap().name(), "memory");
    // Schemes are case-insensitive; an empty path is still an error.
    assert!(matches!(
        open_backend("SQLITE://").await,
        Err(Error::InvalidUrl(_))
    ));
}

/// A known scheme without `//` is refused, saying how to write it.
#[tokio::test]
async fn a_known_scheme_without_slashes_says_how_to_write_it() {
    let err = open_backend("sqlite:relative.db").await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidUrl(_)), "{err:?}");
    assert!(
        text.contains("sqlite://relative.db") && text.contains("sqlite:///relative.db"),
        "{text}"
    );
    let err = open_backend("postgres:u:hunter2@h/db").await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("postgres://") && !text.contains("hunter2"),
        "{text}"
    );
}

/// `create=false` opens an existing store only, and creates nothing.
#[tokio::test]
async fn sqlite_create_false_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join("l.db");
    let url = format!("sqlite://{}", path.display());
    let r = open_backend(&format!("{url}?create=false")).await;
    assert!(r.is_err(), "a missing store opened");
    assert!(!dir.path().join("sub").exists());
    assert!(open_backend(&url).await.is_ok());
    assert!(open_backend(&format!("{url}?create=false")).await.is_ok());
    assert!(matches!(
        open_backend(&format!("{url}?create=maybe")).await,
        Err(Error::InvalidUrl(_))
    ));
}
