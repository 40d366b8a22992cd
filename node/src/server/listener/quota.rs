//! Client quotas where requests arrive: which quotas govern a request, what it used, and the
//! connection held back while its client is over one (see [`crate::quota`] for the rules).
//!
//! As in Kafka (KIP-219), a client over its quota gets its answer at once, saying how long to
//! wait (`throttle_time_ms`), and the broker reads nothing more from that connection until the
//! wait is over, so a client that ignores the field is held back all the same. Nothing a client
//! sent is dropped: a produce over the quota is written and acknowledged, the wait comes after.
//! What each request used is counted on the shard that took it, with no lock.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use strata_coordinator::quotas::{QuotaAlteration, QuotaFilter, QuotaKey, QuotaRecord};

use super::Client;
use crate::quota::{Governing, slot};
use crate::server::messages::{SettingsChange, SettingsChanged};
use crate::server::shard::Shard;

/// When a connection may be read again, shared by its reader and its requests.
#[derive(Debug, Clone, Default)]
pub(in crate::server) struct Muted(Rc<Cell<Option<Instant>>>);

impl Muted {
    /// Holds the connection until `now + wait` at least.
    pub(super) fn hold(&self, now: Instant, wait: Duration) {
        let until = now + wait;
        if self.0.get().is_none_or(|held| held < until) {
            self.0.set(Some(until));
        }
    }

    /// Waits out the hold, if the connection has one (the clock is read only then).
    pub(super) async fn wait(&self, clock: &crate::clock::Clock) {
        if let Some(until) = self.0.take() {
            let now = clock.now();
            if until > now {
                clock.sleep(until - now).await;
            }
        }
    }
}

/// The quotas that govern one request of one client, resolved once for it.
pub(super) struct Charge<'a> {
    shard: &'a Shard,
    client: &'a Client,
    user: &'a str,
    client_id: &'a str,
    governing: [Option<Governing>; 3],
}

impl<'a> Charge<'a> {
    /// The quotas governing `client`'s requests as `client_id` (empty when it sends none).
    pub(super) fn new(shard: &'a Shard, client: &'a Client, client_id: &'a str) -> Charge<'a> {
        let user = client.principal.name();
        let governing = {
            let view = shard.view.borrow();
            QuotaKey::ALL.map(|key| view.quotas.governing(key, user, client_id))
        };
        Charge {
            shard,
            client,
            user,
            client_id,
            governing,
        }
    }

    pub(super) fn governs(&self, key: QuotaKey) -> Option<Governing> {
        self.governing[slot(key)]
    }

    /// How long the client must wait before more of `key`, counting nothing.
    pub(super) fn throttle(&self, key: QuotaKey, now: Instant) -> Duration {
        self.governs(key).map_or(Duration::ZERO, |governing| {
            self.shard.quota_usage.borrow().throttle(
                key,
                &governing,
                self.user,
                self.client_id,
                now,
            )
        })
    }

    /// Counts `amount` of `key` (bytes; for request time, percent-seconds) and returns how long
    /// the client must now wait.
    pub(super) fn record(&self, key: QuotaKey, amount: f64, now: Instant) -> Duration {
        self.governs(key).map_or(Duration::ZERO, |governing| {
            self.shard.quota_usage.borrow_mut().record(
                key,
                &governing,
                self.user,
                self.client_id,
                amount,
                now,
            )
        })
    }

    /// Tells the metrics and the connection that the answer makes the client wait `wait` for
    /// `key`: nothing more is read from it until then.
    pub(super) fn hold(&self, key: QuotaKey, wait: Duration, now: Instant) {
        let Some(governing) = self.governs(key) else {
            return;
        };
        if wait.is_zero() {
            return;
        }
        let (user, client_id) = governing.counted(self.user, self.client_id);
        self.shard
            .metrics
            .quota_throttled(key.name(), user, client_id, wait);
        self.client.muted.hold(now, wait);
    }

    /// The largest byte count an answer of `key` should carry: one quota window's worth.
    pub(super) fn max_answer_bytes(&self, key: QuotaKey) -> Option<usize> {
        self.governs(key).map(|governing| {
            let window = self.shard.quota_usage.borrow().window();
            window.max_in_window(governing.bound) as usize
        })
    }
}

/// Counts a produce request's record bytes as it is read, before it runs: the connection is
/// then held before its next request is read. Counting at read time keeps a client that
/// pipelines many requests to its rate (Kafka reads one request at a time per connection;
/// this listener reads ahead). Returns the client's wait.
pub(super) fn charge_produce(
    shard: &Shard,
    client: &Client,
    client_id: &str,
    bytes: usize,
) -> Duration {
    let charge = Charge::new(shard, client, client_id);
    let now = shard.context.config.clock.now();
    let wait = charge.record(QuotaKey::ProducerByteRate, bytes as f64, now);
    charge.hold(QuotaKey::ProducerByteRate, wait, now);
    wait
}

/// Runs `future`, measuring the time spent inside its polls: the shard's time the request
/// itself took (what the request-time quota counts), not the time it waited.
pub(super) async fn timed<F: Future>(future: F) -> (F::Output, Duration) {
    let mut future = std::pin::pin!(future);
    let mut spent = Duration::ZERO;
    let output = std::future::poll_fn(|context| {
        let started = Instant::now();
        let poll = future.as_mut().poll(context);
        spent += started.elapsed();
        poll
    })
    .await;
    (output, spent)
}

/// Percent-seconds of one thread: what the request-time quota counts `spent` as.
pub(super) fn request_share(spent: Duration) -> f64 {
    spent.as_secs_f64() * 100.0
}

/// The stored quotas `filter` matches, in entity order.
pub(super) fn describe(shard: &Shard, filter: &QuotaFilter) -> Vec<QuotaRecord> {
    shard
        .view
        .borrow()
        .quotas
        .records()
        .iter()
        .filter(|record| filter.matches(&record.entity))
        .cloned()
        .collect()
}

/// Why an alteration entry was not applied.
pub(super) enum AlterRefused {
    /// The entry itself is invalid.
    Invalid(String),
    /// The coordinator could not store the change.
    Failed(String),
}

/// Applies the valid `entries` together (unless `validate_only`), through the control thread
/// like every change to the users and ACLs; each entry's answer, in order.
pub(super) async fn alter(
    shard: &Shard,
    entries: Vec<Result<QuotaAlteration, String>>,
    validate_only: bool,
) -> Vec<Result<(), AlterRefused>> {
    let mut answers: Vec<Result<(), AlterRefused>> = entries
        .iter()
        .map(|entry| match entry {
            Ok(alteration) => alteration
                .validate()
                .map_err(|error| AlterRefused::Invalid(error.to_string())),
            Err(why) => Err(AlterRefused::Invalid(why.clone())),
        })
        .collect();
    let valid: Vec<QuotaAlteration> = entries
        .into_iter()
        .zip(&answers)
        .filter(|(_, answer)| answer.is_ok())
        .filter_map(|(entry, _)| entry.ok())
        .collect();
    if validate_only || valid.is_empty() {
        return answers;
    }
    let failed = match super::change_settings(shard, SettingsChange::AlterQuotas(valid)).await {
        Some(SettingsChanged::AlterQuotas(Ok(()))) => None,
        Some(SettingsChanged::AlterQuotas(Err(why))) => Some(why),
        Some(_) => Some("the change got another answer".to_string()),
        None => Some("the node is stopping".to_string()),
    };
    if let Some(why) = failed {
        for answer in answers.iter_mut().filter(|answer| answer.is_ok()) {
            *answer = Err(AlterRefused::Failed(why.clone()));
        }
    }
    answers
}
