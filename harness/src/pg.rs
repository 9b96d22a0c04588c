//! A real PostgreSQL for one test: `initdb` into a temp dir, `postgres` on
//! a free loopback port, stopped (fast shutdown) when dropped.
//!
//! Why here: the ledger's store and the services that read it (the control
//! service's budget readings) are tested against the real server, not a
//! model of it, and each needs the same throwaway instance. As root it
//! runs as the `postgres` user, since `initdb` refuses root. It speaks to
//! the server with PostgreSQL's own client programs (`pg_isready`,
//! `createdb`), so the harness, which the demo also builds, takes no
//! database driver. Nothing here skips: when anything is missing the error
//! names the piece and `make setup`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server.
#[derive(Debug)]
pub struct Pg {
    child: Child,
    bin: PathBuf,
    /// Its data and socket, removed when dropped.
    _dir: tempfile::TempDir,
    port: u16,
}

/// The newest `/usr/lib/postgresql/*/bin` holding `initdb` and `postgres`.
fn bin_dir() -> Result<PathBuf, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    found.retain(|p| p.join("initdb").exists() && p.join("postgres").exists());
    found.sort();
    found.pop().ok_or_else(|| {
        "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `make setup` \
         (Debian package `postgresql`)"
            .to_string()
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `bin` as the unprivileged `postgres` user when we are root.
fn as_pg(bin: PathBuf) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--clear-groups",
            "--",
        ]);
        c.arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

impl Pg {
    /// Start one, or fail the test saying why ([`Pg::try_start`]).
    pub fn start() -> Pg {
        Pg::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start one: initialise a cluster in a temp dir, where user `ace` is
    /// trusted, and wait (up to 30 s) until it accepts connections.
    pub fn try_start() -> Result<Pg, String> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("ace-pg-")
            .tempdir()
            .map_err(|e| format!("cannot make a temp dir for PostgreSQL: {e}"))?;
        let data = dir.path().join("data");
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Err(
                    "cannot chown the PostgreSQL temp dir to user `postgres`: is the \
                     `postgres` user there? run `make setup`"
                        .into(),
                );
            }
        }
        let out = as_pg(bin.join("initdb"))
            .args(["-A", "trust", "-U", "ace", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .map_err(|e| {
                format!(
                    "cannot run initdb from {}: {e}; run `make setup`",
                    bin.display()
                )
            })?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let port =
            crate::free_port().map_err(|e| format!("no free loopback port for PostgreSQL: {e}"))?;
        let child = as_pg(bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-k"])
            .arg(dir.path())
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start postgres from {}: {e}; run `make setup`",
                    bin.display()
                )
            })?;
        let pg = Pg {
            child,
            bin,
            _dir: dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if pg.client("pg_isready").arg("-q").status()?.success() {
                return Ok(pg);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "PostgreSQL did not accept connections on 127.0.0.1:{port} within 30 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Client program `name` from the server's release, pointed at it as
    /// user `ace`.
    fn client(&self, name: &str) -> Client {
        let mut c = Command::new(self.bin.join(name));
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "ace"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Client {
            cmd: c,
            name: name.to_string(),
        }
    }

    /// The URL of its `postgres` database, as user `ace`.
    pub fn url(&self) -> String {
        format!("postgres://ace@127.0.0.1:{}/postgres", self.port)
    }

    /// A fresh database named `name` on it, or fail the test saying why;
    /// returns its URL.
    pub fn database(&self, name: &str) -> String {
        self.try_database(name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A fresh database named `name` on it; returns its URL.
    pub fn try_database(&self, name: &str) -> Result<String, String> {
        let out = self.client("createdb").arg("--").arg(name).output()?;
        if !out.status.success() {
            return Err(format!(
                "createdb {name} on 127.0.0.1:{} failed: {}",
                self.port,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(format!("postgres://ace@127.0.0.1:{}/{name}", self.port))
    }
}

/// A client program about to run, named in its errors.
struct Client {
    cmd: Command,
    name: String,
}

impl Client {
    fn arg(mut self, a: &str) -> Client {
        self.cmd.arg(a);
        self
    }

    fn run_err(&self, e: &std::io::Error) -> String {
        format!(
            "cannot run PostgreSQL's `{}` ({}): {e}; run `make setup` (Debian package \
             `postgresql`)",
            self.name,
            self.cmd.get_program().to_string_lossy()
        )
    }

    fn status(mut self) -> Result<std::process::ExitStatus, String> {
        self.cmd.status().map_err(|e| self.run_err(&e))
    }

    fn output(mut self) -> Result<std::process::Output, String> {
        self.cmd.output().map_err(|e| self.run_err(&e))
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        // SIGINT: PostgreSQL's fast shutdown.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
