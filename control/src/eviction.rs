//! Spot eviction notices, in the shapes the clouds' instance metadata
//! services give them.
//!
//! - **AWS** (IMDSv2): `PUT /latest/api/token` with
//!   `X-aws-ec2-metadata-token-ttl-seconds`, then
//!   `GET /latest/meta-data/spot/instance-action` with
//!   `X-aws-ec2-metadata-token`. 404 means no notice; about two minutes
//!   before the interruption it answers `{"action": "terminate" | "stop" |
//!   "hibernate", "time": RFC 3339}`. The token is kept and fetched again
//!   when the service answers 401.
//! - **GCP**: `GET /computeMetadata/v1/instance/preempted` with
//!   `Metadata-Flavor: Google`: `FALSE`, or `TRUE` once preemption has
//!   begun; a spot VM then has 30 s, so the eviction time is the first
//!   `TRUE` seen plus 30 s.
//! - **Azure**: `GET /metadata/scheduledevents?api-version=2020-07-01`
//!   with `Metadata: true`: `{"Events": [...]}`; an event with `EventType:
//!   Preempt` whose `Resources` names this VM is a notice, evicted at its
//!   `NotBefore` (an RFC 1123 date, empty once the event has started: now).
//!   A cancelled event disappears. Azure delivers every event to every VM
//!   of the availability set or scale-set placement group, so an event
//!   naming only other VMs is not this VM's: the VM's own name comes from
//!   the manifest (`eviction.vm_name`) or, by default, from the metadata
//!   service (`GET /metadata/instance/compute/name?api-version=2021-02-01&format=text`),
//!   asked once. Names compare without regard to case, and an event with
//!   no `Resources` at all is taken as this VM's (draining an instance
//!   that stays costs a little; serving on one that goes costs failures).
//!
//! Only a definite "no notice" (AWS 404, GCP `FALSE`, Azure without a
//! `Preempt` event) lifts a notice. A poll that fails keeps what the last
//! good poll said: once the instance is reclaimed its metadata service
//! stops answering, and that must not lift the drain. How a notice becomes
//! a drain is in `state.rs`.

use crate::Error;
use serde::Deserialize;

/// The cloud whose metadata shape to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cloud {
    /// AWS EC2 (IMDSv2).
    Aws,
    /// Google Compute Engine.
    Gcp,
    /// Azure (Scheduled Events).
    Azure,
}

impl Cloud {
    /// The provider named in the manifest.
    pub fn parse(s: &str) -> Option<Cloud> {
        Some(match s {
            "aws" => Cloud::Aws,
            "gcp" => Cloud::Gcp,
            "azure" => Cloud::Azure,
            _ => return None,
        })
    }
}

/// What one poll says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// No notice.
    Clear,
    /// The instance will be reclaimed at `at_ms` (Unix ms).
    Notice {
        /// When, Unix ms.
        at_ms: u64,
        /// What the cloud said, for logs.
        what: String,
    },
}

/// GCP's notice for a spot VM: 30 s between the soft and hard off.
pub const GCP_NOTICE_MS: u64 = 30_000;

/// One destination's metadata poller.
#[derive(Debug)]
pub struct Poller {
    cloud: Cloud,
    base: String,
    aws_token: Option<String>,
    gcp_first_seen_ms: Option<u64>,
    /// Azure: this VM's name (given, or asked of the metadata service).
    vm_name: Option<String>,
}

impl Poller {
    /// A poller for `cloud` at metadata base URL `base`; `vm_name` is the
    /// VM's name in Azure's events (`None`: ask the metadata service).
    pub fn new(cloud: Cloud, base: String, vm_name: Option<String>) -> Poller {
        Poller {
            cloud,
            base,
            aws_token: None,
            gcp_first_seen_ms: None,
            vm_name,
        }
    }

    /// Azure: this VM's name, asked of the metadata service the first time.
    async fn azure_vm_name(&mut self, client: &reqwest::Client) -> Result<String, Error> {
        if let Some(n) = &self.vm_name {
            return Ok(n.clone());
        }
        let url = format!(
            "{}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
            self.base
        );
        let req = client.get(&url).header("Metadata", "true");
        let r = send_ok(
            req,
            &url,
            "asked for this VM's name (set `eviction.vm_name` in the manifest),",
        )
        .await?;
        let name = crate::read_text(r, &url).await?;
        let name = name.trim();
        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
            return Err(Error::new(format!(
                "{url}: not a VM name; set `eviction.vm_name` in the manifest"
            )));
        }
        self.vm_name = Some(name.to_string());
        Ok(name.to_string())
    }

    /// The URL polled, for logs.
    pub fn url(&self) -> String {
        match self.cloud {
            Cloud::Aws => format!("{}/latest/meta-data/spot/instance-action", self.base),
            Cloud::Gcp => format!("{}/computeMetadata/v1/instance/preempted", self.base),
            Cloud::Azure => format!(
                "{}/metadata/scheduledevents?api-version=2020-07-01",
                self.base
            ),
        }
    }

    /// Asks the metadata service once.
    pub async fn poll(&mut self, client: &reqwest::Client, now_ms: u64) -> Result<Answer, Error> {
        match self.cloud {
            Cloud::Aws => self.aws(client).await,
            Cloud::Gcp => self.gcp(client, now_ms).await,
            Cloud::Azure => self.azure(client, now_ms).await,
        }
    }

    async fn aws(&mut self, client: &reqwest::Client) -> Result<Answer, Error> {
        for attempt in 0..2 {
            let token = match &self.aws_token {
                Some(t) => t.clone(),
                None => {
                    let url = format!("{}/latest/api/token", self.base);
                    let req = client
                        .put(&url)
                        .header("X-aws-ec2-metadata-token-ttl-seconds", "21600");
                    let r = send_ok(req, &url, "IMDSv2 token request").await?;
                    let t = crate::read_text(r, &url).await?;
                    self.aws_token = Some(t.trim().to_string());
                    t.trim().to_string()
                }
            };
            let url = self.url();
            let r = client
                .get(&url)
                .header("X-aws-ec2-metadata-token", token)
                .send()
                .await
                .map_err(|e| Error::http(&url, e))?;
            match r.status().as_u16() {
                404 => return Ok(Answer::Clear),
                401 if attempt == 0 => {
                    self.aws_token = None;
                    continue;
                }
                200 => {
                    #[derive(Deserialize)]
                    struct Action {
                        action: String,
                        time: String,
                    }
                    let body = crate::read_capped(r, &url, crate::MAX_METADATA_BYTES).await?;
                    let a: Action = serde_json::from_slice(&body).map_err(|e| {
                        Error::new(format!(
                            "{url}: not an instance-action notice (`{{\"action\",\"time\"}}`): {e}"
                        ))
                    })?;
                    let at_ms = crate::rfc3339_ms(&a.time)
                        .map_err(|e| Error::new(format!("{url}: `time`: {e}")))?;
                    return Ok(Answer::Notice {
                        at_ms,
                        what: format!("AWS spot instance-action `{}` at {}", a.action, a.time),
                    });
                }
                s => return Err(Error::new(format!("{url}: answered HTTP {s}"))),
            }
        }
        Err(Error::new(format!(
            "{}: the IMDSv2 token was refused twice",
            self.url()
        )))
    }

    async fn gcp(&mut self, client: &reqwest::Client, now_ms: u64) -> Result<Answer, Error> {
        let url = self.url();
        let req = client.get(&url).header("Metadata-Flavor", "Google");
        let r = send_ok(req, &url, "").await?;
        let body = crate::read_text(r, &url).await?;
        match body.trim() {
            "FALSE" => {
                self.gcp_first_seen_ms = None;
                Ok(Answer::Clear)
            }
            "TRUE" => {
                let seen = *self.gcp_first_seen_ms.get_or_insert(now_ms);
                Ok(Answer::Notice {
                    at_ms: seen + GCP_NOTICE_MS,
                    what: "GCP instance preempted (30 s notice)".into(),
                })
            }
            other => Err(Error::new(format!(
                "{url}: answered `{other}`, expected TRUE or FALSE"
            ))),
        }
    }

    async fn azure(&mut self, client: &reqwest::Client, now_ms: u64) -> Result<Answer, Error> {
        #[derive(Deserialize)]
        struct Events {
            #[serde(rename = "Events")]
            events: Vec<Event>,
        }
        #[derive(Deserialize)]
        struct Event {
            #[serde(rename = "EventId", default)]
            id: String,
            #[serde(rename = "EventType")]
            kind: String,
            #[serde(rename = "NotBefore", default)]
            not_before: String,
            #[serde(rename = "Resources", default)]
            resources: Vec<String>,
        }
        let vm = self.azure_vm_name(client).await?;
        let url = self.url();
        let r = send_ok(client.get(&url).header("Metadata", "true"), &url, "").await?;
        let body = crate::read_capped(r, &url, crate::MAX_METADATA_BYTES).await?;
        let ev: Events = serde_json::from_slice(&body).map_err(|e| {
            Error::new(format!(
                "{url}: not a Scheduled Events document (`{{\"Events\":[...]}}`): {e}"
            ))
        })?;
        let mut first: Option<(u64, String)> = None;
        let ours =
            |e: &&Event| e.resources.is_empty() || e.resources.iter().any(|r| names_vm(r, &vm));
        for e in ev
            .events
            .iter()
            .filter(|e| e.kind == "Preempt")
            .filter(ours)
        {
            let at = if e.not_before.trim().is_empty() {
                now_ms
            } else {
                chrono::DateTime::parse_from_rfc2822(e.not_before.trim())
                    .map(|t| t.timestamp_millis().max(0) as u64)
                    .map_err(|err| {
                        Error::new(format!(
                            "{url}: event `{}` has NotBefore `{}`: {err}",
                            e.id, e.not_before
                        ))
                    })?
            };
            if first.as_ref().is_none_or(|(t, _)| at < *t) {
                first = Some((
                    at,
                    format!("Azure Preempt event `{}` not before {}", e.id, e.not_before),
                ));
            }
        }
        Ok(match first {
            None => Answer::Clear,
            Some((at_ms, what)) => Answer::Notice { at_ms, what },
        })
    }
}

/// Sends `req` to `url`; an error or a status other than 2xx is an error
/// naming the URL, `what` was asked (may be empty) and the status.
async fn send_ok(
    req: reqwest::RequestBuilder,
    url: &str,
    what: &str,
) -> Result<reqwest::Response, Error> {
    let r = req.send().await.map_err(|e| Error::http(url, e))?;
    if !r.status().is_success() {
        let sep = if what.is_empty() { "" } else { " " };
        return Err(Error::new(format!(
            "{url}: {what}{sep}answered {}",
            r.status()
        )));
    }
    Ok(r)
}

/// Whether a Scheduled Events `Resources` entry names VM `vm`. Case is
/// not significant in Azure resource names.
fn names_vm(resource: &str, vm: &str) -> bool {
    resource.trim().eq_ignore_ascii_case(vm.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, put};
    use axum::Router;
    use std::sync::{Arc, Mutex};

    async fn serve(app: Router) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        format!("http://{addr}")
    }

    fn client() -> reqwest::Client {
        crate::http_client(std::time::Duration::from_secs(2)).unwrap()
    }

    #[tokio::test]
    async fn aws_imdsv2_token_then_notice_or_404() {
        let notice: Arc<Mutex<Option<&'static str>>> = Arc::new(Mutex::new(None));
        let n = notice.clone();
        let app = Router::new()
            .route(
                "/latest/api/token",
                put(|h: HeaderMap| async move {
                    if h.contains_key("x-aws-ec2-metadata-token-ttl-seconds") {
                        (StatusCode::OK, "tok")
                    } else {
                        (StatusCode::BAD_REQUEST, "")
                    }
                }),
            )
            .route(
                "/latest/meta-data/spot/instance-action",
                get(move |h: HeaderMap| async move {
                    if h.get("x-aws-ec2-metadata-token").map(|v| v.as_bytes()) != Some(b"tok") {
                        return (StatusCode::UNAUTHORIZED, String::new());
                    }
                    match *n.lock().unwrap() {
                        None => (StatusCode::NOT_FOUND, String::new()),
                        Some(t) => (StatusCode::OK, t.to_string()),
                    }
                }),
            );
        let mut p = Poller::new(Cloud::Aws, serve(app).await, None);
        let c = client();
        assert_eq!(p.poll(&c, 0).await.unwrap(), Answer::Clear);
        *notice.lock().unwrap() = Some(r#"{"action":"terminate","time":"2026-12-05T10:02:00Z"}"#);
        let Answer::Notice { at_ms, what } = p.poll(&c, 0).await.unwrap() else {
            panic!("no notice")
        };
        assert_eq!(at_ms, crate::rfc3339_ms("2026-12-05T10:02:00Z").unwrap());
        assert!(what.contains("terminate"));
        *notice.lock().unwrap() = Some("{}");
        assert!(p.poll(&c, 0).await.is_err());
        // A stale token is renewed once.
        p.aws_token = Some("old".into());
        *notice.lock().unwrap() = None;
        assert_eq!(p.poll(&c, 0).await.unwrap(), Answer::Clear);
    }

    #[tokio::test]
    async fn gcp_true_gives_30_seconds_from_first_sight() {
        let state = Arc::new(Mutex::new("FALSE"));
        let s = state.clone();
        let app = Router::new().route(
            "/computeMetadata/v1/instance/preempted",
            get(move |h: HeaderMap| async move {
                if h.get("metadata-flavor").map(|v| v.as_bytes()) != Some(b"Google") {
                    return (StatusCode::FORBIDDEN, String::new());
                }
                (StatusCode::OK, s.lock().unwrap().to_string())
            }),
        );
        let mut p = Poller::new(Cloud::Gcp, serve(app).await, None);
        let c = client();
        assert_eq!(p.poll(&c, 1000).await.unwrap(), Answer::Clear);
        *state.lock().unwrap() = "TRUE";
        let a = p.poll(&c, 5000).await.unwrap();
        assert!(matches!(a, Answer::Notice { at_ms: 35_000, .. }), "{a:?}");
        let a = p.poll(&c, 6000).await.unwrap();
        assert!(matches!(a, Answer::Notice { at_ms: 35_000, .. }), "{a:?}");
        *state.lock().unwrap() = "maybe";
        assert!(p.poll(&c, 7000).await.is_err());
    }

    #[tokio::test]
    async fn azure_drains_only_the_vm_its_event_names() {
        let doc = Arc::new(Mutex::new(fixture!("azure-scheduledevents-empty.json")));
        let d = doc.clone();
        let asked = Arc::new(Mutex::new(0));
        let a = asked.clone();
        let metadata = |h: &HeaderMap| h.get("metadata").map(|v| v.as_bytes()) == Some(b"true");
        let app = Router::new()
            .route(
                "/metadata/scheduledevents",
                get(move |h: HeaderMap| async move {
                    if !metadata(&h) {
                        return (StatusCode::BAD_REQUEST, "");
                    }
                    (StatusCode::OK, *d.lock().unwrap())
                }),
            )
            .route(
                "/metadata/instance/compute/name",
                get(move |h: HeaderMap| async move {
                    *a.lock().unwrap() += 1;
                    if !metadata(&h) {
                        return (StatusCode::BAD_REQUEST, "");
                    }
                    (StatusCode::OK, fixture!("azure-compute-name.txt"))
                }),
            );
        let base = serve(app).await;
        let c = client();
        // This VM is `vm-a`, as the metadata service says.
        let mut p = Poller::new(Cloud::Azure, base.clone(), None);
        assert_eq!(p.poll(&c, 0).await.unwrap(), Answer::Clear);
        // A Preempt for `vm-b`, delivered to every VM of the set: not ours.
        *doc.lock().unwrap() = fixture!("azure-scheduledevents-preempt-other.json");
        assert_eq!(p.poll(&c, 0).await.unwrap(), Answer::Clear);
        // The same event naming `vm-a`: drained at its NotBefore.
        *doc.lock().unwrap() = fixture!("azure-scheduledevents-preempt-self.json");
        let at = chrono::DateTime::parse_from_rfc2822("Mon, 19 Sep 2039 18:29:47 GMT")
            .unwrap()
            .timestamp_millis() as u64;
        assert!(
            matches!(p.poll(&c, 0).await.unwrap(), Answer::Notice { at_ms, .. } if at_ms == at)
        );
        // The name was asked once.
        assert_eq!(*asked.lock().unwrap(), 1);
        // A name given in the manifest is used instead (case does not
        // matter in Azure's names).
        let mut b = Poller::new(Cloud::Azure, base, Some("VM-B".into()));
        *doc.lock().unwrap() = fixture!("azure-scheduledevents-preempt-other.json");
        assert!(matches!(
            b.poll(&c, 0).await.unwrap(),
            Answer::Notice { .. }
        ));
        assert_eq!(*asked.lock().unwrap(), 1);
    }

    #[tokio::test]
    async fn aws_and_gcp_documented_notices() {
        let app = Router::new()
            .route("/latest/api/token", put(|| async { "tok" }))
            .route(
                "/latest/meta-data/spot/instance-action",
                get(|| async { fixture!("aws-instance-action.json") }),
            );
        let mut p = Poller::new(Cloud::Aws, serve(app).await, None);
        let a = p.poll(&client(), 0).await.unwrap();
        let want = crate::rfc3339_ms("2026-12-05T10:02:00Z").unwrap();
        assert!(
            matches!(a, Answer::Notice { at_ms, .. } if at_ms == want),
            "{a:?}"
        );
        let answer = Arc::new(Mutex::new(fixture!("gcp-preempted-false.txt")));
        let g = answer.clone();
        let app = Router::new().route(
            "/computeMetadata/v1/instance/preempted",
            get(move || async move { *g.lock().unwrap() }),
        );
        let mut p = Poller::new(Cloud::Gcp, serve(app).await, None);
        assert_eq!(p.poll(&client(), 0).await.unwrap(), Answer::Clear);
        *answer.lock().unwrap() = fixture!("gcp-preempted-true.txt");
        assert!(matches!(
            p.poll(&client(), 0).await.unwrap(),
            Answer::Notice {
                at_ms: GCP_NOTICE_MS,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn azure_preempt_not_before_and_cancellation() {
        let doc = Arc::new(Mutex::new(String::from(
            r#"{"DocumentIncarnation":1,"Events":[{"EventId":"f","EventType":"Freeze","NotBefore":""}]}"#,
        )));
        let d = doc.clone();
        let app = Router::new().route(
            "/metadata/scheduledevents",
            get(move |h: HeaderMap| async move {
                if h.get("metadata").map(|v| v.as_bytes()) != Some(b"true") {
                    return (StatusCode::BAD_REQUEST, String::new());
                }
                (StatusCode::OK, d.lock().unwrap().clone())
            }),
        );
        let mut p = Poller::new(Cloud::Azure, serve(app).await, Some("vm".into()));
        let c = client();
        assert_eq!(p.poll(&c, 0).await.unwrap(), Answer::Clear);
        *doc.lock().unwrap() = r#"{"DocumentIncarnation":2,"Events":[{"EventId":"p","EventType":"Preempt","ResourceType":"VirtualMachine","Resources":["vm"],"EventStatus":"Scheduled","NotBefore":"Mon, 19 Sep 2016 18:29:47 GMT"}]}"#.into();
        let a = p.poll(&c, 0).await.unwrap();
        assert!(
            matches!(
                a,
                Answer::Notice {
                    at_ms: 1_474_309_787_000,
                    ..
                }
            ),
            "{a:?}"
        );
        *doc.lock().unwrap() =
            r#"{"Events":[{"EventId":"p","EventType":"Preempt","NotBefore":""}]}"#.into();
        assert!(matches!(
            p.poll(&c, 42).await.unwrap(),
            Answer::Notice { at_ms: 42, .. }
        ));
        *doc.lock().unwrap() = r#"{"DocumentIncarnation":3,"Events":[]}"#.into();
        assert_eq!(p.poll(&c, 0).await.unwrap(), Answer::Clear);
    }
}
