//! `ace playground`: serve the policy playground (a static page and its
//! wasm module, `playground/`) on a local address.
//!
//! Why a server at all: browsers load module scripts and `.wasm` only over
//! http(s), never from `file://`. Why this small one: the site is a handful
//! of static files read on request, so a blocking listener with a thread per
//! connection is all it takes, and the page works the same from any static
//! host. The default binds to 127.0.0.1: the page needs nothing else, and
//! nothing it is given leaves the browser. Requests must be addressed to an
//! IP address or `localhost` (the `Host` header), so that a page elsewhere
//! cannot rebind its own domain name to this address and read the site.

use ace_cli::outln;
use anyhow::{anyhow, bail, Context as _};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitCode};
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
    let listener = TcpListener::bind(args.listen).with_context(|| {
        format!(
            "cannot listen on {}; pass another address with --listen, e.g. --listen 127.0.0.1:0",
            args.listen
        )
    })?;
    let addr = listener.local_addr()?;
    outln!("ace playground: serving {}", site.display());
    outln!("open http://{addr}/ (Ctrl-C stops)");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let site = site.clone();
        std::thread::spawn(move || {
            // A client that goes away mid-answer is its own business.
            let _ = serve(stream, &site);
        });
    }
    Ok(ExitCode::SUCCESS)
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

/// Answers the requests on one connection (HTTP/1.1 with keep-alive, GET
/// and HEAD only).
fn serve(stream: TcpStream, site: &Path) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.by_ref().take(8192).read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, target, version) = (parts.next(), parts.next(), parts.next());
        let mut close = version != Some("HTTP/1.1");
        let mut host_ok = true;
        let mut headers = 0;
        loop {
            let mut header = String::new();
            if reader.by_ref().take(8192).read_line(&mut header)? == 0 {
                return Ok(());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            headers += 1;
            if headers > MAX_HEADERS {
                return Ok(());
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("connection")
                    && value.trim().eq_ignore_ascii_case("close")
                {
                    close = true;
                }
                if name.eq_ignore_ascii_case("host") {
                    host_ok = host_allowed(value.trim());
                }
            }
        }
        let (status, kind, body) = match (method, target) {
            _ if !host_ok => {
                close = true;
                (
                    "421 Misdirected Request",
                    "text/plain; charset=utf-8",
                    (
                        true,
                        b"the playground answers requests addressed to an IP address or \
                          localhost only\n"
                            .to_vec(),
                    ),
                )
            }
            (Some(m @ ("GET" | "HEAD")), Some(t)) => match resolve(site, t) {
                Some(file) => match std::fs::read(&file) {
                    Ok(bytes) => ("200 OK", content_type(&file), (m == "GET", bytes)),
                    Err(_) => not_found(m),
                },
                None => not_found(m),
            },
            _ => {
                close = true;
                (
                    "405 Method Not Allowed",
                    "text/plain; charset=utf-8",
                    (true, b"the playground serves GET and HEAD only\n".to_vec()),
                )
            }
        };
        let (send, bytes) = body;
        write!(
            writer,
            "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
             cache-control: no-store\r\nx-content-type-options: nosniff\r\n\
             connection: {}\r\n\r\n",
            bytes.len(),
            if close { "close" } else { "keep-alive" }
        )?;
        if send {
            writer.write_all(&bytes)?;
        }
        writer.flush()?;
        if close {
            return Ok(());
        }
    }
}

/// Header lines accepted per request; a client sending more is dropped.
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

fn not_found(method: &str) -> (&'static str, &'static str, (bool, Vec<u8>)) {
    (
        "404 Not Found",
        "text/plain; charset=utf-8",
        (
            method == "GET",
            b"no such file in the playground\n".to_vec(),
        ),
    )
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
