//! `ace policy`: compile Cedar feasibility policies into tables, prove the
//! tables equal Cedar, explain a decision, dump a tables file.
//!
//! Every subcommand takes the policy directory (default `policies`), so the
//! documented workflow is `ace policy compile policies/` then `ace policy
//! verify policies/` with nothing else to remember. Output goes to
//! `<dir>/out/`: `tables.acet` (what the filter loads), `tables.txt` (the
//! dump) and `fleet.json` (destinations with resolved cost parameters, in
//! table order).
use ace_cli::{out, outln};
use ace_policy::oracle::Oracle;
use ace_policy::{compile, dump, explain, verify};
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Exit code of `verify` when the tables and Cedar disagree.
const MISMATCH: u8 = 3;

/// Subcommands of `ace policy`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Validate the policies with Cedar and compile them into tables in
    /// `<dir>/out/`.
    Compile {
        /// Policy directory: one `*.cedarschema`, `*.cedar` files, `fleet.toml`.
        #[arg(default_value = "policies")]
        dir: PathBuf,
        /// Write the tables here instead of `<dir>/out/tables.acet`.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Prove the compiled tables equal Cedar, with entities built
    /// independently of the compiler (exhaustive up to 2*10^6 decisions,
    /// else every factor row plus sampled requests); exits 3 on any
    /// mismatch.
    Verify {
        /// Policy directory.
        #[arg(default_value = "policies")]
        dir: PathBuf,
        /// Tables to check instead of `<dir>/out/tables.acet`.
        #[arg(long)]
        tables: Option<PathBuf>,
        /// Stop at the first mismatch (a CI gate that only needs pass or
        /// fail) instead of checking and counting the whole space.
        #[arg(long)]
        fail_fast: bool,
    },
    /// For every destination, Cedar's decision with the determining policy
    /// ids, and the tables' answer.
    Explain {
        /// Policy directory.
        #[arg(default_value = "policies")]
        dir: PathBuf,
        /// The request as JSON, e.g.
        /// '{"tenant":"globex","data_class":"personal_eu","model":"llama-3.1-8b","latency_class":"interactive","tp_degree":1}'.
        #[arg(long)]
        request: String,
        /// Tables to consult instead of `<dir>/out/tables.acet`.
        #[arg(long)]
        tables: Option<PathBuf>,
    },
    /// Print a tables file (or `<dir>/out/tables.acet`) as text.
    Dump {
        /// A `.acet` file or a policy directory.
        #[arg(default_value = "policies")]
        path: PathBuf,
    },
}

fn tables_file(dir: &Path, given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| ace_policy::tables_path(dir))
}

fn read_tables(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| {
        format!(
            "cannot read policy tables `{}`; run `ace policy compile` on the policy directory first",
            path.display()
        )
    })
}

/// Runs one `ace policy` subcommand.
pub fn run(c: Command) -> anyhow::Result<ExitCode> {
    match c {
        Command::Compile { dir, out } => run_compile(&dir, out),
        Command::Verify {
            dir,
            tables,
            fail_fast,
        } => run_verify(&dir, &tables_file(&dir, tables), fail_fast),
        Command::Explain {
            dir,
            request,
            tables,
        } => run_explain(&dir, &request, &tables_file(&dir, tables)),
        Command::Dump { path } => {
            let file = if path.is_dir() {
                ace_policy::tables_path(&path)
            } else {
                path
            };
            let bytes = read_tables(&file)?;
            let text = dump::dump(&bytes)
                .with_context(|| format!("cannot load policy tables `{}`", file.display()))?;
            out!("{text}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn run_compile(dir: &Path, out: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let project = ace_policy::load_dir(dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let compiled = compile(&project).map_err(|e| anyhow::anyhow!("{e}"))?;
    let elapsed = start.elapsed();
    for w in &compiled.warnings {
        outln!("warning: {w}");
    }
    let tables = out.unwrap_or_else(|| ace_policy::tables_path(dir));
    let out_dir = tables.parent().unwrap_or(Path::new(".")).to_path_buf();
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create `{}`", out_dir.display()))?;
    std::fs::write(&tables, &compiled.bytes)
        .with_context(|| format!("cannot write `{}`", tables.display()))?;
    let text = dump::dump(&compiled.bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
    let dump_path = out_dir.join(ace_policy::DUMP_FILE);
    std::fs::write(&dump_path, text)
        .with_context(|| format!("cannot write `{}`", dump_path.display()))?;
    let fleet_path = out_dir.join(ace_policy::FLEET_FILE);
    let fleet = serde_json::to_string_pretty(&project.manifest.resolved())?;
    std::fs::write(&fleet_path, fleet + "\n")
        .with_context(|| format!("cannot write `{}`", fleet_path.display()))?;
    outln!(
        "compiled {} policies over {} destinations and {} request attributes in {:.2?} ({} Cedar evaluations)",
        project.info.len(),
        project.destinations.len(),
        project.attributes.len(),
        elapsed,
        compiled.evaluations
    );
    for (i, f) in compiled.factors.iter().enumerate() {
        let kind = match f.kind {
            ace_core::tables::FactorKind::Permit => "permit",
            ace_core::tables::FactorKind::Forbid => "forbid",
        };
        outln!(
            "  factor {i}: {kind} keyed by [{}], {} rows: {}",
            f.attributes.join(", "),
            f.rows,
            f.policies.join(", ")
        );
    }
    outln!(
        "wrote {} ({} bytes, sha256 {})",
        tables.display(),
        compiled.bytes.len(),
        ace_policy::tables_sha256(&compiled.bytes)
    );
    outln!("wrote {}", dump_path.display());
    outln!("wrote {}", fleet_path.display());
    Ok(ExitCode::SUCCESS)
}

fn run_verify(dir: &Path, tables: &Path, fail_fast: bool) -> anyhow::Result<ExitCode> {
    let project = ace_policy::load_dir(dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let bytes = read_tables(tables)?;
    let start = Instant::now();
    let oracle = Oracle::load(&project.sources)?;
    let report = if fail_fast {
        verify::verify_until(&oracle, &bytes, 1)
    } else {
        verify::verify(&oracle, &bytes)
    }
    .with_context(|| format!("verifying `{}`", tables.display()))?;
    for m in &report.mismatches {
        let yn = |b: bool| if b { "allow" } else { "deny" };
        outln!(
            "mismatch: request {} destination {}: cedar {}, tables {}",
            m.request,
            m.destination,
            yn(m.cedar),
            yn(m.table)
        );
    }
    if report.mismatch_count > report.mismatches.len() as u64 {
        outln!(
            "... and {} more mismatches",
            report.mismatch_count - report.mismatches.len() as u64
        );
    }
    outln!("coverage: {}", report.coverage_line());
    outln!(
        "checked {} requests ({} with every value known, {} with an unknown value) x {} destinations = {} decisions in {:.2?}",
        report.requests,
        report.known,
        report.requests - report.known,
        project.destinations.len(),
        report.decisions,
        start.elapsed()
    );
    outln!("mismatches: {}", report.mismatch_count);
    Ok(if report.mismatch_count == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(MISMATCH)
    })
}

fn run_explain(dir: &Path, request: &str, tables: &Path) -> anyhow::Result<ExitCode> {
    let json: serde_json::Value = serde_json::from_str(request)
        .context("`--request` is not valid JSON; pass an object such as '{\"tenant\":\"globex\",\"data_class\":\"public\"}'")?;
    let project = ace_policy::load_dir(dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let bytes = read_tables(tables)?;
    let oracle = Oracle::load(&project.sources)?;
    let (lines, notes) = explain::explain(&oracle, &bytes, &json)?;
    out!("{}", explain::render_explanation(&lines, &notes));
    Ok(
        if lines.iter().all(|l| l.verdict != explain::Verdict::Differ) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(MISMATCH)
        },
    )
}
