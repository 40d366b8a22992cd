//! The `strata` command line (DESIGN §9): the broker (`serve`), client commands (`topic`,
//! `produce`, `consume`, `cluster`), the partition log's operator tools (`log`) and the host
//! checks (`tune`).
//!
//! Exit codes: 0 success, 1 error with a one-line reason on stderr, 2 usage.

/// `println!` that returns the write's error instead of panicking: a closed stdout (`strata
/// topic list | head -1`) ends the command quietly (see `main`) rather than with a panic.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)?;
    }};
}

mod bench_cmd;
mod client_cmd;
mod cluster_config_cmd;
mod group_config_cmd;
mod group_reset;
mod log_tools;
mod quota_cmd;
#[cfg(test)]
mod reference;
mod security_cmd;
mod serve;
mod share_cmd;
mod tune_cmd;
mod txn_cmd;
mod units;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use strata_node::io::{self, Backend};
use strata_node::log::{DirectWrites, FlushPolicy, LogConfig};
use strata_node::server::security::SecurityProtocol;

#[derive(Parser)]
#[command(name = "strata", version, about = "Strata: a distributed commit log")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker.
    Serve(serve::ServeArgs),
    /// Create, list, describe and delete topics.
    Topic {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: client_cmd::TopicCommand,
    },
    /// Produce records read from stdin, one per line.
    Produce {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: client_cmd::ProduceArgs,
    },
    /// Consume records and print them.
    Consume {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: client_cmd::ConsumeArgs,
    },
    /// Load a cluster and measure throughput and latency (HDR histograms, open loop), or what
    /// many partitions cost it at rest and how soon it serves after a restart.
    Bench {
        #[command(flatten)]
        connection: Connection,
        #[command(flatten)]
        args: bench_cmd::BenchArgs,
    },
    /// Consumer groups: list them, describe members, offsets and lag.
    Group {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: client_cmd::GroupCommand,
    },
    /// SCRAM users: create (or set a password), delete, list.
    User {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: security_cmd::UserCommand,
    },
    /// ACLs: add, remove, list (checked with `strata serve --authorizer acl`).
    Acl {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: security_cmd::AclCommand,
    },
    /// Client quotas: set, remove, list (produce and fetch byte rates, request time).
    Quota {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: quota_cmd::QuotaCommand,
    },
    /// Transactions: the transactional ids coordinators hold, and one id's transaction.
    Txn {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: txn_cmd::TxnCommand,
    },
    /// Cluster-wide information.
    Cluster {
        #[command(flatten)]
        connection: Connection,
        #[command(subcommand)]
        command: client_cmd::ClusterCommand,
    },
    /// Measure the disk under a data directory through io_uring and write the io-properties
    /// file `strata serve` reads (write size, writes in flight, group-commit window).
    Iotune {
        #[arg(long)]
        data_dir: PathBuf,
        /// How long to measure, e.g. 30s, 500ms or 10 (seconds).
        #[arg(long, default_value = "30s", value_parser = units::parse_duration)]
        duration: std::time::Duration,
        /// Where to write (default: DATA_DIR/io-properties.toml).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Inspect and exercise partition logs on disk.
    Log {
        #[command(subcommand)]
        command: LogCommand,
    },
    /// Check the host's kernel, limits, disk and network settings; apply the fixable ones.
    Tune {
        #[command(subcommand)]
        command: tune_cmd::TuneCommand,
    },
}

/// Where client commands connect, and as whom.
#[derive(Args, Clone)]
pub struct Connection {
    /// Brokers to bootstrap from, `[SCHEME://]HOST:PORT[,...]` with SCHEME one of plaintext
    /// (the default), ssl, sasl_plaintext, sasl_ssl, as the broker's --listen.
    #[arg(
        long,
        global = true,
        env = "STRATA_BOOTSTRAP",
        default_value = "127.0.0.1:7300"
    )]
    pub bootstrap: String,
    /// PEM CA the brokers' certificates must chain to (ssl, sasl_ssl; default: none, needed
    /// by those).
    #[arg(long = "tls-ca", global = true, env = "STRATA_CLIENT_TLS_CA")]
    pub client_tls_ca: Option<PathBuf>,
    /// PEM client certificate to present to brokers that ask for one (with --tls-key; default:
    /// none).
    #[arg(
        long = "tls-cert",
        global = true,
        env = "STRATA_CLIENT_TLS_CERT",
        requires = "client_tls_key"
    )]
    pub client_tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (default: none).
    #[arg(
        long = "tls-key",
        global = true,
        env = "STRATA_CLIENT_TLS_KEY",
        requires = "client_tls_cert"
    )]
    pub client_tls_key: Option<PathBuf>,
    /// SASL mechanism (sasl_plaintext, sasl_ssl): SCRAM-SHA-512 (the default), SCRAM-SHA-256,
    /// PLAIN.
    #[arg(long, global = true, env = "STRATA_SASL_MECHANISM")]
    pub sasl_mechanism: Option<String>,
    /// SASL user, needed by sasl_* listeners (default: none); the password comes from
    /// STRATA_PASSWORD or --password-file.
    #[arg(long, global = true, env = "STRATA_USER")]
    pub user: Option<String>,
    /// A file holding the SASL password, its first line (default: STRATA_PASSWORD).
    #[arg(long, global = true, env = "STRATA_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
    /// TCP congestion control of the connections to brokers (default cubic; `system`: the
    /// host's default), as `strata serve --tcp-congestion`.
    #[arg(long, global = true, env = "STRATA_TCP_CONGESTION")]
    pub tcp_congestion: Option<String>,
}

impl Connection {
    /// The client settings these flags ask for; a refusal says which flag is missing.
    pub fn client_config(&self) -> anyhow::Result<strata_client::ClientConfig> {
        let (protocol, addresses) = self.bootstrap_addresses()?;
        Ok(strata_client::ClientConfig {
            tcp_congestion: self.tcp_congestion(None),
            security: self.security(protocol)?,
            ..strata_client::ClientConfig::new(addresses)
        })
    }

    /// `--bootstrap` without its scheme, and the scheme's security protocol (one for all).
    pub fn bootstrap_addresses(&self) -> anyhow::Result<(SecurityProtocol, String)> {
        let mut protocol = None;
        let mut addresses = Vec::new();
        for part in self
            .bootstrap
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (scheme, address) = match part.split_once("://") {
                Some((scheme, address)) => (
                    scheme
                        .parse::<SecurityProtocol>()
                        .map_err(|why| anyhow::anyhow!("--bootstrap: {why}"))?,
                    address,
                ),
                None => (SecurityProtocol::Plaintext, part),
            };
            anyhow::ensure!(
                protocol.is_none_or(|known| known == scheme),
                "--bootstrap names two security protocols"
            );
            protocol = Some(scheme);
            addresses.push(address.to_string());
        }
        Ok((
            protocol.unwrap_or(SecurityProtocol::Plaintext),
            addresses.join(","),
        ))
    }

    /// TLS and SASL as `protocol` and the flags ask for.
    fn security(&self, protocol: SecurityProtocol) -> anyhow::Result<strata_client::Security> {
        let mut security = strata_client::Security::default();
        if protocol.uses_tls() {
            let ca = self.client_tls_ca.as_deref().ok_or_else(|| {
                anyhow::anyhow!(
                    "{protocol} needs --tls-ca (the CA the brokers' certificates chain to)"
                )
            })?;
            let client = self
                .client_tls_cert
                .as_deref()
                .zip(self.client_tls_key.as_deref());
            security.tls = Some(strata_client::tls_config(ca, client)?);
        }
        if protocol.uses_sasl() {
            let user = self.user.clone().ok_or_else(|| {
                anyhow::anyhow!("{protocol} needs --user (and STRATA_PASSWORD or --password-file)")
            })?;
            let password = match (&self.password_file, std::env::var("STRATA_PASSWORD")) {
                (Some(path), _) => std::fs::read_to_string(path)
                    .with_context(|| format!("reading --password-file {}", path.display()))?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
                (None, Ok(password)) => password,
                (None, Err(_)) => {
                    anyhow::bail!("{protocol} needs a password: STRATA_PASSWORD or --password-file")
                }
            };
            anyhow::ensure!(!password.is_empty(), "the SASL password is empty");
            security.sasl = Some(strata_client::SaslCredentials {
                mechanism: self
                    .sasl_mechanism
                    .clone()
                    .unwrap_or_else(|| "SCRAM-SHA-512".to_string()),
                user,
                password,
            });
        }
        Ok(security)
    }

    /// `--tcp-congestion` (or `file`'s) as the client takes it: `None` for the host's default.
    pub fn tcp_congestion(&self, file: Option<&str>) -> Option<String> {
        strata_client::parse_tcp_congestion(
            self.tcp_congestion
                .as_deref()
                .or(file)
                .unwrap_or(strata_client::DEFAULT_TCP_CONGESTION),
        )
    }
}

#[derive(Subcommand)]
enum LogCommand {
    /// Print every batch of a partition folder (after recovery), like kafka-dump-log.
    Dump {
        /// The partition folder, e.g. DATA_DIR/orders-0.
        dir: PathBuf,
        /// Print each record too.
        #[arg(long)]
        records: bool,
    },
    /// Append batches from several concurrent producers until killed, printing `ACK <base>
    /// <last>` after each acknowledged append. Crash tests SIGKILL it and check the log.
    Stress {
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t = Flush::Always)]
        flush: Flush,
        #[arg(long, default_value_t = 4)]
        producers: u32,
        #[arg(long, default_value_t = 16)]
        records_per_batch: usize,
        #[arg(long, default_value_t = 256)]
        value_bytes: usize,
        #[arg(long, default_value_t = 64 * 1024)]
        segment_bytes: u64,
        /// Stop after this many appends (0 = run until killed).
        #[arg(long, default_value_t = 0)]
        appends: u64,
        /// Send appends past the page cache (the topic setting `direct.writes=always`).
        #[arg(long)]
        direct: bool,
        /// With `--direct`: the smallest append that goes direct.
        #[arg(long, default_value_t = strata_node::log::DIRECT_WRITE_MIN_BYTES)]
        direct_min_bytes: u64,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Flush {
    Always,
    Interval,
    Never,
}

fn main() {
    let allocator_tuned = strata_node::memory::keep_freed_buffers();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STRATA_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if !allocator_tuned {
        tracing::debug!("the allocator did not take strata's settings; batch buffers may fault");
    }
    let cli = Cli::parse();
    if let Err(error) = run(cli) {
        // A closed stdout (`strata log dump | head`) is the reader's choice, not an error.
        let broken_pipe = error
            .chain()
            .filter_map(|cause| cause.downcast_ref::<std::io::Error>())
            .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe);
        if broken_pipe {
            return;
        }
        eprintln!("strata: {error:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Topic {
            connection,
            command,
        } => client_cmd::runtime()?.block_on(client_cmd::topic(connection, command)),
        Command::Produce { connection, args } => {
            client_cmd::runtime()?.block_on(client_cmd::produce(connection, args))
        }
        Command::Consume { connection, args } => {
            client_cmd::runtime()?.block_on(client_cmd::consume(connection, args))
        }
        Command::Cluster {
            connection,
            command,
        } => client_cmd::runtime()?.block_on(client_cmd::cluster(connection, command)),
        Command::Group {
            connection,
            command,
        } => client_cmd::runtime()?.block_on(client_cmd::group(connection, command)),
        Command::User {
            connection,
            command,
        } => client_cmd::runtime()?.block_on(security_cmd::user(connection, command)),
        Command::Acl {
            connection,
            command,
        } => client_cmd::runtime()?.block_on(security_cmd::acl(connection, command)),
        Command::Quota {
            connection,
            command,
        } => client_cmd::runtime()?.block_on(quota_cmd::quota(connection, command)),
        Command::Txn {
            connection,
            command,
        } => client_cmd::runtime()?.block_on(txn_cmd::txn(connection, command)),
        Command::Bench { connection, args } => {
            client_cmd::runtime()?.block_on(bench_cmd::bench(connection, args))
        }
        Command::Iotune {
            data_dir,
            duration,
            out,
        } => iotune(data_dir, duration, out),
        Command::Tune { command } => tune_cmd::run(command),
        Command::Log { command } => match command {
            LogCommand::Dump { dir, records } => io::run_on(&Backend::detect(), |storage| {
                log_tools::dump(storage, dir, records)
            }),
            LogCommand::Stress {
                dir,
                flush,
                producers,
                records_per_batch,
                value_bytes,
                segment_bytes,
                appends,
                direct,
                direct_min_bytes,
            } => {
                let config = LogConfig {
                    segment_bytes,
                    direct_writes: if direct {
                        DirectWrites::Always
                    } else {
                        DirectWrites::Never
                    },
                    direct_write_min_bytes: direct_min_bytes,
                    flush: match flush {
                        Flush::Always => FlushPolicy::Always,
                        Flush::Interval => FlushPolicy::Interval { interval_ms: 5 },
                        Flush::Never => FlushPolicy::Never,
                    },
                    ..LogConfig::default()
                };
                io::run_on(&Backend::detect(), |storage| {
                    log_tools::stress(
                        storage,
                        dir,
                        config,
                        producers,
                        records_per_batch,
                        value_bytes,
                        appends,
                    )
                })
            }
        },
    }
}

/// `strata iotune`: measures the disk under `data_dir` and writes the io-properties file.
fn iotune(
    data_dir: PathBuf,
    duration: std::time::Duration,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    // A progress line on a terminal (`\r`-rewritten), nothing otherwise.
    let show_progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let on_progress = |done: f64, phase: Option<&str>| {
        if !show_progress {
            return;
        }
        let bar = strata_bench::progress_bar(done, 30);
        match phase {
            Some(name) => eprint!("\r{bar} {name:<40}"),
            None => eprintln!("\r{bar} done{:<40}", ""),
        }
        let _ = std::io::Write::flush(&mut std::io::stderr());
    };
    let properties = strata_node::iotune::measure(&data_dir, duration, &on_progress)
        .map_err(|error| anyhow::anyhow!("measuring {}: {error}", data_dir.display()))?;
    let out = out.unwrap_or_else(|| data_dir.join(strata_node::iotune::IO_PROPERTIES_FILE));
    strata_node::iotune::write(&properties, &out)
        .map_err(|error| anyhow::anyhow!("writing {}: {error}", out.display()))?;
    let (measured, chosen) = (&properties.measured, &properties.chosen);
    let by_key = |map: &std::collections::BTreeMap<String, f64>, unit: fn(u64) -> String| {
        let mut points: Vec<(u64, f64)> = map
            .iter()
            .filter_map(|(k, v)| Some((k.parse().ok()?, *v)))
            .collect();
        points.sort_unstable_by_key(|(k, _)| *k);
        points
            .iter()
            .map(|(k, v)| format!("{}: {v:.0}", unit(*k)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!(
        "direct IO: {}\nwrite MB/s by size: {}\nbuffered write MB/s by size: {}\nwrite MB/s by writes in flight: {}\nsynced-write MB/s by files at once: {}\nfdatasync µs: p50 {} p99 {} max {} ({} syncs)\nread MB/s: {:.0}",
        measured.direct_io,
        by_key(&measured.write_mb_per_s_by_size, |bytes| format!(
            "{} KiB",
            bytes >> 10
        )),
        by_key(&measured.buffered_write_mb_per_s_by_size, |bytes| format!(
            "{} KiB",
            bytes >> 10
        )),
        by_key(&measured.write_mb_per_s_by_queue_depth, |depth| depth
            .to_string()),
        by_key(&measured.synced_mb_per_s_by_files, |files| files
            .to_string()),
        measured.fdatasync_us_p50,
        measured.fdatasync_us_p99,
        measured.fdatasync_us_max,
        measured.fdatasync_count,
        measured.read_mb_per_s
    );
    outln!(
        "chosen: write {} B, {} writes in flight, group-commit window {} µs\nwrote {}",
        chosen.write_bytes,
        chosen.writes_in_flight,
        chosen.group_commit_window_us,
        out.display()
    );
    Ok(())
}
