//! A real PostgreSQL for one test: `initdb` into a temp dir, `postgres` on
//! a free loopback port, stopped (fast shutdown) when dropped. As root it
//! runs as the `postgres` user, since `initdb` refuses root. When anything
//! is missing the test fails, naming the piece and `make setup`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server.
#[derive(Debug)]
pub struct Pg {
    child: Child,
    _dir: tempfile::TempDir,
    port: u16,
}

fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    found.retain(|p| p.join("initdb").exists() && p.join("postgres").exists());
    found.sort();
    match found.pop() {
        Some(p) => p,
        None => panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `make setup` \
             (Debian package `postgresql`)"
        ),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `cmd` as the unprivileged `postgres` user when we are root.
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port for PostgreSQL: {e}"))
}

impl Pg {
    /// Start one, or fail the test saying why.
    pub fn start() -> Pg {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("ace-ledger-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot make a temp dir for PostgreSQL: {e}"));
        let data = dir.path().join("data");
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "cannot chown the PostgreSQL temp dir to user `postgres`: is the `postgres` user there? run `make setup`");
        }
        let out = as_pg(bin.join("initdb"))
            .args(["-A", "trust", "-U", "ace", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run initdb from {}: {e}; run `make setup`",
                    bin.display()
                )
            });
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
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
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start postgres from {}: {e}; run `make setup`",
                    bin.display()
                )
            });
        let pg = Pg {
            child,
            _dir: dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if postgres::Client::connect(&pg.url(), postgres::NoTls).is_ok() {
                return pg;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not accept connections on 127.0.0.1:{port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The URL of its `postgres` database, as user `ace`.
    pub fn url(&self) -> String {
        format!("postgres://ace@127.0.0.1:{}/postgres", self.port)
    }

    /// A fresh database on it; returns its URL.
    pub fn database(&self, name: &str) -> String {
        let mut c = postgres::Client::connect(&self.url(), postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect: {e}"));
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        format!("postgres://ace@127.0.0.1:{}/{name}", self.port)
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
