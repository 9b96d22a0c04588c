//! Golden usage tests: every answer in `fixtures/usage/` (each a copy of a
//! provider's documented example, citing its page in its header; the
//! README lists them) is fed to the usage scanner whole, split in two at
//! every byte, and one byte at a time, and must give the usage its header
//! expects every time: the counts, or `estimate` where the answer holds
//! no usage the scanner may read (then the flow books the request's
//! estimate).

use ace_flow::usage::{Usage, UsageScanner};
use std::path::{Path, PathBuf};

/// One fixture: its name, what it expects, whether it streams, its bytes.
struct Fixture {
    name: String,
    sse: bool,
    want: Option<Usage>,
    payload: Vec<u8>,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/usage")
}

/// Every fixture in the directory (the README aside), by name.
fn fixtures() -> Vec<Fixture> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap_or_else(|e| panic!("{}: {e}", dir().display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    paths.sort();
    paths.iter().map(|p| parse(p)).collect()
}

/// A fixture file: `# ` header lines (source, section, date read,
/// `Content-Type:`, `Expect:`), a `# ----` line, then the answer's bytes.
fn parse(path: &Path) -> Fixture {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let marker = b"# ----\n";
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker)
        .unwrap_or_else(|| panic!("{name}: no `# ----` line ends the header"));
    let header = String::from_utf8_lossy(&bytes[..at]).into_owned();
    let payload = bytes[at + marker.len()..].to_vec();
    let field = |key: &str| {
        header
            .lines()
            .find_map(|l| l.strip_prefix("# ")?.strip_prefix(key))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name}: no `{key}` line in the header"))
    };
    // Every fixture names where it comes from and when that was read.
    assert!(
        header.contains("https://"),
        "{name}: the header cites no page"
    );
    field("Read:");
    let sse = match field("Content-Type:") {
        "text/event-stream" => true,
        "application/json" => false,
        other => panic!("{name}: content type {other}"),
    };
    let want = match field("Expect:") {
        "estimate" => None,
        counts => {
            let mut u = Usage::default();
            for kv in counts.split_whitespace() {
                let (k, v) = kv
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{name}: `{kv}` in Expect"));
                let v: u32 = v.parse().unwrap_or_else(|e| panic!("{name}: {kv}: {e}"));
                match k {
                    "input" => u.input = v,
                    "output" => u.output = v,
                    "cache_read" => u.cache_read = v,
                    "cache_write" => u.cache_write = v,
                    _ => panic!("{name}: `{k}` in Expect"),
                }
            }
            Some(u)
        }
    };
    Fixture {
        name,
        sse,
        want,
        payload,
    }
}

fn scan<'a>(sse: bool, chunks: impl IntoIterator<Item = &'a [u8]>) -> Option<Usage> {
    let mut s = UsageScanner::new(sse);
    for c in chunks {
        s.feed(c);
    }
    s.finish()
}

#[test]
fn every_documented_shape_at_every_byte_boundary() {
    let all = fixtures();
    assert!(all.len() >= 17, "{} fixtures", all.len());
    for f in &all {
        let p = f.payload.as_slice();
        assert_eq!(scan(f.sse, [p]), f.want, "{}: whole", f.name);
        for at in 0..=p.len() {
            let (a, b) = p.split_at(at);
            assert_eq!(
                scan(f.sse, [a, b]),
                f.want,
                "{}: split at byte {at}",
                f.name
            );
        }
        assert_eq!(
            scan(f.sse, p.chunks(1)),
            f.want,
            "{}: one byte at a time",
            f.name
        );
    }
}

#[test]
fn the_readme_lists_every_fixture() {
    let readme = std::fs::read_to_string(dir().join("README.md"))
        .unwrap_or_else(|e| panic!("fixtures/usage/README.md: {e}"));
    for f in fixtures() {
        assert!(
            readme.contains(&format!("`{}`", f.name)),
            "README.md does not list {}",
            f.name
        );
    }
}
