//! What one Envoy process shares between its Wasm VMs.
//!
//! Envoy runs one VM per worker thread (plus one on the main thread), and
//! those VMs meet only through process-wide state: shared data (a key-value
//! store with compare-and-swap), shared queues, stats and the cluster
//! manager. A [`Process`] is that state, outside any wasmtime `Store`, so a
//! test can start several [`Vm`](crate::Vm)s on one process and watch them
//! race, exactly as workers do. It is a cheap handle (`Arc<Mutex<..>>`):
//! clone it into every VM of the same process; separate processes (and so
//! separate tests) share nothing.
//!
//! Semantics follow proxy-wasm-cpp-host (`shared_data.cc`, `shared_queue.cc`):
//! data is keyed by the `vm_id` string only; every successful write gets a
//! new, process-wide, non-zero CAS; a non-zero CAS that differs from the
//! stored one is a mismatch; a queue notifies only its last registrant.

use crate::abi::{MetricType, Status};
use crate::grpc::{GrpcEvent, GrpcHandler, GrpcReply, GrpcRequest};
use crate::http_call::{CallRequest, CallResult};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// A cluster's answer to `dispatch_http_call`: given the request, the result.
pub type Responder = Arc<dyn Fn(&CallRequest) -> CallResult + Send + Sync>;

/// How a known cluster answers HTTP callouts.
#[derive(Clone)]
pub(crate) enum ClusterBehaviour {
    /// Calls stay pending until the test completes them.
    Manual,
    /// Each call is answered by the function when dispatched; the answer
    /// reaches the filter after the callback returns and, if the cluster
    /// has a latency, once the virtual clock has moved that far.
    Respond(Responder, std::time::Duration),
}

/// The value of a metric, aggregated over every VM of the process (as Envoy
/// aggregates a stat across workers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricValue {
    /// A counter's total.
    Counter(u64),
    /// A gauge's current value.
    Gauge(i64),
    /// Every sample a histogram recorded, in order.
    Histogram(Vec<u64>),
}

#[derive(Debug)]
struct Queue {
    items: VecDeque<Vec<u8>>,
    /// (VM instance, root context id) to notify: the last registrant.
    registrant: (u64, u32),
}

/// One `vm_id`'s key-value store: key → (value, cas).
type Namespace = HashMap<Vec<u8>, (Vec<u8>, u32)>;

#[derive(Default)]
struct Inner {
    data: HashMap<String, Namespace>,
    last_cas: u32,
    /// `proxy_get_shared_data` calls so far.
    shared_reads: u64,
    queue_tokens: HashMap<(String, Vec<u8>), u32>,
    queues: HashMap<u32, Queue>,
    last_queue: u32,
    /// (VM instance, root context, queue token) notifications not yet delivered.
    ready: Vec<(u64, u32, u32)>,
    metrics: BTreeMap<String, MetricValue>,
    clusters: HashMap<String, ClusterBehaviour>,
    /// gRPC clusters: `None` leaves calls to the test
    /// ([`Vm::reply_grpc`](crate::Vm::reply_grpc)).
    grpc_clusters: HashMap<String, Option<GrpcHandler>>,
    last_vm: u64,
}

/// Shared state of one simulated Envoy process. See the module docs.
#[derive(Clone, Default)]
pub struct Process {
    inner: Arc<Mutex<Inner>>,
}

impl fmt::Debug for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.lock();
        f.debug_struct("Process")
            .field("vm_ids", &g.data.keys().collect::<Vec<_>>())
            .field("queues", &g.queues.len())
            .field("metrics", &g.metrics)
            .field("clusters", &g.clusters.keys().collect::<Vec<_>>())
            .field("grpc_clusters", &g.grpc_clusters.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Process {
    /// A fresh process with no data, queues, metrics or clusters.
    pub fn new() -> Process {
        Process::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock (in a test's responder) must not
        // make every later call panic too: the data is still consistent,
        // because no method leaves it half-written.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Declares a cluster whose callouts the test completes by hand
    /// ([`Vm::complete_http_call`](crate::Vm::complete_http_call)).
    pub fn add_cluster(&self, name: &str) {
        self.lock()
            .clusters
            .insert(name.to_string(), ClusterBehaviour::Manual);
    }

    /// Declares a cluster that answers each callout with `respond`. The answer
    /// reaches the filter after the callback that dispatched it returns, as
    /// in Envoy.
    pub fn add_cluster_with(
        &self,
        name: &str,
        respond: impl Fn(&CallRequest) -> CallResult + Send + Sync + 'static,
    ) {
        self.lock().clusters.insert(
            name.to_string(),
            ClusterBehaviour::Respond(Arc::new(respond), std::time::Duration::ZERO),
        );
    }

    /// Makes a cluster that answers through a function (`add_cluster_with`,
    /// `add_cluster_script`) take `latency` of virtual time to answer: the
    /// answer arrives when the VM's clock ([`Vm::advance`](crate::Vm::advance),
    /// or an exchange waiting for it) gets there, unless the callout's
    /// timeout comes first. No effect on other clusters.
    pub fn set_cluster_latency(&self, name: &str, latency: std::time::Duration) {
        if let Some(ClusterBehaviour::Respond(_, l)) = self.lock().clusters.get_mut(name) {
            *l = latency;
        }
    }

    /// Declares a cluster that answers its callouts with `script`, in
    /// order; once the script runs out, calls fail (`Reset`).
    pub fn add_cluster_script(&self, name: &str, script: Vec<CallResult>) {
        let script = Mutex::new(std::collections::VecDeque::from(script));
        self.add_cluster_with(name, move |_| {
            script
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
                .unwrap_or(CallResult::Reset)
        });
    }

    /// Declares a gRPC cluster whose calls and streams the test answers by
    /// hand ([`Vm::reply_grpc`](crate::Vm::reply_grpc)).
    pub fn add_grpc_cluster(&self, name: &str) {
        self.lock().grpc_clusters.insert(name.to_string(), None);
    }

    /// Declares a gRPC cluster whose server is `handler`: given a call or
    /// stream and what just arrived on it, the replies. See [`crate::GrpcReply`].
    pub fn add_grpc_cluster_with(
        &self,
        name: &str,
        handler: impl Fn(&GrpcRequest, &GrpcEvent) -> Vec<GrpcReply> + Send + Sync + 'static,
    ) {
        self.lock()
            .grpc_clusters
            .insert(name.to_string(), Some(Arc::new(handler)));
    }

    /// `Some(None)`: a gRPC cluster answered by hand; `None`: not a gRPC cluster.
    pub(crate) fn grpc_cluster(&self, name: &str) -> Option<Option<GrpcHandler>> {
        self.lock().grpc_clusters.get(name).cloned()
    }

    pub(crate) fn cluster(&self, name: &str) -> Option<ClusterBehaviour> {
        self.lock().clusters.get(name).cloned()
    }

    pub(crate) fn new_vm_instance(&self) -> u64 {
        let mut g = self.lock();
        g.last_vm += 1;
        g.last_vm
    }

    // ---- shared data ----

    /// Reads shared data: `(value, cas)`, or `None` when the key was never set.
    pub fn shared_data(&self, vm_id: &str, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        self.lock()
            .data
            .get(vm_id)
            .and_then(|m| m.get(key))
            .cloned()
    }

    /// How many times guests have called `proxy_get_shared_data` (a filter's
    /// read budget is worth testing: inside Envoy it is a costly call).
    pub fn shared_data_reads(&self) -> u64 {
        self.lock().shared_reads
    }

    pub(crate) fn count_shared_data_read(&self) {
        let mut g = self.lock();
        g.shared_reads = g.shared_reads.saturating_add(1);
    }

    /// Writes shared data as `proxy_set_shared_data` does: `cas == 0` is
    /// unconditional; otherwise it must equal the stored CAS (for an existing
    /// key) or the write fails with [`Status::CasMismatch`].
    pub fn set_shared_data(
        &self,
        vm_id: &str,
        key: &[u8],
        value: &[u8],
        cas: u32,
    ) -> Result<(), Status> {
        let mut g = self.lock();
        // One process-wide counter, advanced by successful writes only, as
        // in proxy-wasm-cpp-host: a filter may rely on "the entry still
        // holds the CAS my write gave it" meaning "nobody wrote since".
        let next = match g.last_cas.wrapping_add(1) {
            0 => 1,
            n => n,
        };
        let map = g.data.entry(vm_id.to_string()).or_default();
        match map.get_mut(key) {
            Some(entry) => {
                if cas != 0 && cas != entry.1 {
                    return Err(Status::CasMismatch);
                }
                *entry = (value.to_vec(), next);
            }
            None => {
                map.insert(key.to_vec(), (value.to_vec(), next));
            }
        }
        g.last_cas = next;
        Ok(())
    }

    // ---- shared queues ----

    pub(crate) fn register_queue(&self, vm_id: &str, name: &[u8], registrant: (u64, u32)) -> u32 {
        let mut g = self.lock();
        let key = (vm_id.to_string(), name.to_vec());
        let token = match g.queue_tokens.get(&key) {
            Some(t) => *t,
            None => {
                g.last_queue += 1;
                let t = g.last_queue;
                g.queue_tokens.insert(key, t);
                t
            }
        };
        g.queues
            .entry(token)
            .and_modify(|q| q.registrant = registrant)
            .or_insert(Queue {
                items: VecDeque::new(),
                registrant,
            });
        token
    }

    /// The token of queue `name` under `vm_id`, if anyone registered it.
    pub fn resolve_queue(&self, vm_id: &str, name: &[u8]) -> Option<u32> {
        self.lock()
            .queue_tokens
            .get(&(vm_id.to_string(), name.to_vec()))
            .copied()
    }

    /// Appends to a queue and schedules `on_queue_ready` for its registrant.
    pub fn enqueue(&self, token: u32, item: &[u8]) -> Result<(), Status> {
        let mut g = self.lock();
        let registrant = match g.queues.get_mut(&token) {
            Some(q) => {
                q.items.push_back(item.to_vec());
                q.registrant
            }
            None => return Err(Status::NotFound),
        };
        g.ready.push((registrant.0, registrant.1, token));
        Ok(())
    }

    /// Takes the oldest item: `Err(Empty)` when there is none, `Err(NotFound)`
    /// for an unknown token.
    pub fn dequeue(&self, token: u32) -> Result<Vec<u8>, Status> {
        let mut g = self.lock();
        let q = g.queues.get_mut(&token).ok_or(Status::NotFound)?;
        q.items.pop_front().ok_or(Status::Empty)
    }

    pub(crate) fn take_ready(&self, vm_instance: u64) -> Vec<(u32, u32)> {
        let mut g = self.lock();
        let mut mine = Vec::new();
        g.ready.retain(|(vm, root, token)| {
            if *vm == vm_instance {
                mine.push((*root, *token));
                false
            } else {
                true
            }
        });
        mine
    }

    // ---- metrics ----

    pub(crate) fn define_metric(&self, kind: MetricType, name: &str) {
        let mut g = self.lock();
        g.metrics.entry(name.to_string()).or_insert(match kind {
            MetricType::Counter => MetricValue::Counter(0),
            MetricType::Gauge => MetricValue::Gauge(0),
            MetricType::Histogram => MetricValue::Histogram(Vec::new()),
        });
    }

    pub(crate) fn update_metric(&self, name: &str, f: impl FnOnce(&mut MetricValue)) {
        if let Some(m) = self.lock().metrics.get_mut(name) {
            f(m);
        }
    }

    /// A metric by the name the filter defined (Envoy shows it as
    /// `wasmcustom.<name>`), aggregated over all VMs.
    pub fn metric(&self, name: &str) -> Option<MetricValue> {
        self.lock().metrics.get(name).cloned()
    }

    /// A counter's or gauge's value as `i64`; `None` for histograms and
    /// unknown names. Shorthand for assertions.
    pub fn metric_value(&self, name: &str) -> Option<i64> {
        match self.metric(name)? {
            MetricValue::Counter(c) => i64::try_from(c).ok(),
            MetricValue::Gauge(g) => Some(g),
            MetricValue::Histogram(_) => None,
        }
    }

    /// Every metric, by name.
    pub fn metrics(&self) -> BTreeMap<String, MetricValue> {
        self.lock().metrics.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_cas_is_a_mismatch() {
        let p = Process::new();
        assert_eq!(p.set_shared_data("vm", b"k", b"1", 0), Ok(()));
        let (_, cas) = p.shared_data("vm", b"k").unwrap_or_default();
        assert_eq!(p.set_shared_data("vm", b"k", b"2", cas), Ok(()));
        assert_eq!(
            p.set_shared_data("vm", b"k", b"3", cas),
            Err(Status::CasMismatch)
        );
        assert_eq!(p.shared_data("other", b"k"), None);
    }

    /// Envoy's CAS values come from one counter for the whole process,
    /// advanced by each successful write (of any key, in any `vm_id`).
    #[test]
    fn cas_values_come_from_one_counter_that_only_writes_advance() {
        let p = Process::new();
        let cas = |vm: &str, k: &[u8]| p.shared_data(vm, k).map(|(_, c)| c);
        assert_eq!(p.set_shared_data("vm", b"a", b"1", 0), Ok(()));
        assert_eq!(cas("vm", b"a"), Some(1));
        assert_eq!(p.set_shared_data("other", b"b", b"1", 0), Ok(()));
        assert_eq!(cas("other", b"b"), Some(2));
        assert_eq!(
            p.set_shared_data("vm", b"a", b"2", 7),
            Err(Status::CasMismatch)
        );
        assert_eq!(p.set_shared_data("vm", b"a", b"2", 1), Ok(()));
        assert_eq!(cas("vm", b"a"), Some(3), "the failed write took no value");
    }
}
