//! Bearer tokens from a token file (format in `docs/http.md`).
//!
//! Tokens are compared in constant time and never logged or echoed; the
//! `Debug` form of [`Tokens`] shows only how many there are.

use std::{fmt, path::Path};

use axum::{
    extract::{Request, State},
    http::header::AUTHORIZATION,
    middleware::Next,
    response::{IntoResponse, Response},
};
use subtle::ConstantTimeEq;

use fencelock_core::Owner;

use crate::{error::ApiError, Service};

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every route except the operator's: force-release and cleanup.
    Client,
    /// Every route.
    Admin,
}

/// Who is calling: the role of the bearer token and, for a client token,
/// the namespace its owners live in (`docs/http.md`, "Who may do what").
///
/// A client token's owners are stored as `NAMESPACE/owner`: whatever owner
/// a client names, the service puts it in that client's namespace before
/// the backend sees it, so a lease taken with one client token can be
/// renewed, released or given new data only with a token of the same
/// namespace, even by someone who read its owner and token from
/// `GET /v1/locks/{key}`, the event stream or `/metrics`. The admin (and
/// every caller of a service without tokens) names owners as they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// What the token may do.
    pub role: Role,
    namespace: Option<String>,
}

impl Caller {
    /// A caller without a namespace: the admin, or anyone when the service
    /// has no tokens.
    pub fn admin() -> Self {
        Self {
            role: Role::Admin,
            namespace: None,
        }
    }

    /// The namespace of a client token's owners (`None` for the admin).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// `owner` as the backend stores it for this caller: in the caller's
    /// namespace. An owner already in it is taken as it is, so a client
    /// may name its owner either way (as it sent it, or as the service
    /// showed it).
    pub fn owner_in(&self, owner: &str) -> fencelock_core::Result<Owner> {
        // One rule for every role: the owner as named must be one (not
        // empty, no control characters) before a namespace is put on it.
        Owner::new(owner)?;
        match &self.namespace {
            Some(ns) if !in_namespace(ns, owner) => Owner::new(format!("{ns}/{owner}")),
            _ => Owner::new(owner),
        }
    }

    /// A stored owner as this caller is shown it: its own namespace is
    /// left out, so a client sees the owner names it chose, and every
    /// other namespace is shown.
    pub fn owner_out(&self, owner: &str) -> String {
        match &self.namespace {
            Some(ns) if in_namespace(ns, owner) => owner[ns.len() + 1..].to_owned(),
            _ => owner.to_owned(),
        }
    }
}

fn in_namespace(ns: &str, owner: &str) -> bool {
    owner.len() > ns.len() + 1 && owner.starts_with(ns) && owner.as_bytes()[ns.len()] == b'/'
}

/// One line of a token file.
#[derive(Clone)]
struct Entry {
    role: Role,
    /// The token's SHA-256: what a presented token's digest is compared
    /// with, so that the comparison takes as long whatever the lengths.
    digest: [u8; 32],
    namespace: String,
}

fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// The accepted bearer tokens and their roles.
#[derive(Clone)]
pub struct Tokens {
    entries: Vec<Entry>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.entries.len())
            .finish()
    }
}

/// Shortest token accepted: shorter ones are guessable.
const MIN_TOKEN_LEN: usize = 16;

impl Tokens {
    /// Parses a token file: one `client TOKEN [NAMESPACE]` or `admin TOKEN`
    /// a line; blank lines and lines starting with `#` are ignored. Tokens
    /// are at least 16 characters without white space. A client token's
    /// owners live in its NAMESPACE (1–64 of `A–Z a–z 0–9 _ . -`; several
    /// tokens may share one, e.g. while a token is rotated), by default
    /// `c-` and the first 12 hex digits of the token's SHA-256, which says
    /// nothing usable about the token. Errors name the line, never the
    /// token.
    ///
    /// ```
    /// use fencelock_serve::{Role, Tokens};
    /// let tokens = Tokens::parse(
    ///     "# operators\nadmin 0123456789abcdef0123\nclient fedcba9876543210fedc billing\n",
    /// )
    /// .unwrap();
    /// assert_eq!(tokens.role("fedcba9876543210fedc"), Some(Role::Client));
    /// let caller = tokens.caller("fedcba9876543210fedc").unwrap();
    /// assert_eq!(caller.owner_in("worker-1").unwrap().as_str(), "billing/worker-1");
    /// assert_eq!(caller.owner_out("billing/worker-1"), "worker-1");
    /// assert_eq!(tokens.role("nope"), None);
    /// assert!(Tokens::parse("root 0123456789abcdef").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let n = n + 1;
            let mut words = line.split_whitespace();
            let role = match words.next() {
                Some("admin") => Role::Admin,
                Some("client") => Role::Client,
                _ => {
                    return Err(format!(
                        "line {n}: expected `client TOKEN [NAMESPACE]` or `admin TOKEN`"
                    ))
                }
            };
            let Some(token) = words.next() else {
                return Err(format!("line {n}: expected a token after the role"));
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "line {n}: the token is shorter than {MIN_TOKEN_LEN} characters"
                ));
            }
            let namespace = match (role, words.next(), words.next()) {
                (_, _, Some(_)) | (Role::Admin, Some(_), None) => {
                    return Err(format!(
                        "line {n}: expected `client TOKEN [NAMESPACE]` or `admin TOKEN`"
                    ))
                }
                (_, Some(name), None) => {
                    check_namespace(name).map_err(|e| format!("line {n}: {e}"))?;
                    name.to_owned()
                }
                (_, None, None) => fingerprint(token),
            };
            entries.push(Entry {
                role,
                digest: digest(token),
                namespace,
            });
        }
        if entries.is_empty() {
            return Err("no tokens: the file would lock everyone out".to_owned());
        }
        Ok(Self { entries })
    }

    /// Reads and parses a token file.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("token file {}: {e}", path.display()))
    }

    /// The role of `token`, if it is one of ours.
    pub fn role(&self, token: &str) -> Option<Role> {
        self.caller(token).map(|c| c.role)
    }

    /// Who `token` is, if it is one of ours.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        // Digests of one length, compared in constant time, with every
        // entry: the time taken says neither which matched nor how long a
        // token is (a comparison of the tokens themselves ends at once when
        // the lengths differ).
        let presented = digest(token);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(&presented)) {
                found = Some(entry);
            }
        }
        found.map(|entry| Caller {
            role: entry.role,
            namespace: (entry.role == Role::Client).then(|| entry.namespace.clone()),
        })
    }
}

/// Longest namespace: an owner in it still has room below the 255-byte limit.
const MAX_NAMESPACE_LEN: usize = 64;

fn check_namespace(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAMESPACE_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a namespace is 1–{MAX_NAMESPACE_LEN} characters of A–Z, a–z, 0–9, `_`, `.` and `-`"
        ))
    }
}

/// The default namespace of a client token: stable across replicas that
/// share the token file, and not a way back to the token.
fn fingerprint(token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("c-{hex}")
}

/// Admits requests with a valid bearer token (all of them without
/// [`Tokens`]) and records the caller's [`Role`] for admin-only routes and
/// its [`Caller`] for the owner namespaces.
pub(crate) async fn require(
    State(service): State<Service>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = match &service.inner.tokens {
        None => Caller::admin(),
        Some(tokens) => {
            let presented = request
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split_once(' '))
                // The scheme is case-insensitive (RFC 9110).
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token);
            match presented.and_then(|t| tokens.caller(t.trim())) {
                Some(caller) => caller,
                None => {
                    return ApiError::new(
                        axum::http::StatusCode::UNAUTHORIZED,
                        "unauthorized",
                        "a valid `Authorization: Bearer TOKEN` header is required",
                    )
                    .into_response()
                }
            }
        }
    };
    request.extensions_mut().insert(caller.role);
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Refuses callers without the admin role.
pub(crate) fn admin_only(role: Role) -> Result<(), ApiError> {
    match role {
        Role::Admin => Ok(()),
        Role::Client => Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            "this route needs an admin token",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is compared is a 32-byte digest whatever the token's length, so
    /// a wrong length costs as long as a wrong token (the timing itself is
    /// not measured here: a wall-clock test of it would be noise).
    #[test]
    fn tokens_are_matched_by_digests_of_one_length() {
        let tokens =
            Tokens::parse("admin 0123456789abcdef0123\nclient fedcba9876543210\n").unwrap();
        assert_eq!(tokens.entries[0].digest, digest("0123456789abcdef0123"));
        assert_eq!(tokens.role("0123456789abcdef0123"), Some(Role::Admin));
        assert_eq!(tokens.role("fedcba9876543210"), Some(Role::Client));
        for wrong in [
            "",
            "0123456789abcdef012",
            "0123456789abcdef01234",
            "fedcba9876543210 ",
        ] {
            assert_eq!(tokens.role(wrong), None, "{wrong:?}");
        }
    }
}
