//! `ace playground`: serve the policy playground (a static page and its
//! wasm module, `playground/`) on a local address.
//!
//! Why a server at all: browsers load module scripts and `.wasm` only over
//! http(s), never from `file://`. Why this one: it is the control
//! service's bounded server ([`ace_control::listen`]: hyper on a small
//! tokio runtime, a connection cap in all and per address, idle and
//! header-read timeouts), so idle connections cost a little memory each,
//! never a thread, and past the caps are closed instead of bringing the
//! server down. The site is a handful of static files read on request.
//! The default binds to 127.0.0.1: the page needs nothing else, and
//! nothing it is given leaves the browser. Requests must be addressed to
//! an IP address or `localhost` (the `Host` header), so that a page
//! elsewhere cannot rebind its own domain name to this address and read
//! the site.

use ace_cli::outln;
use anyhow::{anyhow, bail, Context as _};
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

/// Where `ace playground` listens unless told otherwise (the control
/// service has 9911, Envoy's admin 9901 and 9902).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9920";

/// Arguments of `ace playground`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Serve this already-built site (the directory
    /// `scripts/build-playground.sh` prints) instead of building it.
    #[arg(long, value_name = "DIR")]
    site: Option<PathBuf>,
}

/// The bounds of the playground's connections: a browser opens a handful.
fn limits() -> ace_control::listen::Limits {
    ace_control::listen::Limits {
        max_connections: Some(512),
        max_per_ip: 128,
        idle_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(30),
        max_headers: MAX_HEADERS,
    }
}

/// Builds the site unless given one, then serves it until interrupted.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let site = match args.site {
        Some(dir) => dir,
        None => build()?,
    };
    if !site.join("index.html").is_file() {
        bail!(
            "`{}` holds no playground (no index.html); pass the directory \
             scripts/build-playground.sh prints, or leave out --site to build it",
            site.display()
        );
    }
    // Two workers and at most four threads reading files: the thread
    // count does not grow with connections.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .context("cannot start the playground's runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {}; pass another address with --listen, e.g. --listen 127.0.0.1:0",
                    args.listen
                )
            })?;
        let addr = listener.local_addr()?;
        outln!("ace playground: serving {}", site.display());
        outln!("open http://{addr}/ (Ctrl-C stops)");
        let site = Arc::new(site);
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
            let site = site.clone();
            async move { answer(&site, &method, &uri, &headers).await }
        });
        let stats = Arc::new(ace_control::listen::Stats::default());
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        ace_control::listen::serve(listener, app, limits(), stats, stop, |m| {
            eprintln!("ace playground: {}", ace_control::logged(m))
        })
        .await;
        Ok(ExitCode::SUCCESS)
    })
}

/// The answer to one request (GET and HEAD only; the body of a HEAD
/// answer is left out by the server).
async fn answer(site: &Path, method: &Method, uri: &Uri, headers: &HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or(uri.authority().map(|a| a.as_str()));
    if !host.is_none_or(host_allowed) {
        return plain(
            StatusCode::MISDIRECTED_REQUEST,
            "the playground answers requests addressed to an IP address or localhost only\n",
            true,
        );
    }
    if method != Method::GET && method != Method::HEAD {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "the playground serves GET and HEAD only\n",
            true,
        );
    }
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let Some(file) = resolve(site, target) else {
        return plain(
            StatusCode::NOT_FOUND,
            "no such file in the playground\n",
            false,
        );
    };
    match tokio::fs::read(&file).await {
        Ok(bytes) => with_headers(Response::new(Body::from(bytes)), content_type(&file), false),
        Err(_) => plain(
            StatusCode::NOT_FOUND,
            "no such file in the playground\n",
            false,
        ),
    }
}

fn plain(status: StatusCode, text: &'static str, close: bool) -> Response {
    let mut r = with_headers(
        Response::new(Body::from(text)),
        "text/plain; charset=utf-8",
        close,
    );
    *r.status_mut() = status;
    r
}

fn with_headers(mut r: Response, kind: &'static str, close: bool) -> Response {
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if close {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// Runs `scripts/build-playground.sh` (incremental after the first build)
/// and returns the site directory it prints last.
fn build() -> anyhow::Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = root.join("scripts/build-playground.sh");
    outln!("building the playground (scripts/build-playground.sh)...");
    let out = Command::new("bash")
        .arg(&script)
        .current_dir(&root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run `{}`", script.display()))?;
    if !out.status.success() {
        bail!(
            "building the playground failed ({}); the messages above say why \
             (a missing toolchain: run `make setup`)",
            out.status
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().unwrap_or("").trim();
    if dir.is_empty() {
        return Err(anyhow!("`{}` printed no site directory", script.display()));
    }
    Ok(PathBuf::from(dir))
}

/// The content type of a site file, by extension. Module scripts must be
/// JavaScript and the module `application/wasm` for browsers to take them.
fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        Some("cedar" | "cedarschema" | "toml" | "txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The file under `site` that `target` (a request target such as
/// `/pkg/ace_playground.js?v=1`) names, or `None` when it names none (or
/// tries to leave the site).
fn resolve(site: &Path, target: &str) -> Option<PathBuf> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    let relative = path.strip_prefix('/')?;
    let relative = if relative.is_empty() || relative.ends_with('/') {
        format!("{relative}index.html")
    } else {
        relative.to_string()
    };
    let relative = Path::new(&relative);
    if !relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return None;
    }
    let file = site.join(relative);
    file.is_file().then_some(file)
}

/// Header lines accepted per request; a request with more is answered
/// 431.
const MAX_HEADERS: usize = 100;

/// Whether a `Host` header names this machine the way a browser does when
/// it opens the URL `ace playground` prints: an IP address or `localhost`,
/// with or without a port. A domain name is refused: a page elsewhere could
/// point its own name at 127.0.0.1 (DNS rebinding) and read the site.
fn host_allowed(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // An IPv6 literal, `[::1]:9920`.
        return rest
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_resolve_inside_the_site_only() {
        let site = tempfile::tempdir().unwrap();
        std::fs::write(site.path().join("index.html"), "x").unwrap();
        std::fs::create_dir(site.path().join("pkg")).unwrap();
        std::fs::write(site.path().join("pkg/m.wasm"), "x").unwrap();
        let r = |t: &str| resolve(site.path(), t);
        assert_eq!(r("/"), Some(site.path().join("index.html")));
        assert_eq!(r("/?x=1"), Some(site.path().join("index.html")));
        assert_eq!(r("/pkg/m.wasm"), Some(site.path().join("pkg/m.wasm")));
        assert_eq!(r("/pkg/../index.html"), None);
        assert_eq!(r("/../etc/passwd"), None);
        assert_eq!(r("//etc/passwd"), None);
        assert_eq!(r("index.html"), None);
        assert_eq!(r("/missing.js"), None);
        assert_eq!(content_type(Path::new("a.wasm")), "application/wasm");
        for ok in [
            "127.0.0.1:9920",
            "localhost:9920",
            "LOCALHOST",
            "[::1]:9920",
            "10.1.2.3",
        ] {
            assert!(host_allowed(ok), "{ok}");
        }
        for no in [
            "evil.example:9920",
            "evil.example",
            "127.0.0.1.nip.io:80",
            "[nope]:1",
            "",
        ] {
            assert!(!host_allowed(no), "{no}");
        }
        assert_eq!(
            content_type(Path::new("a.js")),
            "text/javascript; charset=utf-8"
        );
    }
}
