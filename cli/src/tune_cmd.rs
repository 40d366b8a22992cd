//! `strata tune`: checks the host against Strata's recommendations and applies the fixable
//! ones. The probing and planning live in the strata-tuning crate; this file adds the live
//! io_uring probe (which needs the broker's own io backend) and the output.
//!
//! Exit codes: 0 for a report even when it has WARNs (it is a report, not a gate), 1 when a
//! write of `apply` failed or the output could not be written.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use strata_tuning::{DevId, Finding, Host, Status};

#[derive(Subcommand)]
pub enum TuneCommand {
    /// Read the host's settings and compare each with the recommendation (OK, WARN, UNKNOWN).
    Check {
        #[command(flatten)]
        target: Target,
        /// Print a JSON array of {setting, current, recommended, why, status}.
        #[arg(long)]
        json: bool,
    },
    /// Fix every WARN that a /proc or /sys write can fix (needs root).
    Apply {
        #[command(flatten)]
        target: Target,
        /// Print the equivalent shell commands and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print a template to install: the sysctl.d drop-in or the systemd unit.
    Template { which: Template },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Template {
    /// /etc/sysctl.d/99-strata.conf
    Sysctl,
    /// /etc/systemd/system/strata.service
    Systemd,
}

#[derive(Args)]
pub struct Target {
    /// The broker's data directory: the disk and filesystem checks follow it.
    #[arg(long, default_value = "./strata-data")]
    data_dir: PathBuf,
    /// Check a folder laid out like / (proc/..., sys/...) instead of this host; for captured
    /// hosts and tests. --data-dir is then a path on that host.
    #[arg(long, hide = true, requires = "data_device")]
    root: Option<PathBuf>,
    /// With --root: the data directory's device, MAJOR:MINOR.
    #[arg(long, hide = true, requires = "root", value_parser = parse_dev_id)]
    data_device: Option<DevId>,
}

fn parse_dev_id(text: &str) -> Result<DevId, String> {
    let (major, minor) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not MAJOR:MINOR"))?;
    let number = |part: &str| {
        part.parse::<u32>()
            .map_err(|error| format!("{text:?} is not MAJOR:MINOR: {error}"))
    };
    Ok(DevId {
        major: number(major)?,
        minor: number(minor)?,
    })
}

impl Target {
    fn host(&self) -> (Host, bool) {
        match (&self.root, self.data_device) {
            (Some(root), Some(device)) => (Host::fixture(root, device), false),
            _ => (Host::live(), true),
        }
    }

    fn findings(&self) -> (Host, Vec<Finding>) {
        let (host, live) = self.host();
        let mut findings = strata_tuning::check(&host, &self.data_dir);
        if live {
            // The sysctl says whether io_uring is allowed; only creating a ring says whether
            // this process gets one (seccomp profiles and memlock limits also refuse it).
            let at = findings
                .iter()
                .position(|finding| finding.setting == "kernel.io_uring_disabled")
                .map_or(findings.len(), |index| index + 1);
            findings.insert(at, io_uring_probe());
        }
        (host, findings)
    }
}

fn io_uring_probe() -> Finding {
    let (current, status) = match strata_node::io::uring::probe() {
        Ok(()) => ("ring created".to_string(), Status::Ok),
        Err(error) => {
            let reason = match error.raw_os_error() {
                Some(libc::ENOSYS) => "the kernel has no io_uring",
                Some(libc::EPERM) => "refused (io_uring_disabled or a seccomp profile)",
                Some(libc::ENOMEM) => "cannot lock memory (raise RLIMIT_MEMLOCK)",
                _ => "setup failed",
            };
            (format!("{reason}: {error}"), Status::Warn)
        }
    };
    Finding {
        setting: "io_uring.probe".to_string(),
        current,
        recommended: "ring created".to_string(),
        why: "without a ring the broker falls back to blocking pread/pwrite".to_string(),
        status,
        fixes: Vec::new(),
        manual: Some("see kernel.io_uring_disabled and RLIMIT_MEMLOCK".to_string()),
    }
}

pub fn run(command: TuneCommand) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match command {
        TuneCommand::Check { target, json } => {
            let (_, findings) = target.findings();
            if json {
                // Rendered first so that a closed stdout surfaces as the io::Error that main
                // treats as the reader's choice, not as a serde_json error.
                let text = serde_json::to_string_pretty(&findings)?;
                writeln!(stdout, "{text}")?;
            } else {
                write!(stdout, "{}", strata_tuning::render_table(&findings))?;
                let count = |status| findings.iter().filter(|f| f.status == status).count();
                writeln!(
                    stdout,
                    "\n{} OK, {} WARN, {} UNKNOWN; `strata tune apply --dry-run` shows the fixes",
                    count(Status::Ok),
                    count(Status::Warn),
                    count(Status::Unknown)
                )?;
            }
        }
        TuneCommand::Apply { target, dry_run } => {
            let (host, findings) = target.findings();
            let failed = strata_tuning::report(&host, &findings, dry_run, &mut stdout)
                .context("writing the report")?;
            if failed > 0 {
                bail!(
                    "{failed} change(s) failed (see above; writing /proc/sys and /sys needs root)"
                );
            }
        }
        TuneCommand::Template { which } => stdout.write_all(
            match which {
                Template::Sysctl => strata_tuning::SYSCTL_TEMPLATE,
                Template::Systemd => strata_tuning::SYSTEMD_TEMPLATE,
            }
            .as_bytes(),
        )?,
    }
    stdout.flush()?;
    Ok(())
}
