//! The service's inputs, one source each: the engines (load, resident
//! models and the API keys their polls carry), the prices (per token, per
//! GPU hour), the eviction notices and the plan; the budgets' source is
//! [`crate::budgets::Source`]. Each reads what it can at start, where a
//! bad input refuses to start, then keeps it up to date on a task of its
//! own; what goes bad later is logged and the last good one kept.

use crate::state::{Dest, Service, Watched};
use crate::{eviction, plan, prices, Error, FeedSource, MAX_FEED_BYTES};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// A tick every `interval`; a late tick delays the next, never bunches.
pub(crate) fn every(interval: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(interval);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// The engines: per destination, its model server's load (metrics) and
/// resident models, and the API key both polls carry.
pub(crate) struct Engines {
    /// Each destination's key file, re-read when it changes.
    key_files: Vec<(usize, Watched)>,
}

impl Engines {
    /// Reads every destination's API key (an unreadable or empty file
    /// refuses to start): the keys, by destination, and the source.
    pub fn load(dests: &[Dest]) -> Result<(Engines, Vec<Option<String>>), Error> {
        let mut key_files = Vec::new();
        let mut keys = vec![None; dests.len()];
        for (d, (dest, key)) in dests.iter().zip(keys.iter_mut()).enumerate() {
            if let Some(path) = &dest.api_key_file {
                let mut w = Watched::new(path.clone());
                let bytes = w.changed()?.unwrap_or_default();
                *key = Some(api_key(&bytes).map_err(|e| {
                    Error::new(format!(
                        "destination `{}`, control field `api_key_file` ({}): {e}",
                        dest.name,
                        path.display()
                    ))
                })?);
                key_files.push((d, w));
            }
        }
        Ok((Engines { key_files }, keys))
    }

    /// Polls each destination's metrics and models every interval, each
    /// on its own task, and re-reads the key files (a rotated key).
    pub fn spawn(
        self,
        tasks: &mut JoinSet<()>,
        svc: &Arc<Service>,
        client: &reqwest::Client,
        interval: Duration,
    ) {
        for (d, dest) in svc.dests.iter().enumerate() {
            if dest.metrics.is_some() {
                let (svc, client, mut tick) = (svc.clone(), client.clone(), every(interval));
                tasks.spawn(async move {
                    loop {
                        tick.tick().await;
                        svc.poll_metrics(d, &client).await;
                    }
                });
            }
            if dest.models.is_some() {
                let (svc, client, mut tick) = (svc.clone(), client.clone(), every(interval));
                tasks.spawn(async move {
                    loop {
                        tick.tick().await;
                        svc.poll_models(d, &client).await;
                    }
                });
            }
        }
        let Engines { mut key_files } = self;
        if key_files.is_empty() {
            return;
        }
        let (svc, mut tick) = (svc.clone(), every(interval));
        tasks.spawn(async move {
            loop {
                tick.tick().await;
                for (d, w) in &mut key_files {
                    let d = *d;
                    reread(&svc, "api_key_file", w, |b, _| {
                        api_key(b).map(|k| {
                            if let Some(key) = svc.inputs().keys.get_mut(d) {
                                *key = Some(k);
                            }
                        })
                    });
                }
            }
        });
    }
}

/// The eviction notices: per destination on a spot instance, its cloud's
/// metadata endpoint, polled every interval (pushed notices come in on
/// `POST /v1/notice`).
pub(crate) struct Notices;

impl Notices {
    /// Polls each destination's notices on its own task.
    pub fn spawn(
        tasks: &mut JoinSet<()>,
        svc: &Arc<Service>,
        client: &reqwest::Client,
        interval: Duration,
    ) {
        for (d, dest) in svc.dests.iter().enumerate() {
            let Some((cloud, base, vm_name)) = dest.eviction.clone() else {
                continue;
            };
            let (svc, client, mut tick) = (svc.clone(), client.clone(), every(interval));
            let mut poller = eviction::Poller::new(cloud, base, vm_name);
            tasks.spawn(async move {
                loop {
                    tick.tick().await;
                    svc.poll_eviction(d, &mut poller, &client).await;
                }
            });
        }
    }
}

/// The prices: per-token prices from a file (`--prices`), GPU-hour
/// prices from a file or a feed URL (`--gpu-prices`).
pub(crate) struct Prices {
    tokens: Option<Watched>,
    gpu_file: Option<Watched>,
    gpu_url: Option<String>,
}

impl Prices {
    /// Reads the files (a bad one refuses to start) and fetches the feed:
    /// one that is down at start is retried every interval (the service
    /// is worth running without GPU prices); one that answers with
    /// something else is a configuration error.
    pub async fn load(
        tokens: Option<&std::path::Path>,
        gpu: Option<&FeedSource>,
        svc: &Service,
        client: &reqwest::Client,
    ) -> Result<Prices, Error> {
        let mut tokens = tokens.map(|p| Watched::new(p.to_path_buf()));
        if let Some(w) = &mut tokens {
            let bytes = w.changed()?.unwrap_or_default();
            let t = prices::TokenPrices::parse(&bytes)
                .map_err(|e| Error::new(format!("--prices {}: {e}", w.path.display())))?;
            svc.set_token_prices(t, &w.path.display().to_string());
        }
        let (mut gpu_file, mut gpu_url) = (None, None);
        match gpu {
            Some(FeedSource::File(p)) => {
                let mut w = Watched::new(p.clone());
                let bytes = w.changed()?.unwrap_or_default();
                let f = prices::GpuPrices::parse(&bytes)
                    .map_err(|e| Error::new(format!("--gpu-prices {}: {e}", w.path.display())))?;
                svc.set_gpu_prices(f, &w.path.display().to_string());
                gpu_file = Some(w);
            }
            Some(FeedSource::Url(u)) => {
                match crate::get_bytes(client, u, MAX_FEED_BYTES, None).await {
                    Ok(bytes) => {
                        let f = prices::GpuPrices::parse(&bytes)
                            .map_err(|e| Error::new(format!("--gpu-prices {u}: {e}")))?;
                        svc.set_gpu_prices(f, u);
                    }
                    Err(e) => svc.note(
                        "gpu_prices",
                        u,
                        Err(&format!("{e}; retried every interval")),
                    ),
                }
                gpu_url = Some(u.clone());
            }
            None => {}
        }
        Ok(Prices {
            tokens,
            gpu_file,
            gpu_url,
        })
    }

    /// Re-reads the files when they change and fetches the feed, every
    /// interval.
    pub fn spawn(
        mut self,
        tasks: &mut JoinSet<()>,
        svc: &Arc<Service>,
        client: &reqwest::Client,
        interval: Duration,
    ) {
        if self.tokens.is_none() && self.gpu_file.is_none() && self.gpu_url.is_none() {
            return;
        }
        let (svc, client, mut tick) = (svc.clone(), client.clone(), every(interval));
        tasks.spawn(async move {
            loop {
                tick.tick().await;
                self.step(&svc, &client).await;
            }
        });
    }

    /// One interval's reads.
    async fn step(&mut self, svc: &Service, client: &reqwest::Client) {
        if let Some(w) = &mut self.tokens {
            reread(svc, "prices", w, |b, name| {
                prices::TokenPrices::parse(b).map(|t| svc.set_token_prices(t, name))
            });
        }
        if let Some(w) = &mut self.gpu_file {
            reread(svc, "gpu_prices", w, |b, name| {
                prices::GpuPrices::parse(b).map(|f| svc.set_gpu_prices(f, name))
            });
        }
        if let Some(u) = &self.gpu_url {
            let r = match crate::get_bytes(client, u, MAX_FEED_BYTES, None).await {
                Ok(b) => prices::GpuPrices::parse(&b)
                    .map_err(|e| format!("{u}: {e}"))
                    .map(|f| {
                        let same = svc.inputs().gpu_prices.as_ref() == Some(&f);
                        if !same {
                            svc.set_gpu_prices(f, u);
                        }
                    }),
                Err(e) => Err(e.0),
            };
            svc.note(
                "gpu_prices",
                u,
                r.as_ref().map(|_| ()).map_err(String::as_str),
            );
        }
    }
}

/// The plan: the planner's rolling horizon (`--plan`), owned capacity
/// per destination by the hour.
pub(crate) struct Plan {
    file: Watched,
}

impl Plan {
    /// Reads the plan (a malformed line refuses to start).
    pub fn load(path: Option<&std::path::Path>, svc: &Service) -> Result<Option<Plan>, Error> {
        let Some(path) = path else {
            return Ok(None);
        };
        let mut file = Watched::new(path.to_path_buf());
        let bytes = file.changed()?.unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let p = plan::Plan::parse(&text)
            .map_err(|e| Error::new(format!("--plan {}: {e}", file.path.display())))?;
        svc.inputs().plan = Some(p);
        Ok(Some(Plan { file }))
    }

    /// Re-reads the plan when it changes, every interval.
    pub fn spawn(mut self, tasks: &mut JoinSet<()>, svc: &Arc<Service>, interval: Duration) {
        let (svc, mut tick) = (svc.clone(), every(interval));
        tasks.spawn(async move {
            loop {
                tick.tick().await;
                reread(&svc, "plan", &mut self.file, |b, _| {
                    plan::Plan::parse(&String::from_utf8_lossy(b)).map(|p| {
                        svc.inputs().plan = Some(p);
                    })
                });
            }
        });
    }
}

/// The API key in a key file's bytes: one line of visible ASCII (a
/// trailing newline allowed). Its text never appears in an error.
fn api_key(bytes: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the key file is not text".to_string())?;
    let key = text.trim_end_matches(['\r', '\n']);
    if key.is_empty() {
        return Err("the key file is empty: put the model server's API key in it".into());
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "the key file must hold one line of visible ASCII characters (the key alone)".into(),
        );
    }
    Ok(key.to_string())
}

/// Re-reads a watched file if it changed, and notes the outcome.
fn reread(
    svc: &Service,
    source: &'static str,
    w: &mut Watched,
    take: impl FnOnce(&[u8], &str) -> Result<(), String>,
) {
    let key = w.path.display().to_string();
    let r = match w.changed() {
        Ok(Some(bytes)) => take(&bytes, &key).map_err(|e| format!("{e}; the last good one stays")),
        Ok(None) => return,
        Err(e) => Err(format!("{e}; the last good one stays")),
    };
    svc.note(source, &key, r.as_ref().map(|_| ()).map_err(String::as_str));
}
