//! Host checks and tuning for a Strata broker (`strata tune check`, `strata tune apply`).
//!
//! Architecture invariant: every read of /proc and /sys goes through [`Host`], which joins the
//! path onto a root directory ("/" on a live host, a fixture folder in tests), and the only
//! other fact taken from the live system is the data directory's device number, which
//! [`DataDevice`] lets a test inject. Parsing is pure functions over text ([`parse`]), the
//! checks turn what was read into [`Finding`]s, and nothing here writes except [`apply()`].
//!
//! Fault model: a host that lacks a file (a VM without cpufreq, a container without /sys, a
//! kernel without the knob) yields a finding with status UNKNOWN and `current` saying why;
//! no probe panics or guesses.

mod apply;
mod check;
mod host;
pub mod parse;

pub use apply::{
    ApplyError, Outcome, SYSCTL_TEMPLATE_PATH, SYSTEMD_TEMPLATE_PATH, apply, plan, report,
};
pub use check::{
    HaltPolling, STRATA_TCP_CONGESTION, check, guest_halt_poll_ns, memory_stalls_us,
    process_cpu_seconds, process_open_fds, process_resident_bytes,
};
pub use host::{DataDevice, DevId, Host};

use serde::Serialize;

/// The sysctl drop-in the checks recommend, to install as /etc/sysctl.d/99-strata.conf.
pub const SYSCTL_TEMPLATE: &str = include_str!("../sysctl.d/99-strata.conf");
/// A systemd unit for `strata serve` with the limits the checks recommend.
pub const SYSTEMD_TEMPLATE: &str = include_str!("../systemd/strata.service");

/// How a setting compares with the recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Ok,
    Warn,
    /// The value could not be read; `current` says why.
    Unknown,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Unknown => "UNKNOWN",
        })
    }
}

/// One checked setting. The serialized fields (`setting`, `current`, `recommended`, `why`,
/// `status`) are the stable `--json` format; the fixes are not part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub setting: String,
    pub current: String,
    pub recommended: String,
    pub why: String,
    pub status: Status,
    /// File writes that bring a WARN to the recommendation; empty when it cannot be fixed by
    /// writing /proc or /sys (limits, mount options, hardware).
    #[serde(skip)]
    pub fixes: Vec<Fix>,
    /// For a WARN without fixes: what an operator does instead.
    #[serde(skip)]
    pub manual: Option<String>,
}

impl Finding {
    fn new(
        setting: impl Into<String>,
        current: impl Into<String>,
        recommended: impl Into<String>,
        why: impl Into<String>,
        status: Status,
    ) -> Finding {
        Finding {
            setting: setting.into(),
            current: current.into(),
            recommended: recommended.into(),
            why: why.into(),
            status,
            fixes: Vec::new(),
            manual: None,
        }
    }

    /// A setting whose value could not be read: UNKNOWN, with the reason as its value.
    fn unreadable(
        setting: impl Into<String>,
        reason: impl std::fmt::Display,
        recommended: impl Into<String>,
        why: impl Into<String>,
    ) -> Finding {
        Finding::new(
            setting,
            format!("unreadable: {reason}"),
            recommended,
            why,
            Status::Unknown,
        )
    }

    fn fix(mut self, fix: Fix) -> Finding {
        self.fixes.push(fix);
        self
    }

    fn manual(mut self, how: impl Into<String>) -> Finding {
        self.manual = Some(how.into());
        self
    }
}

/// One write of a value into a /proc or /sys file, with the shell command that does the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fix {
    /// The file as seen on the host ("/proc/sys/vm/swappiness"); [`apply()`] writes it under the
    /// host's root.
    pub path: String,
    pub value: String,
    /// The equivalent shell command, printed by `--dry-run`.
    pub command: String,
}

impl Fix {
    /// A sysctl such as "vm.swappiness": a write under /proc/sys, shown as `sysctl -w`.
    fn sysctl(name: &str, value: impl std::fmt::Display) -> Fix {
        Fix {
            path: sysctl_path(name),
            value: value.to_string(),
            command: if value.to_string().contains(char::is_whitespace) {
                format!("sysctl -w {name}=\"{value}\"")
            } else {
                format!("sysctl -w {name}={value}")
            },
        }
    }

    /// A sysfs attribute, shown as `echo VALUE > PATH`.
    fn sysfs(path: impl Into<String>, value: impl std::fmt::Display) -> Fix {
        let path = path.into();
        Fix {
            command: format!("echo {value} > {path}"),
            path,
            value: value.to_string(),
        }
    }
}

fn sysctl_path(name: &str) -> String {
    format!("/proc/sys/{}", name.replace('.', "/"))
}

/// The findings as an aligned text table; the `why` column comes last and is not padded.
pub fn render_table(findings: &[Finding]) -> String {
    let headers = ["SETTING", "CURRENT", "RECOMMENDED", "STATUS", "WHY"];
    let rows: Vec<[String; 5]> = findings
        .iter()
        .map(|finding| {
            [
                finding.setting.clone(),
                finding.current.clone(),
                finding.recommended.clone(),
                finding.status.to_string(),
                finding.why.clone(),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let headers = headers.map(str::to_string);
    for row in std::iter::once(&headers).chain(&rows) {
        let mut line = String::new();
        for (column, cell) in row.iter().enumerate() {
            if column + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                let pad = widths[column] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
