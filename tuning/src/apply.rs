//! `strata tune apply`: the fixes of the WARN findings, printed (dry run) or written. A failed
//! write is reported and the next one is still tried: stopping halfway would leave the host
//! partly tuned without saying which part.

use std::io::Write;

use crate::host::Host;
use crate::{Finding, Fix, Status};

/// Why a fix could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Opening or writing the /proc or /sys file failed: usually not root (EACCES), or a
    /// value the kernel refuses (EINVAL, e.g. nr_requests above the device's maximum).
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        path: String,
        value: String,
        source: std::io::Error,
    },
}

/// What happened to one fix.
#[derive(Debug)]
pub struct Outcome {
    pub fix: Fix,
    pub result: Result<(), ApplyError>,
}

/// The fixes for every WARN that can be fixed by a file write, in finding order.
pub fn plan(findings: &[Finding]) -> Vec<Fix> {
    findings
        .iter()
        .filter(|finding| finding.status == Status::Warn)
        .flat_map(|finding| finding.fixes.iter().cloned())
        .collect()
}

/// Writes every fix under the host's root, one outcome per fix, continuing after failures.
pub fn apply(host: &Host, fixes: &[Fix]) -> Vec<Outcome> {
    fixes
        .iter()
        .map(|fix| Outcome {
            fix: fix.clone(),
            result: write(host, fix),
        })
        .collect()
}

fn write(host: &Host, fix: &Fix) -> Result<(), ApplyError> {
    let error = |source| ApplyError::Write {
        path: fix.path.clone(),
        value: fix.value.clone(),
        source,
    };
    // Never create: a missing knob must fail loudly, not become a stray file.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(host.path(&fix.path))
        .map_err(error)?;
    // One write(2) with the whole value: sysfs and procfs parse each write on its own.
    file.write_all(format!("{}\n", fix.value).as_bytes())
        .map_err(error)
}

/// Where the templates live in the source tree (they are also compiled into the binary).
pub const SYSCTL_TEMPLATE_PATH: &str = "tuning/sysctl.d/99-strata.conf";
pub const SYSTEMD_TEMPLATE_PATH: &str = "tuning/systemd/strata.service";

/// `strata tune apply`: prints the fixes for `findings` as shell commands (`dry_run`) or writes
/// them and prints each outcome, then the WARNs it cannot fix and how to persist the settings.
/// Everything but the commands is a `#` comment, so a dry run's output is a shell script.
/// Returns how many writes failed (always 0 for a dry run, which writes nothing).
pub fn report(
    host: &Host,
    findings: &[Finding],
    dry_run: bool,
    out: &mut dyn Write,
) -> std::io::Result<usize> {
    let fixes = plan(findings);
    let mut failed = 0;
    if fixes.is_empty() {
        writeln!(out, "# nothing to change: no fixable WARN")?;
    } else if dry_run {
        writeln!(
            out,
            "# {} change(s); run `strata tune apply` as root to make them:",
            fixes.len()
        )?;
        for fix in &fixes {
            writeln!(out, "{}", fix.command)?;
        }
    } else {
        for outcome in apply(host, &fixes) {
            match &outcome.result {
                Ok(()) => writeln!(out, "# ok      {}", outcome.fix.command)?,
                Err(error) => {
                    failed += 1;
                    writeln!(out, "# FAILED  {}: {error}", outcome.fix.command)?;
                }
            }
        }
        writeln!(
            out,
            "# {} of {} change(s) applied",
            fixes.len() - failed,
            fixes.len()
        )?;
    }
    let manual: Vec<&Finding> = findings
        .iter()
        .filter(|finding| finding.status == Status::Warn && finding.fixes.is_empty())
        .collect();
    if !manual.is_empty() {
        writeln!(out, "#\n# not changed by apply:")?;
        for finding in manual {
            let how = finding.manual.as_deref().unwrap_or("no automatic fix");
            writeln!(out, "#   {} = {}: {how}", finding.setting, finding.current)?;
        }
    }
    writeln!(
        out,
        "#\n# These writes last until reboot. To keep them, install the templates from the Strata\n\
         # source tree (or print them with `strata tune template sysctl|systemd`):\n\
         #   sudo install -m 0644 {SYSCTL_TEMPLATE_PATH} /etc/sysctl.d/99-strata.conf && sudo sysctl --system\n\
         #   sudo install -m 0644 {SYSTEMD_TEMPLATE_PATH} /etc/systemd/system/strata.service && sudo systemctl daemon-reload\n\
         # The sysfs settings (governor, transparent huge pages, block queue) have no sysctl.d:\n\
         # rerun `strata tune apply` at boot, e.g. the unit's commented ExecStartPre=+ line."
    )?;
    Ok(failed)
}
