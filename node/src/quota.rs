//! Client quotas, enforced: which quota governs a request and how long its client must wait.
//! Sans-IO: time is an argument, nothing here reads a clock or a socket.
//!
//! A [`QuotaBook`] is the cluster's quotas compiled for lookups that allocate nothing; it
//! resolves a (user, client id) to the quota that applies, per kind, in Kafka's order of
//! precedence (the most specific entity that sets that kind wins):
//!
//! 1. user and client id, 2. user and the default client id, 3. user alone,
//! 4. the default user and client id, 5. the default user and the default client id,
//! 6. the default user alone, 7. client id alone, 8. the default client id alone.
//!
//! Usage is counted under the entity that matched, with its names filled in: a default user
//! quota gives every user a quota of their own, a user quota is shared by all of that user's
//! client ids. As in Kafka, the rate is measured over sampled windows (`samples` windows of
//! `window` each) and is held to its bound by delay: a client over its quota is told to wait
//! until its rate over the windows falls back to the bound, `total / bound - span`.
//!
//! Each shard keeps a [`QuotaUsage`] of its own (no lock on the produce or fetch path) and
//! reports what its clients used to the other shards a few times a second
//! ([`QuotaUsage::take_reports`], [`QuotaUsage::record_remote`]), so a client whose
//! connections land on several shards is held to its quota for the whole broker.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use strata_coordinator::quotas::{EntityName, QuotaKey, QuotaRecord};

/// The sampled windows rates are measured over (Kafka's `quota.window.num` and
/// `quota.window.size.seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaWindow {
    pub samples: u32,
    pub window: Duration,
}

impl Default for QuotaWindow {
    fn default() -> Self {
        QuotaWindow {
            samples: 11,
            window: Duration::from_secs(1),
        }
    }
}

impl QuotaWindow {
    /// The longest a client is told to wait: the span of every window.
    pub fn max_throttle(&self) -> Duration {
        self.window * self.samples
    }

    /// The most one answer may carry under a byte-rate `bound`: one window's worth, so a
    /// throttled consumer's answers come about once a window rather than one huge answer and a
    /// long wait (Kafka caps a fetch at every window but one's worth).
    pub fn max_in_window(&self, bound: f64) -> f64 {
        bound * self.window.as_secs_f64()
    }
}

/// Quotas of each kind an entity sets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Limits([Option<f64>; 3]);

impl Limits {
    fn from_values(values: &BTreeMap<QuotaKey, f64>) -> Limits {
        let mut limits = Limits::default();
        for (key, value) in values {
            limits.0[slot(*key)] = Some(*value);
        }
        limits
    }

    fn get(&self, key: QuotaKey) -> Option<f64> {
        self.0[slot(key)]
    }
}

/// A kind's place in arrays kept per kind, in [`QuotaKey::ALL`] order.
pub fn slot(key: QuotaKey) -> usize {
    match key {
        QuotaKey::ProducerByteRate => 0,
        QuotaKey::ConsumerByteRate => 1,
        QuotaKey::RequestPercentage => 2,
    }
}

/// A user's quotas (a named user's, or the default user's): alone, and with client ids.
#[derive(Debug, Clone, Default, PartialEq)]
struct UserQuotas {
    alone: Limits,
    clients: HashMap<String, Limits>,
    default_client: Limits,
}

/// The quota that governs a request: its bound, and which of the request's names its usage is
/// counted under (an empty name where the matched entity has no such part).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Governing {
    pub bound: f64,
    pub by_user: bool,
    pub by_client_id: bool,
}

impl Governing {
    /// The names a request of `user` as `client_id` is counted under.
    pub fn counted<'a>(&self, user: &'a str, client_id: &'a str) -> (&'a str, &'a str) {
        (
            if self.by_user { user } else { "" },
            if self.by_client_id { client_id } else { "" },
        )
    }
}

/// The cluster's quotas, compiled for lookups.
#[derive(Debug, Clone, Default)]
pub struct QuotaBook {
    records: Vec<QuotaRecord>,
    users: HashMap<String, UserQuotas>,
    default_user: UserQuotas,
    clients: HashMap<String, Limits>,
    default_client: Limits,
    /// Whether any entity sets each kind: a request of a kind nobody limits costs one check.
    any: [bool; 3],
}

impl PartialEq for QuotaBook {
    /// Compiled from the records: equal when they are.
    fn eq(&self, other: &Self) -> bool {
        self.records == other.records
    }
}

// Stored values are finite (validated before they are stored), so equality is reflexive.
impl Eq for QuotaBook {}

impl QuotaBook {
    pub fn new(records: Vec<QuotaRecord>) -> QuotaBook {
        let mut book = QuotaBook::default();
        for record in &records {
            let limits = Limits::from_values(&record.values);
            for key in record.values.keys() {
                book.any[slot(*key)] = true;
            }
            let user = match &record.entity.user {
                None => None,
                Some(EntityName::Default) => Some(&mut book.default_user),
                Some(EntityName::Named(name)) => Some(book.users.entry(name.clone()).or_default()),
            };
            match (user, &record.entity.client_id) {
                (Some(user), None) => user.alone = limits,
                (Some(user), Some(EntityName::Default)) => user.default_client = limits,
                (Some(user), Some(EntityName::Named(client))) => {
                    user.clients.insert(client.clone(), limits);
                }
                (None, Some(EntityName::Default)) => book.default_client = limits,
                (None, Some(EntityName::Named(client))) => {
                    book.clients.insert(client.clone(), limits);
                }
                (None, None) => {}
            }
        }
        book.records = records;
        book
    }

    /// The stored records, in entity order.
    pub fn records(&self) -> &[QuotaRecord] {
        &self.records
    }

    /// The quota of kind `key` that governs `user`'s requests as `client_id`, in Kafka's order
    /// of precedence; `None` when no entity limits them. Allocates nothing.
    pub fn governing(&self, key: QuotaKey, user: &str, client_id: &str) -> Option<Governing> {
        if !self.any[slot(key)] {
            return None;
        }
        let governing = |limits: Option<&Limits>, by_user, by_client_id| {
            limits
                .and_then(|limits| limits.get(key))
                .map(|bound| Governing {
                    bound,
                    by_user,
                    by_client_id,
                })
        };
        let named = self.users.get(user);
        let defaults = &self.default_user;
        governing(named.and_then(|u| u.clients.get(client_id)), true, true)
            .or_else(|| governing(named.map(|u| &u.default_client), true, true))
            .or_else(|| governing(named.map(|u| &u.alone), true, false))
            .or_else(|| governing(defaults.clients.get(client_id), true, true))
            .or_else(|| governing(Some(&defaults.default_client), true, true))
            .or_else(|| governing(Some(&defaults.alone), true, false))
            .or_else(|| governing(self.clients.get(client_id), false, true))
            .or_else(|| governing(Some(&self.default_client), false, true))
    }
}

/// A rate measured over sampled windows, as Kafka's `Rate` over a `SampledStat`, but over the
/// time since the oldest sample began, without Kafka's floor (see [`SampledRate::measure`]).
#[derive(Debug, Clone, Default)]
struct SampledRate {
    /// (start of the window, what was recorded in it), oldest first.
    samples: VecDeque<(Instant, f64)>,
}

impl SampledRate {
    fn record(&mut self, amount: f64, now: Instant, window: &QuotaWindow) {
        self.purge(now, window);
        match self.samples.back_mut() {
            Some((start, value)) if now.saturating_duration_since(*start) < window.window => {
                *value += amount;
            }
            _ => {
                if self.samples.len() == window.samples as usize {
                    self.samples.pop_front();
                }
                self.samples.push_back((now, amount));
            }
        }
    }

    /// Drops windows too old to count.
    fn purge(&mut self, now: Instant, window: &QuotaWindow) {
        let span = window.window * window.samples;
        while let Some((start, _)) = self.samples.front() {
            if now.saturating_duration_since(*start) >= span {
                self.samples.pop_front();
            } else {
                break;
            }
        }
    }

    /// What the windows hold and the seconds they stand for: the time since the oldest window
    /// began. A new client is paced from its first request (that request's bytes over the
    /// bound is its first wait). Kafka's `Rate.windowSize` counts at least every window but
    /// one, and any floor on the span lets a client send that much at once, again each time
    /// the window that paid for it ages out: a client that always has more to send then runs
    /// a tenth over its bound with Kafka's eleven windows (a floor of one window measured 5%
    /// over in the tests below; without one they hold it to 2%).
    fn measure(&self, now: Instant, window: &QuotaWindow) -> (f64, f64) {
        let span = window.window * window.samples;
        let mut live = self
            .samples
            .iter()
            .filter(|(start, _)| now.saturating_duration_since(*start) < span)
            .peekable();
        let oldest = live.peek().map_or(now, |(start, _)| *start);
        let total: f64 = live.map(|(_, value)| value).sum();
        let elapsed = now.saturating_duration_since(oldest).min(span);
        (total, elapsed.as_secs_f64())
    }

    /// How long to wait until the rate falls back to `bound`; zero within it.
    fn throttle(&self, bound: f64, now: Instant, window: &QuotaWindow) -> Duration {
        let (total, span) = self.measure(now, window);
        if total <= bound * span {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(total / bound - span).min(window.max_throttle())
    }

    fn is_idle(&self, now: Instant, window: &QuotaWindow) -> bool {
        self.samples
            .back()
            .is_none_or(|(start, _)| now.saturating_duration_since(*start) >= window.max_throttle())
    }
}

/// The usage of one (user, client id) as a quota counts it.
#[derive(Debug, Default)]
struct Usage {
    rates: [SampledRate; 3],
    /// What this shard's clients used since the last report to the other shards.
    unreported: [f64; 3],
}

/// What one shard's clients used of a quota, for the other shards.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageReport {
    pub key: QuotaKey,
    pub user: String,
    pub client_id: String,
    pub amount: f64,
}

/// One shard's quota accounting: the usage of every (user, client id) a quota counts, its own
/// clients' and what the other shards reported.
#[derive(Debug)]
pub struct QuotaUsage {
    window: QuotaWindow,
    /// By user, then client id (empty where the governing entity has no such part): looked up
    /// by `&str`, so counting a request allocates nothing once its names have been seen.
    usage: HashMap<String, HashMap<String, Usage>>,
}

impl QuotaUsage {
    pub fn new(window: QuotaWindow) -> QuotaUsage {
        QuotaUsage {
            window,
            usage: HashMap::new(),
        }
    }

    pub fn window(&self) -> QuotaWindow {
        self.window
    }

    fn usage(&mut self, user: &str, client_id: &str) -> &mut Usage {
        if !self.usage.contains_key(user) {
            self.usage.insert(user.to_string(), HashMap::new());
        }
        let clients = self.usage.get_mut(user).expect("inserted above");
        if !clients.contains_key(client_id) {
            clients.insert(client_id.to_string(), Usage::default());
        }
        clients.get_mut(client_id).expect("inserted above")
    }

    /// Counts `amount` (bytes; for request time, percent-seconds) used by this shard's client
    /// and returns how long it must now wait.
    pub fn record(
        &mut self,
        key: QuotaKey,
        governing: &Governing,
        user: &str,
        client_id: &str,
        amount: f64,
        now: Instant,
    ) -> Duration {
        let window = self.window;
        let (user, client_id) = governing.counted(user, client_id);
        let usage = self.usage(user, client_id);
        usage.rates[slot(key)].record(amount, now, &window);
        usage.unreported[slot(key)] += amount;
        usage.rates[slot(key)].throttle(governing.bound, now, &window)
    }

    /// How long a client must wait before using more, without counting anything.
    pub fn throttle(
        &self,
        key: QuotaKey,
        governing: &Governing,
        user: &str,
        client_id: &str,
        now: Instant,
    ) -> Duration {
        let (user, client_id) = governing.counted(user, client_id);
        self.usage
            .get(user)
            .and_then(|clients| clients.get(client_id))
            .map_or(Duration::ZERO, |usage| {
                usage.rates[slot(key)].throttle(governing.bound, now, &self.window)
            })
    }

    /// Counts what another shard's clients used.
    pub fn record_remote(&mut self, report: &UsageReport, now: Instant) {
        let window = self.window;
        self.usage(&report.user, &report.client_id).rates[slot(report.key)].record(
            report.amount,
            now,
            &window,
        );
    }

    /// What this shard's clients used since the last call, for the other shards; forgets the
    /// usage of names idle for longer than the windows span.
    pub fn take_reports(&mut self, now: Instant) -> Vec<UsageReport> {
        let window = self.window;
        let mut reports = Vec::new();
        for (user, clients) in &mut self.usage {
            for (client_id, usage) in clients.iter_mut() {
                for key in QuotaKey::ALL {
                    let amount = std::mem::take(&mut usage.unreported[slot(key)]);
                    if amount > 0.0 {
                        reports.push(UsageReport {
                            key,
                            user: user.clone(),
                            client_id: client_id.clone(),
                            amount,
                        });
                    }
                }
            }
            clients.retain(|_, usage| !usage.rates.iter().all(|rate| rate.is_idle(now, &window)));
        }
        self.usage.retain(|_, clients| !clients.is_empty());
        reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_coordinator::quotas::QuotaEntity;

    fn record(user: Option<EntityName>, client_id: Option<EntityName>, bound: f64) -> QuotaRecord {
        QuotaRecord {
            entity: QuotaEntity { user, client_id },
            values: BTreeMap::from([(QuotaKey::ProducerByteRate, bound)]),
        }
    }

    fn named(name: &str) -> Option<EntityName> {
        Some(EntityName::Named(name.into()))
    }

    #[test]
    fn the_most_specific_entity_governs() {
        let d = || Some(EntityName::Default);
        let entities = [
            (named("alice"), named("app")),
            (named("alice"), d()),
            (named("alice"), None),
            (d(), named("app")),
            (d(), d()),
            (d(), None),
            (None, named("app")),
            (None, d()),
        ];
        let counted = [
            (true, true),
            (true, true),
            (true, false),
            (true, true),
            (true, true),
            (true, false),
            (false, true),
            (false, true),
        ];
        // With entities of precedence `from` and below stored, the one at `from` governs.
        for from in 0..entities.len() {
            let records = entities[from..]
                .iter()
                .enumerate()
                .map(|(at, (user, client))| {
                    record(user.clone(), client.clone(), (from + at + 1) as f64)
                })
                .collect();
            let book = QuotaBook::new(records);
            let governing = book
                .governing(QuotaKey::ProducerByteRate, "alice", "app")
                .expect("a quota governs");
            assert_eq!(governing.bound, (from + 1) as f64, "precedence {from}");
            assert_eq!(
                (governing.by_user, governing.by_client_id),
                counted[from],
                "precedence {from}"
            );
            assert_eq!(
                book.governing(QuotaKey::ConsumerByteRate, "alice", "app"),
                None
            );
        }
        let book = QuotaBook::new(vec![record(named("alice"), None, 10.0)]);
        assert_eq!(
            book.governing(QuotaKey::ProducerByteRate, "bob", "app"),
            None
        );
    }

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    #[test]
    fn a_new_client_is_paced_from_its_first_request() {
        let window = QuotaWindow::default();
        let start = Instant::now();
        let mut rate = SampledRate::default();
        rate.record(100.0, start, &window);
        // A second's worth at 100 B/s: a second to wait.
        assert_eq!(rate.throttle(100.0, start, &window), Duration::from_secs(1));
        // The span grows with time: half way there, half the wait is left.
        assert_eq!(
            rate.throttle(100.0, at(start, 500), &window),
            Duration::from_millis(500)
        );
        assert_eq!(
            rate.throttle(100.0, at(start, 1000), &window),
            Duration::ZERO
        );
        rate.record(300.0, at(start, 1000), &window);
        assert_eq!(
            rate.throttle(100.0, at(start, 1000), &window),
            Duration::from_secs(3)
        );
        // Past every window, the usage is gone and a new one begins.
        rate.record(50.0, at(start, 20_000), &window);
        assert_eq!(
            rate.throttle(100.0, at(start, 20_000), &window),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn a_client_that_waits_as_told_is_held_to_its_bound() {
        // A client that always has more to send, sends 1000 bytes at a time and waits as
        // told: after a few seconds, its rate is its bound within 2%.
        let window = QuotaWindow::default();
        let start = Instant::now();
        let governing = Governing {
            bound: 10_000.0,
            by_user: true,
            by_client_id: false,
        };
        let mut usage = QuotaUsage::new(window);
        let mut now = start;
        let mut sent = 0.0;
        let mut sent_after_warmup: f64 = 0.0;
        let warmup = Duration::from_secs(5);
        while now < start + Duration::from_secs(80) {
            let wait = usage.record(
                QuotaKey::ProducerByteRate,
                &governing,
                "alice",
                "app",
                1000.0,
                now,
            );
            sent += 1000.0;
            if now >= start + warmup {
                sent_after_warmup += 1000.0;
            }
            now += wait.max(Duration::from_millis(1));
        }
        let rate = sent_after_warmup / 75.0;
        assert!(
            (rate - 10_000.0).abs() < 200.0,
            "held to {rate} B/s against 10000 ({sent} sent in all)"
        );
        let reports = usage.take_reports(now);
        assert_eq!(reports.len(), 1);
        assert_eq!(
            (reports[0].user.as_str(), reports[0].client_id.as_str()),
            ("alice", ""),
            "a user quota counts every client id together"
        );
        assert_eq!(reports[0].amount, sent);
        assert!(usage.take_reports(now).is_empty(), "reported once");
    }

    #[test]
    fn other_shards_usage_counts_and_idle_names_are_forgotten() {
        let window = QuotaWindow::default();
        let start = Instant::now();
        let governing = Governing {
            bound: 100.0,
            by_user: false,
            by_client_id: true,
        };
        let mut usage = QuotaUsage::new(window);
        let key = QuotaKey::ConsumerByteRate;
        assert_eq!(
            usage.throttle(key, &governing, "alice", "app", start),
            Duration::ZERO
        );
        usage.record_remote(
            &UsageReport {
                key,
                user: String::new(),
                client_id: "app".into(),
                amount: 200.0,
            },
            start,
        );
        assert_eq!(
            usage.throttle(key, &governing, "bob", "app", start),
            Duration::from_secs(2),
            "another shard's usage of the same client id counts"
        );
        assert!(
            usage.take_reports(start).is_empty(),
            "remote usage is not reported back"
        );
        assert!(!usage.usage.is_empty());
        let _ = usage.take_reports(start + window.max_throttle());
        assert!(usage.usage.is_empty(), "idle names are forgotten");
    }
}
