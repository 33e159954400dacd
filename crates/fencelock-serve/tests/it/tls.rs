//! HTTPS: the service with `--tls-cert/--tls-key`, and the `https://`
//! backend trusting a private CA through `ca_file`.
//!
//! Time: the lease (10 s, in the service's own memory store) outlives the
//! test's two local requests and keeps its figure; no wait or bound.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::{sync::Arc, time::Duration};

use fencelock_core::{LockClient, MemoryBackend, MemoryFence};
use fencelock_http::HttpBackend;
use fencelock_serve::{Server, Service};

#[tokio::test]
async fn locks_are_served_over_https_to_clients_that_trust_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();

    let service = Service::builder(LockClient::new(Arc::new(MemoryBackend::new())))
        .fence(Arc::new(MemoryFence::new()))
        .build();
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), service)
        .await
        .unwrap()
        .tls(cert_path.clone(), key_path);
    let port = server.local_addr().port();
    let _running = server.spawn();

    let url = format!("https://localhost:{port}?ca_file={}", cert_path.display());
    let client = LockClient::new(Arc::new(HttpBackend::connect(&url).await.unwrap()));
    let guard = client
        .lock("tls:1")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let seen = client.inspect("tls:1").await.unwrap().unwrap();
    assert_eq!(seen.token, guard.token());
    guard.release().await.unwrap();

    // Without the CA the certificate is refused; plain HTTP gets no answer
    // from a TLS port. Neither is ever a grant.
    let untrusted = HttpBackend::connect(&format!("https://localhost:{port}")).await;
    assert!(untrusted.is_err(), "{untrusted:?}");
    let plain = HttpBackend::connect(&format!("http://localhost:{port}")).await;
    assert!(plain.is_err(), "{plain:?}");
}

/// A self-signed certificate that is a CA (`openssl req -x509` makes one
/// with `CA:TRUE`) cannot be a server's certificate: a client that trusts
/// it still refuses it, and the error says that the certificate is the
/// problem and why, not only that a request failed (docs/http.md, "TLS").
#[tokio::test]
async fn a_ca_certificate_served_as_the_servers_own_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();

    let service = Service::builder(LockClient::new(Arc::new(MemoryBackend::new()))).build();
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), service)
        .await
        .unwrap()
        .tls(cert_path.clone(), key_path);
    let port = server.local_addr().port();
    let _running = server.spawn();

    let url = format!("https://localhost:{port}?ca_file={}", cert_path.display());
    let refused = HttpBackend::connect(&url).await.unwrap_err().to_string();
    assert!(
        refused.contains("certificate") && refused.contains("CaUsedAsEndEntity"),
        "{refused}"
    );
}
