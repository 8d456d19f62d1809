//! Checks on the `/acp` upgrade request that come before authentication: browser origins and
//! credentials in the URL.
//!
//! A browser lets any page open a WebSocket to any host and sends that page's `Origin`; native
//! clients (editors, `acp-shim`) send none. So a request that carries `Origin` must name an
//! allowed one (the web console's own origin is, while the console is served), and one
//! without it is left to the bearer-token check. Tokens in query strings
//! end up in proxy logs, shell history and `Referer` headers: they are refused outright, and
//! the refusal never echoes them.

use crate::config::normalize_origin;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Query parameters that look like credentials.
const CREDENTIAL_PARAMS: &[&str] = &["token", "access_token", "bearer", "auth", "authorization"];

/// The allowlist, shared by the middleware.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    allowed: Vec<String>,
    /// The web console is served (over TLS when `.0`): its own origin is allowed; only when
    /// the request names a loopback host if `.1` (`--no-auth`: no credential would stop a
    /// page whose name was rebound to 127.0.0.1).
    console: Option<(bool, bool)>,
}

impl Origins {
    /// `allowed` must already be normalized (`Config` does it).
    pub fn new(allowed: Vec<String>) -> Origins {
        Origins {
            allowed,
            console: None,
        }
    }

    /// Also allows the web console's own origin (`tls`: it is served over TLS;
    /// `loopback_only`: only on requests to a loopback host name).
    pub fn with_console(mut self, tls: bool, loopback_only: bool) -> Origins {
        self.console = Some((tls, loopback_only));
        self
    }

    /// Why the request must be refused, if it must.
    #[allow(clippy::result_large_err)]
    pub fn check(&self, req: &Request) -> Result<(), Response> {
        if let Some(q) = req.uri().query()
            && has_credential_param(q)
        {
            tracing::warn!(target: "acpd::audit", "refused a credential in the query string");
            return Err((
                StatusCode::BAD_REQUEST,
                "credentials are not accepted in the URL; send Authorization: Bearer <token>\n",
            )
                .into_response());
        }
        let Some(origin) = req.headers().get(header::ORIGIN) else {
            return Ok(());
        };
        let allowed = origin
            .to_str()
            .ok()
            .and_then(normalize_origin)
            .is_some_and(|o| self.allowed.contains(&o));
        let own = || {
            self.console.is_some_and(|(tls, loopback_only)| {
                crate::web::is_own_origin(req.headers(), req.uri(), tls)
                    && (!loopback_only || crate::web::loopback_host(req.headers()))
            })
        };
        if allowed || own() {
            return Ok(());
        }
        tracing::warn!(
            target: "acpd::audit",
            origin = ?String::from_utf8_lossy(&origin.as_bytes()[..origin.len().min(200)]),
            "refused a browser origin that is not allowed (--allowed-origin)"
        );
        Err((StatusCode::FORBIDDEN, "origin not allowed\n").into_response())
    }
}

/// Middleware for `/acp`: runs the checks before the handler (and so before authentication).
pub async fn guard(State(origins): State<Origins>, req: Request, next: Next) -> Response {
    match origins.check(&req) {
        Ok(()) => next.run(req).await,
        Err(resp) => resp,
    }
}

fn has_credential_param(query: &str) -> bool {
    query.split('&').any(|pair| {
        let name = pair.split_once('=').map_or(pair, |(k, _)| k);
        CREDENTIAL_PARAMS
            .iter()
            .any(|c| name.eq_ignore_ascii_case(c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::body::Body;

    fn req(uri: &str, origin: Option<&str>) -> Request {
        let mut b = axum::http::Request::builder().uri(uri);
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(Body::empty()).expect("request")
    }

    fn status(r: Result<(), Response>) -> Option<StatusCode> {
        r.err().map(|r| r.status())
    }

    #[test]
    fn normalize_accepts_origins_only() {
        assert_eq!(
            normalize_origin("HTTPS://Editor.Example/").as_deref(),
            Some("https://editor.example")
        );
        assert_eq!(
            normalize_origin("https://x.test:443").as_deref(),
            Some("https://x.test")
        );
        assert_eq!(
            normalize_origin("http://x.test:8080").as_deref(),
            Some("http://x.test:8080")
        );
        assert_eq!(normalize_origin("null"), None);
        assert_eq!(normalize_origin("file://x"), None);
        assert_eq!(normalize_origin("https://x.test/path"), None);
        assert_eq!(normalize_origin("https://user@x.test"), None);
    }

    #[test]
    fn origin_must_be_listed_when_present() {
        let o = Origins::new(vec!["https://ok.test".into()]);
        assert_eq!(status(o.check(&req("/acp", None))), None);
        assert_eq!(status(o.check(&req("/acp", Some("https://OK.test")))), None);
        assert_eq!(
            status(o.check(&req("/acp", Some("https://evil.test")))),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            status(o.check(&req("/acp", Some("null")))),
            Some(StatusCode::FORBIDDEN)
        );
        let none = Origins::default();
        assert_eq!(
            status(none.check(&req("/acp", Some("https://ok.test")))),
            Some(StatusCode::FORBIDDEN)
        );
        // The console's own origin: the scheme served and the Host the request named.
        let console = Origins::default().with_console(false, false);
        let mut own = req("/acp", Some("http://127.0.0.1:7420"));
        own.headers_mut()
            .insert(header::HOST, "127.0.0.1:7420".parse().unwrap());
        assert_eq!(status(console.check(&own)), None);
        assert_eq!(status(none.check(&own)), Some(StatusCode::FORBIDDEN));
        let mut other = req("/acp", Some("http://evil.test"));
        other
            .headers_mut()
            .insert(header::HOST, "127.0.0.1:7420".parse().unwrap());
        assert_eq!(status(console.check(&other)), Some(StatusCode::FORBIDDEN));
        // Under --no-auth a rebound name is not the console's, though it is its own origin.
        let loopback_only = Origins::default().with_console(false, true);
        assert_eq!(status(loopback_only.check(&own)), None);
        let mut rebound = req("/acp", Some("http://evil.test:7420"));
        rebound
            .headers_mut()
            .insert(header::HOST, "evil.test:7420".parse().unwrap());
        assert_eq!(status(console.check(&rebound)), None);
        assert_eq!(
            status(loopback_only.check(&rebound)),
            Some(StatusCode::FORBIDDEN)
        );
    }

    #[test]
    fn credentials_in_the_query_are_refused() {
        let o = Origins::default();
        for q in [
            "/acp?token=x",
            "/acp?agent=a&access_token=x",
            "/acp?TOKEN",
            "/acp?auth=1",
        ] {
            assert_eq!(
                status(o.check(&req(q, None))),
                Some(StatusCode::BAD_REQUEST),
                "{q}"
            );
        }
        assert_eq!(status(o.check(&req("/acp?agent=tokenizer", None))), None);
    }
}
