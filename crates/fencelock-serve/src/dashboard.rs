//! The live dashboard: one page and its script and style sheet, compiled into
//! the binary so that `fencelock serve` needs no files, no build step and no
//! network beyond its own address. What the page shows is in
//! `docs/dashboard.md`.
//!
//! The page and its assets hold no lock data, so they are served without
//! authentication (a browser cannot attach a bearer token to a navigation);
//! the script sends the token the operator types to every API call.

use axum::{
    extract::Path,
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};

const INDEX_HTML: &str = include_str!("../assets/index.html");

/// The assets under `/assets/`: name, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../assets/style.css"),
    ),
];

/// The page may load only its own script and style and talk only to its own
/// origin: even a string that slipped past the script's escaping could not
/// run code or send data elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /` and `GET /assets/{name}`, for any router state.
pub(crate) fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
}

async fn index() -> Response {
    embedded("text/html; charset=utf-8", INDEX_HTML)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(asset, _, _)| *asset == name) {
        Some((_, content_type, body)) => embedded(content_type, body),
        None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

fn embedded(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            // Assets change with the binary, not with a version in their
            // name: revalidate rather than keep a stale script after an
            // upgrade.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(path: &str) -> Response {
        routes::<()>()
            .oneshot(
                Request::get(path)
                    .body(Body::empty())
                    .expect("a valid request"),
            )
            .await
            .expect("the router is infallible")
    }

    fn content_type(response: &Response) -> &str {
        response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    #[tokio::test]
    async fn page_and_assets_have_their_content_types() {
        for (path, expected) in [
            ("/", "text/html; charset=utf-8"),
            ("/assets/app.js", "text/javascript; charset=utf-8"),
            ("/assets/style.css", "text/css; charset=utf-8"),
        ] {
            let response = get(path).await;
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            assert_eq!(content_type(&response), expected, "{path}");
            assert!(
                response
                    .headers()
                    .contains_key(header::CONTENT_SECURITY_POLICY),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn unknown_assets_are_404() {
        for path in ["/assets/nope.js", "/assets/../src/lib.rs", "/assets/"] {
            assert_eq!(get(path).await.status(), StatusCode::NOT_FOUND, "{path}");
        }
    }

    #[test]
    fn the_page_loads_only_embedded_assets() {
        let mut referenced = 0;
        for attr in ["src=\"", "href=\""] {
            for (_, rest) in INDEX_HTML
                .match_indices(attr)
                .map(|(i, _)| INDEX_HTML.split_at(i + attr.len()))
            {
                let url = rest.split('"').next().unwrap_or("");
                let name = url.strip_prefix("/assets/").unwrap_or_else(|| {
                    panic!("the page refers to {url:?}, outside the embedded assets")
                });
                assert!(
                    ASSETS.iter().any(|(asset, _, _)| *asset == name),
                    "{url} is not embedded"
                );
                referenced += 1;
            }
        }
        assert_eq!(referenced, ASSETS.len(), "every asset is used by the page");
    }

    /// The escaping rule of the script: data reaches the page as text, never
    /// as markup.
    #[test]
    fn the_script_never_writes_markup() {
        let script = ASSETS
            .iter()
            .find(|(name, _, _)| *name == "app.js")
            .map(|(_, _, body)| *body)
            .unwrap_or("");
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!script.contains(sink), "app.js uses {sink}");
        }
    }
}
