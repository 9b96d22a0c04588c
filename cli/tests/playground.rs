//! The policy playground end to end: `ace playground` builds and serves the
//! page, and a headless Chromium uses it as a policy author would. It loads
//! the shipped examples, edits a policy, sees the compile error for a
//! broken one, asks for an EU personal-data request and sees no non-EU
//! destination allowed, and verifies to zero mismatches; the checksum,
//! the compile error, the downloaded tables and the plugin configuration
//! are each compared with what the `ace` command gives for the same files.
//!
//! Fails (never skips), naming `make setup`, when Chromium, the
//! wasm32-unknown-unknown toolchain or wasm-bindgen-cli is missing. The
//! page's module is built once, by the one `ace playground` this test
//! starts.

use ace_harness::chromium::{self, Page};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ACE: &str = env!("CARGO_BIN_EXE_ace");

fn policies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

/// The value of `expression` in the page; a test failure if it throws.
fn value(page: &mut Page, expression: &str) -> Value {
    page.eval(expression).unwrap_or_else(|e| panic!("{e}"))
}

/// [`Page::wait`]; a test failure on timeout.
fn wait(page: &mut Page, what: &str, expression: &str, timeout: Duration) -> Value {
    page.wait(what, expression, timeout)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `ace playground` on a free port: its URL and site directory.
struct Server {
    child: Child,
    url: String,
    site: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Server {
    let mut child = Command::new(ACE)
        .args(["playground", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ace playground");
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&stderr);
    let err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
            s.push_str(&line);
            s.push('\n');
        }
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let (mut url, mut site) = (None, None);
    // A first build of the module on 2 cores takes minutes.
    let deadline = Instant::now() + Duration::from_secs(20 * 60);
    while url.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(dir) = line.strip_prefix("ace playground: serving ") {
                    site = Some(PathBuf::from(dir.trim()));
                }
                if let Some(rest) = line.strip_prefix("open ") {
                    url = rest.split_whitespace().next().map(str::to_string);
                }
            }
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                panic!(
                    "`ace playground` did not start ({status:?}). A missing wasm32-unknown-unknown \
                     toolchain or wasm-bindgen-cli: run `make setup`. Its output:\n{}",
                    stderr.lock().unwrap_or_else(|e| e.into_inner())
                );
            }
        }
    }
    Server {
        child,
        url: url.expect("url"),
        site: site.expect("`ace playground` printed no `serving` line"),
    }
}

/// A copy of the examples' sources (no `out/`), for the command to compile.
fn copy_sources(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).expect("read policies") {
        let path = e.expect("entry").path();
        let keep = matches!(
            path.extension().and_then(|x| x.to_str()),
            Some("cedar" | "cedarschema")
        ) || path.file_name().is_some_and(|n| n == "fleet.toml");
        if keep {
            std::fs::copy(&path, to.join(path.file_name().expect("name"))).expect("copy");
        }
    }
}

/// `ace policy compile DIR`: the sha256 it prints, or its error text.
fn cli_compile(dir: &Path) -> Result<String, String> {
    let out = Command::new(ACE)
        .args(["policy", "compile"])
        .arg(dir)
        .output()
        .expect("run ace policy compile");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let sha = stdout
        .split("sha256 ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("`ace policy compile` printed no sha256:\n{stdout}"));
    Ok(sha.to_string())
}

/// Replaces the text of the page's file `name` the way typing does, and
/// waits for the compile that follows; returns its state (`ok`, `error`).
fn edit(page: &mut Page, name: &str, text: &str) -> String {
    let before = value(page, "window.playground.state.seq");
    let name_js = serde_json::to_string(name).expect("json");
    let text_js = serde_json::to_string(text).expect("json");
    let found = value(
        page,
        &format!(
            "(() => {{ const pg = window.playground; \
           const i = pg.state.files.findIndex((f) => f.name === {name_js}); \
           if (i < 0) return false; \
           pg.select(i); \
           const ed = document.getElementById('editor'); \
           ed.value = {text_js}; \
           ed.dispatchEvent(new Event('input', {{ bubbles: true }})); \
           return true; }})()"
        ),
    );
    assert_eq!(found, true, "the page has no file `{name}`");
    wait(
        page,
        &format!("the compile after editing {name}"),
        &format!(
            "window.playground.state.seq > {before} && \
             ['ok', 'error'].includes(document.getElementById('compile-state').dataset.state) && \
             document.getElementById('compile-state').dataset.state"
        ),
        Duration::from_secs(60),
    )
    .as_str()
    .unwrap_or("")
    .to_string()
}

fn text(page: &mut Page, id: &str) -> String {
    value(
        page,
        &format!("document.getElementById('{id}').textContent"),
    )
    .as_str()
    .unwrap_or("")
    .to_string()
}

#[test]
fn a_policy_author_uses_the_playground_in_chromium() {
    // Chromium first: a missing browser fails at once, before any build.
    chromium::command().unwrap_or_else(|e| panic!("{e}"));
    let server = serve();
    let mut page = Page::launch().unwrap_or_else(|e| panic!("{e}"));
    let downloads = tempfile::tempdir().expect("downloads");
    page.call(
        "Page.setDownloadBehavior",
        serde_json::json!({ "behavior": "allow", "downloadPath": downloads.path() }),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    page.navigate(&server.url).unwrap_or_else(|e| panic!("{e}"));

    // 1. The shipped examples load and compile.
    let state = wait(
        &mut page,
        "the examples to load and compile",
        "(() => { const s = document.getElementById('compile-state').dataset.state; \
           return ['ok', 'error'].includes(s) && s; })()",
        Duration::from_secs(120),
    );
    assert_eq!(
        state,
        "ok",
        "the examples do not compile in the page: {}\n{}",
        text(&mut page, "problems"),
        page.log()
    );
    let files: Vec<String> = serde_json::from_value(value(
        &mut page,
        "window.playground.state.files.map((f) => f.name)",
    ))
    .expect("file names");
    let mut shipped: Vec<String> = std::fs::read_dir(policies())
        .expect("policies")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".cedar") || n.ends_with(".cedarschema") || n == "fleet.toml")
        .collect();
    shipped.sort();
    let mut loaded = files.clone();
    loaded.sort();
    assert_eq!(
        loaded, shipped,
        "the page starts from every shipped example"
    );
    let compile_ms = value(
        &mut page,
        "Number(document.getElementById('compile-state').dataset.ms)",
    );

    // 2. The checksum is the command's for the same files.
    let dir = tempfile::tempdir().expect("dir");
    copy_sources(&policies(), dir.path());
    let page_sha = text(&mut page, "sha256");
    assert_eq!(
        page_sha,
        cli_compile(dir.path()).expect("the examples compile"),
        "the page's sha256 of the examples' tables differs from `ace policy compile`'s"
    );
    assert_eq!(
        text(&mut page, "bytes"),
        std::fs::metadata(dir.path().join("out/tables.acet"))
            .expect("tables")
            .len()
            .to_string()
    );

    // 3. Edit a policy: Northbank's rule now applies to Globex. The tables
    //    change, and still equal the command's for the edited files.
    let no_spot = std::fs::read_to_string(policies().join("tenant_no_spot.cedar")).expect("read");
    let edited = no_spot.replace("Ace::Tenant::\"northbank\"", "Ace::Tenant::\"globex\"");
    assert_ne!(edited, no_spot, "the example names northbank");
    assert_eq!(edit(&mut page, "tenant_no_spot.cedar", &edited), "ok");
    std::fs::write(dir.path().join("tenant_no_spot.cedar"), &edited).expect("write");
    let edited_sha = text(&mut page, "sha256");
    assert_ne!(edited_sha, page_sha, "the edit changed the tables");
    assert_eq!(
        edited_sha,
        cli_compile(dir.path()).expect("the edit compiles"),
        "after the edit, the page's sha256 differs from `ace policy compile`'s"
    );

    // 4. A broken policy: the error at Cedar's line and column, as the
    //    command reports it for the same file.
    let eu = std::fs::read_to_string(policies().join("eu_residency.cedar")).expect("read");
    let broken = eu.replace("resource.jurisdiction", "resource.jurisdicton");
    assert_eq!(edit(&mut page, "eu_residency.cedar", &broken), "error");
    let problem = value(
        &mut page,
        "(() => { const li = document.querySelector('#problems li'); \
           return li && { file: li.dataset.file, line: Number(li.dataset.line), \
           column: Number(li.dataset.column), shown: li.textContent }; })()",
    );
    assert_eq!(problem["file"], "eu_residency.cedar", "{problem}");
    let (line, column) = (
        problem["line"].as_u64().unwrap_or(0),
        problem["column"].as_u64().unwrap_or(0),
    );
    let at = format!("eu_residency.cedar:{line}:{column}:");
    assert!(
        line > 0 && column > 0 && problem["shown"].as_str().unwrap_or("").starts_with(&at),
        "the page shows no line and column: {problem}"
    );
    let broken_dir = tempfile::tempdir().expect("dir");
    copy_sources(dir.path(), broken_dir.path());
    std::fs::write(broken_dir.path().join("eu_residency.cedar"), &broken).expect("write");
    let cli_error = cli_compile(broken_dir.path()).expect_err("the broken policy fails");
    assert!(
        cli_error.contains(&format!("/{at}")),
        "the command puts the error elsewhere than the page ({at}):\n{cli_error}"
    );
    assert!(
        value(&mut page, "document.getElementById('verify').disabled") == true,
        "nothing to verify while the sources do not compile"
    );
    assert_eq!(edit(&mut page, "eu_residency.cedar", &eu), "ok");
    assert_eq!(text(&mut page, "sha256"), edited_sha);

    // 4b. Policies at the shape limits compile in the page, which Cedar's
    //     recursion in the browser's stack allows; one step past them is
    //     an error at its line, not a trapped module; the page goes on.
    for (what, at, past) in ace_policy::limits::shapes_at_the_limits() {
        let state = edit(&mut page, "tenant_no_spot.cedar", &at);
        let problems = text(&mut page, "problems");
        assert_eq!(
            state,
            "ok",
            "{what} at the limit: {problems}\n{}",
            page.log()
        );
        assert_eq!(
            edit(&mut page, "tenant_no_spot.cedar", &past),
            "error",
            "{what} past the limit"
        );
        let shown = value(
            &mut page,
            "document.querySelector('#problems li').textContent",
        );
        assert!(
            shown
                .as_str()
                .unwrap_or("")
                .starts_with("tenant_no_spot.cedar:2:"),
            "{what}: {shown}"
        );
    }
    assert_eq!(edit(&mut page, "tenant_no_spot.cedar", &edited), "ok");
    assert_eq!(text(&mut page, "sha256"), edited_sha);

    // 5. An EU personal-data request: no destination outside the EU is
    //    allowed, each says which policy denied it, and some EU one serves.
    let request = serde_json::json!({
        "tenant": "globex",
        "data_class": "personal_eu",
        "model": "llama-3.1-8b",
        "latency_class": "interactive",
        "tp_degree": "1",
    });
    let set = format!(
        "(() => {{ const r = {request}; \
           for (const [k, v] of Object.entries(r)) {{ \
             const s = document.getElementById('attr-' + k); \
             if (!s) return 'no field ' + k; \
             s.value = v; \
             if (s.value !== v) return 'no value ' + v + ' for ' + k; }} \
           document.getElementById('attr-data_class').dispatchEvent(new Event('change')); \
           return 'ok'; }})()"
    );
    assert_eq!(value(&mut page, &set), "ok", "the request form");
    let rows = wait(
        &mut page,
        "the decisions for the EU personal-data request",
        &format!(
            "(() => {{ const t = document.getElementById('decisions'); \
               if (!t.dataset.request) return null; \
               const asked = JSON.parse(t.dataset.request), want = {request}; \
               if (Object.keys(want).some((k) => asked[k] !== want[k])) return null; \
               const rows = [...t.querySelectorAll('tbody tr')]; \
               return rows.length > 0 && rows.map((r) => ({{ destination: r.dataset.destination, \
                 allowed: r.dataset.allowed === 'true', verdict: r.dataset.verdict, \
                 policies: r.dataset.policies, shown: r.textContent }})); }})()"
        ),
        Duration::from_secs(60),
    );
    let project = ace_policy::load_dir(&policies()).expect("examples");
    let fleet = project.manifest.resolved();
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), fleet.len(), "one row per destination: {rows:?}");
    let mut eu_allowed = 0;
    for r in rows {
        let name = r["destination"].as_str().unwrap_or("");
        let d = fleet
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("the page lists an unknown destination {name}"));
        assert_eq!(r["verdict"], "agree", "tables and Cedar agree: {r}");
        if d.jurisdiction == "EU" {
            eu_allowed += usize::from(r["allowed"] == true);
        } else {
            assert_eq!(
                r["allowed"], false,
                "EU personal data allowed outside the EU: {r}"
            );
            assert!(
                r["policies"]
                    .as_str()
                    .unwrap_or("")
                    .split(',')
                    .any(|p| p == "eu_residency")
                    && r["shown"].as_str().unwrap_or("").contains("eu_residency"),
                "the page names the deciding policy: {r}"
            );
        }
    }
    assert!(eu_allowed > 0, "some EU destination serves it: {rows:?}");

    // 6. Downloads: the tables and the plugin configuration, as the
    //    command writes them for the same files.
    value(
        &mut page,
        "document.getElementById('download-tables').click(), true",
    );
    let tables = downloads.path().join("tables.acet");
    assert!(
        wait_file(&tables),
        "no tables.acet downloaded\n{}",
        page.log()
    );
    assert_eq!(
        std::fs::read(&tables).expect("downloaded tables"),
        std::fs::read(dir.path().join("out/tables.acet")).expect("command's tables"),
        "the downloaded tables are the command's"
    );
    let config = value(&mut page, "window.playground.pluginConfig()");
    let cli_config = Command::new(ACE)
        .arg("plugin-config")
        .arg(dir.path())
        .output()
        .expect("ace plugin-config");
    assert!(cli_config.status.success(), "ace plugin-config failed");
    assert_eq!(
        config.as_str().unwrap_or(""),
        String::from_utf8_lossy(&cli_config.stdout),
        "the page's plugin configuration is `ace plugin-config`'s"
    );

    // 7. Verify, in a worker: progress moves, the page answers meanwhile,
    //    and the tables equal Cedar.
    value(&mut page, "document.getElementById('verify').click(), true");
    let t0 = Instant::now();
    let running = value(
        &mut page,
        "document.getElementById('verify-result').dataset.state",
    );
    let answered = t0.elapsed();
    if running == "running" {
        assert!(
            answered < Duration::from_secs(2),
            "the page took {answered:?} to answer during verify"
        );
    }
    let result = wait(
        &mut page,
        "verify to finish",
        "(() => { const r = document.getElementById('verify-result'); \
           return ['ok', 'mismatch', 'error'].includes(r.dataset.state) && \
           { state: r.dataset.state, mismatches: r.dataset.mismatches, ms: Number(r.dataset.ms), \
             text: r.textContent }; })()",
        Duration::from_secs(15 * 60),
    );
    assert_eq!(result["state"], "ok", "verify: {result}\n{}", page.log());
    assert_eq!(result["mismatches"], "0", "{result}");
    let progress = value(
        &mut page,
        "(() => { const p = document.getElementById('verify-progress'); \
           return { value: p.value, max: p.max, updates: Number(p.dataset.updates) }; })()",
    );
    assert!(
        progress["updates"].as_u64().unwrap_or(0) >= 1 && progress["value"] == progress["max"],
        "verify showed its progress to the end: {progress}"
    );

    // The figures BENCHMARKS.md records.
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let module = size(&server.site.join("pkg/ace_playground_bg.wasm"));
    let page_bytes: u64 = [
        "index.html",
        "playground.js",
        "worker.js",
        "style.css",
        "pkg/ace_playground.js",
    ]
    .iter()
    .map(|f| size(&server.site.join(f)))
    .sum();
    println!(
        "playground: module {module} bytes, page {page_bytes} bytes (html, css, js, glue), \
         compile of the examples {compile_ms} ms, verify {} ms ({})",
        result["ms"],
        result["text"].as_str().unwrap_or("").replace('\n', "; ")
    );
}

/// Waits up to 10 s for a download to land.
fn wait_file(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if path.is_file() && std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}
