//! The HTTP side: `GET /v1/snapshot`, `POST /v1/notice`, `GET /metrics`,
//! `GET /healthz`.

use crate::state::{now_ms, Service};
use ace_snapshot::{Drain, DrainReason};
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use subtle::ConstantTimeEq;

pub(crate) fn router(svc: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/snapshot", get(snapshot))
        .route("/v1/notice", post(notice))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(svc)
}

/// Whether the request carries the configured bearer token (always, when
/// the service runs with `--insecure-no-auth`).
fn authorized(svc: &Service, headers: &HeaderMap) -> bool {
    let Some(token) = &svc.settings.token else {
        return true;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

fn unauthorized(svc: &Service) -> Response {
    svc.counters.unauthorized.fetch_add(1, Ordering::Relaxed);
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a bearer token is required: send `Authorization: Bearer <token>`\n",
    )
        .into_response()
}

#[derive(Deserialize)]
struct SnapshotQuery {
    format: Option<String>,
}

async fn snapshot(
    State(svc): State<Arc<Service>>,
    Query(q): Query<SnapshotQuery>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&svc, &headers) {
        return unauthorized(&svc);
    }
    let p = svc.current();
    match q.format.as_deref() {
        None | Some("binary") => {}
        Some("json") => {
            svc.counters.ok.fetch_add(1, Ordering::Relaxed);
            let body = serde_json::to_vec_pretty(&p.snapshot).unwrap_or_default();
            return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
        }
        Some(other) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unknown format `{other}`: use `json`, or none for the binary snapshot\n"),
            )
                .into_response()
        }
    }
    let etag = HeaderValue::from_str(&p.etag).unwrap_or(HeaderValue::from_static("\"\""));
    let matches = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == p.etag);
    if matches {
        svc.counters.not_modified.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    svc.counters.ok.fetch_add(1, Ordering::Relaxed);
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        p.bytes.clone(),
    )
        .into_response()
}

/// A pushed notice, e.g. from a rule on the cloud's interruption events.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Notice {
    destination: String,
    /// When the destination may take requests again (RFC 3339); a time
    /// in the past lifts an earlier pushed notice.
    until: String,
    /// `eviction` (default) or `operator`.
    #[serde(default)]
    reason: Option<String>,
}

async fn notice(State(svc): State<Arc<Service>>, headers: HeaderMap, body: Bytes) -> Response {
    if !authorized(&svc, &headers) {
        return unauthorized(&svc);
    }
    let bad = |msg: String| {
        let msg = crate::logged(&msg);
        svc.note("webhook", "POST /v1/notice", Err(&msg));
        (StatusCode::BAD_REQUEST, msg + "\n").into_response()
    };
    let n: Notice = match serde_json::from_slice(&body) {
        Ok(n) => n,
        Err(e) => {
            return bad(format!(
                "not a notice (`{{\"destination\",\"until\",\"reason\"}}`): {e}"
            ))
        }
    };
    let Some(&d) = svc.index.get(&n.destination) else {
        return bad(format!(
            "`destination`: `{}` is not in the fleet manifest",
            n.destination
        ));
    };
    let until_ms = match crate::rfc3339_ms(&n.until) {
        Ok(t) => t,
        Err(e) => return bad(format!("`until`: {e}")),
    };
    let reason = match n.reason.as_deref() {
        None | Some("eviction") => DrainReason::Eviction,
        Some("operator") => DrainReason::Operator,
        Some(other) => {
            return bad(format!(
                "`reason`: `{other}` is not `eviction` or `operator`"
            ))
        }
    };
    svc.push_notice(d, Drain { until_ms, reason });
    let lifted = until_ms <= now_ms();
    // Published before the answer: a caller told `drained` can rely on
    // the next snapshot a filter fetches carrying it.
    let published = svc.publish(now_ms()).and_then(|()| {
        let p = svc.current();
        let carried = p
            .snapshot
            .report(&n.destination)
            .and_then(|r| r.drain)
            .is_some_and(|x| x.until_ms >= until_ms);
        if lifted || carried {
            Ok(())
        } else {
            Err("the published snapshot does not carry the drain".to_string())
        }
    });
    if let Err(e) = published {
        let msg = format!(
            "the notice for `{}` was taken but not published: {e}; retry, and see the \
             service's log and ace_control_publish_failures_total",
            n.destination
        );
        svc.note("webhook", "POST /v1/notice", Err(&msg));
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({
                "destination": n.destination,
                "until_ms": until_ms,
                "reason": reason.as_str(),
                "drained": false,
                "error": crate::logged(&msg),
            })
            .to_string(),
        )
            .into_response();
    }
    svc.note("webhook", "POST /v1/notice", Ok(()));
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({
            "destination": n.destination,
            "until_ms": until_ms,
            "reason": reason.as_str(),
            "drained": !lifted,
        })
        .to_string(),
    )
        .into_response()
}

fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn metrics(State(svc): State<Arc<Service>>) -> Response {
    let p = svc.current();
    let c = &svc.counters;
    let now = now_ms();
    let mut o = String::new();
    let _ = writeln!(o, "# HELP ace_control_snapshot_version The version of the snapshot served now.\n# TYPE ace_control_snapshot_version gauge\nace_control_snapshot_version {}", p.snapshot.version);
    let _ = writeln!(o, "# HELP ace_control_snapshot_requests_total Snapshot requests by HTTP status.\n# TYPE ace_control_snapshot_requests_total counter");
    for (code, n) in [
        ("200", &c.ok),
        ("304", &c.not_modified),
        ("401", &c.unauthorized),
    ] {
        let _ = writeln!(
            o,
            "ace_control_snapshot_requests_total{{code=\"{code}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(o, "# HELP ace_control_scrape_failures_total Failed metrics scrapes per destination.\n# TYPE ace_control_scrape_failures_total counter");
    for (dest, failures) in svc.dests.iter().zip(&c.scrape_failures) {
        if dest.metrics.is_some() {
            let _ = writeln!(
                o,
                "ace_control_scrape_failures_total{{destination=\"{}\"}} {}",
                label(&dest.name),
                failures.load(Ordering::Relaxed)
            );
        }
    }
    let _ = writeln!(o, "# HELP ace_control_load_stale 1 when a destination's load is stale or was never scraped.\n# TYPE ace_control_load_stale gauge");
    for dest in svc.dests.iter().filter(|d| d.metrics.is_some()) {
        let fresh = p
            .snapshot
            .report(&dest.name)
            .and_then(|r| r.load)
            .is_some_and(|l| !l.stale);
        let _ = writeln!(
            o,
            "ace_control_load_stale{{destination=\"{}\"}} {}",
            label(&dest.name),
            u8::from(!fresh)
        );
    }
    let _ = writeln!(o, "# HELP ace_control_eviction_notice 1 while a destination is drained by an eviction notice.\n# TYPE ace_control_eviction_notice gauge");
    for r in &p.snapshot.reports {
        let evicting = r
            .drain
            .is_some_and(|d| d.reason == DrainReason::Eviction && d.until_ms > now);
        if evicting {
            let _ = writeln!(
                o,
                "ace_control_eviction_notice{{destination=\"{}\"}} 1",
                label(&r.name)
            );
        }
    }
    let _ = writeln!(o, "# HELP ace_control_eviction_notices_total Eviction notices received (polled or pushed).\n# TYPE ace_control_eviction_notices_total counter\nace_control_eviction_notices_total {}", c.notices.load(Ordering::Relaxed));
    let _ = writeln!(o, "# HELP ace_control_publish_failures_total Snapshots that could not be published (the last one stayed).\n# TYPE ace_control_publish_failures_total counter\nace_control_publish_failures_total {}", c.publish_failures.load(Ordering::Relaxed));
    let k = &svc.conns;
    let _ = writeln!(o, "# HELP ace_control_connections_open Connections open to the service now.\n# TYPE ace_control_connections_open gauge\nace_control_connections_open {}", k.open.load(Ordering::Relaxed));
    let _ = writeln!(o, "# HELP ace_control_connections_max Connections the service holds at most (--max-connections, or what the file descriptor limit leaves).\n# TYPE ace_control_connections_max gauge\nace_control_connections_max {}", k.cap.load(Ordering::Relaxed));
    let _ = writeln!(o, "# HELP ace_control_connections_closed_idle_total Idle connections closed to take a new one while the service was full (the idlest of the address holding the most).\n# TYPE ace_control_connections_closed_idle_total counter\nace_control_connections_closed_idle_total {}", k.closed_idle.load(Ordering::Relaxed));
    let _ = writeln!(o, "# HELP ace_control_connections_refused_total Connections closed at once: the service was full with every connection answering (full), or the peer address's cap was reached (per_ip).\n# TYPE ace_control_connections_refused_total counter");
    for (why, n) in [("full", &k.refused_full), ("per_ip", &k.refused_per_ip)] {
        let _ = writeln!(
            o,
            "ace_control_connections_refused_total{{why=\"{why}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(o, "# HELP ace_control_accept_errors_total Failed accepts (e.g. out of file descriptors).\n# TYPE ace_control_accept_errors_total counter\nace_control_accept_errors_total {}", k.accept_errors.load(Ordering::Relaxed));
    if svc.settings.ledger.is_some() {
        budget_metrics(&mut o, &svc, &p.snapshot.budgets, now);
    }
    let _ = writeln!(o, "# HELP ace_control_source_errors_total Failed attempts per source.\n# TYPE ace_control_source_errors_total counter");
    let errors = c
        .source_errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for (source, n) in errors {
        let _ = writeln!(
            o,
            "ace_control_source_errors_total{{source=\"{source}\"}} {n}"
        );
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], o).into_response()
}

/// The budget readings' part of `/metrics` (with `--ledger-store`).
fn budget_metrics(o: &mut String, svc: &Service, budgets: &[ace_snapshot::Budget], now: u64) {
    let c = &svc.counters;
    let _ = writeln!(o, "# HELP ace_control_ledger_up 1 when the last read of the ledger's store succeeded.\n# TYPE ace_control_ledger_up gauge\nace_control_ledger_up {}", u8::from(c.ledger_up.load(Ordering::Relaxed)));
    let _ = writeln!(o, "# HELP ace_control_ledger_reads_total Reads of the ledger's store for budget spend, by result.\n# TYPE ace_control_ledger_reads_total counter");
    for (result, n) in [
        ("ok", &c.ledger_reads_ok),
        ("error", &c.ledger_reads_failed),
    ] {
        let _ = writeln!(
            o,
            "ace_control_ledger_reads_total{{result=\"{result}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    // Absent until the first good read; growing while the store is down,
    // since the readings published then are the last good ones.
    if let Some(read) = budgets.iter().map(|b| b.read_ms).max() {
        let _ = writeln!(o, "# HELP ace_control_budget_reading_age_seconds Age of the budget readings published (the last good read of the store).\n# TYPE ace_control_budget_reading_age_seconds gauge\nace_control_budget_reading_age_seconds {:.3}", now.saturating_sub(read) as f64 / 1000.0);
    }
    let _ = writeln!(o, "# HELP ace_control_budget_spent_usd Booked spend of each budget in its period, as published.\n# TYPE ace_control_budget_spent_usd gauge");
    for b in budgets {
        let _ = writeln!(
            o,
            "ace_control_budget_spent_usd{{budget=\"{}\"}} {}",
            label(&b.name),
            b.spent_usd
        );
    }
    let _ = writeln!(o, "# HELP ace_control_budget_state Each budget's state as published: 0 ok, 1 soft, 2 exhausted.\n# TYPE ace_control_budget_state gauge");
    for b in budgets {
        let _ = writeln!(
            o,
            "ace_control_budget_state{{budget=\"{}\"}} {}",
            label(&b.name),
            b.state as u8
        );
    }
}

async fn healthz(State(svc): State<Arc<Service>>) -> String {
    format!("ok version {}\n", svc.current().snapshot.version)
}
