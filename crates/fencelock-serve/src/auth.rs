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

use crate::{error::ApiError, Service};

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every route except the operator's: force-release and cleanup.
    Client,
    /// Every route.
    Admin,
}

/// The accepted bearer tokens and their roles.
#[derive(Clone)]
pub struct Tokens {
    entries: Vec<(Role, Vec<u8>)>,
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
    /// Parses a token file: one `client TOKEN` or `admin TOKEN` a line;
    /// blank lines and lines starting with `#` are ignored. Tokens are at
    /// least 16 characters without white space. Errors name the line, never
    /// the token.
    ///
    /// ```
    /// use fencelock_serve::{Role, Tokens};
    /// let tokens = Tokens::parse("# operators\nadmin 0123456789abcdef0123\nclient fedcba9876543210fedc\n").unwrap();
    /// assert_eq!(tokens.role("fedcba9876543210fedc"), Some(Role::Client));
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
            let mut words = line.split_whitespace();
            let role = match words.next() {
                Some("admin") => Role::Admin,
                Some("client") => Role::Client,
                _ => {
                    return Err(format!(
                        "line {}: expected `client TOKEN` or `admin TOKEN`",
                        n + 1
                    ))
                }
            };
            let (Some(token), None) = (words.next(), words.next()) else {
                return Err(format!("line {}: expected one token after the role", n + 1));
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "line {}: the token is shorter than {MIN_TOKEN_LEN} characters",
                    n + 1
                ));
            }
            entries.push((role, token.as_bytes().to_vec()));
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
        // Every entry is compared, so the time taken does not say which matched.
        let mut found = None;
        for (role, known) in &self.entries {
            if bool::from(known.as_slice().ct_eq(token.as_bytes())) {
                found = Some(*role);
            }
        }
        found
    }
}

/// Admits requests with a valid bearer token (all of them without
/// [`Tokens`]) and records the caller's [`Role`] for admin-only routes.
pub(crate) async fn require(
    State(service): State<Service>,
    mut request: Request,
    next: Next,
) -> Response {
    let role = match &service.inner.tokens {
        None => Role::Admin,
        Some(tokens) => {
            let presented = request
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split_once(' '))
                // The scheme is case-insensitive (RFC 9110).
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token);
            match presented.and_then(|t| tokens.role(t.trim())) {
                Some(role) => role,
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
    request.extensions_mut().insert(role);
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
