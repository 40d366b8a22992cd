//! Pure parsers over the text of /proc and /sys files. Nothing here touches the filesystem, so
//! every parser is tested from fixture captures. A parser returns `None` (or skips a line) for
//! text it does not understand instead of guessing: the caller reports the value as unreadable.

use std::collections::BTreeMap;

/// One row of /proc/self/limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub soft: LimitValue,
    pub hard: LimitValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LimitValue {
    Finite(u64),
    Unlimited,
}

impl LimitValue {
    /// True when the limit is at least `floor` (unlimited always is).
    pub fn at_least(self, floor: u64) -> bool {
        match self {
            LimitValue::Unlimited => true,
            LimitValue::Finite(value) => value >= floor,
        }
    }
}

impl std::fmt::Display for LimitValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitValue::Unlimited => f.write_str("unlimited"),
            LimitValue::Finite(value) => write!(f, "{value}"),
        }
    }
}

/// Parses /proc/self/limits into a map from the limit's name ("Max open files") to its values.
///
/// The columns are aligned with spaces and names contain spaces, so a row is split from the
/// right: the units column is optional ("Max nice priority" has none), the two values before it
/// are numbers or "unlimited".
pub fn parse_limits(text: &str) -> BTreeMap<String, Limit> {
    let mut limits = BTreeMap::new();
    for line in text.lines().skip_while(|line| line.starts_with("Limit")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        // Find the first word that is a value: everything before it is the name.
        let Some(first_value) = words
            .iter()
            .position(|word| parse_limit_value(word).is_some())
        else {
            continue;
        };
        let (Some(soft), Some(hard)) = (
            words
                .get(first_value)
                .and_then(|word| parse_limit_value(word)),
            words
                .get(first_value + 1)
                .and_then(|word| parse_limit_value(word)),
        ) else {
            continue;
        };
        let name = words[..first_value].join(" ");
        if !name.is_empty() {
            limits.insert(name, Limit { soft, hard });
        }
    }
    limits
}

fn parse_limit_value(word: &str) -> Option<LimitValue> {
    if word == "unlimited" {
        return Some(LimitValue::Unlimited);
    }
    word.parse().ok().map(LimitValue::Finite)
}

/// One line of /proc/self/mountinfo (proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The st_dev of files on this mount, "major:minor".
    pub device: String,
    pub mount_point: String,
    /// Per-mount options (field 6) followed by the filesystem's super options: `discard` is a
    /// super option on ext4, `noatime` a per-mount one, and the checks want both.
    pub options: Vec<String>,
    pub fs_type: String,
    pub source: String,
}

/// Parses /proc/self/mountinfo. Lines that do not have the documented shape are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_mountinfo_line).collect()
}

fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue": the
    // optional fields end at a lone "-".
    let (before, after) = line.split_once(" - ")?;
    let before: Vec<&str> = before.split_whitespace().collect();
    let after: Vec<&str> = after.split_whitespace().collect();
    let device = before.get(2)?;
    let mount_point = before.get(4)?;
    let mount_options = before.get(5)?;
    let fs_type = after.first()?;
    let source = after.get(1).copied().unwrap_or("");
    let super_options = after.get(2).copied().unwrap_or("");
    let options = mount_options
        .split(',')
        .chain(super_options.split(','))
        .filter(|option| !option.is_empty())
        .map(str::to_string)
        .collect();
    Some(Mount {
        device: device.to_string(),
        mount_point: unescape_octal(mount_point),
        options,
        fs_type: fs_type.to_string(),
        source: unescape_octal(source),
    })
}

/// mountinfo escapes space, tab, newline and backslash in paths as `\ooo` octal.
fn unescape_octal(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\' && index + 3 < bytes.len() {
            let digits = std::str::from_utf8(&bytes[index + 1..index + 4]).unwrap_or("");
            if let Ok(value) = u8::from_str_radix(digits, 8) {
                out.push(value);
                index += 4;
                continue;
            }
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount that holds `path`: the one with the longest mount point that is a path prefix of
/// it (component-wise: /data does not hold /database). Later lines win ties, because a later
/// mount over the same point hides the earlier one.
pub fn mount_for<'a>(mounts: &'a [Mount], path: &str) -> Option<&'a Mount> {
    let mut best: Option<&Mount> = None;
    for mount in mounts {
        let point = mount.mount_point.trim_end_matches('/');
        let holds = point.is_empty()
            || path == point
            || path
                .strip_prefix(point)
                .is_some_and(|rest| rest.starts_with('/'));
        if holds && best.is_none_or(|best| mount.mount_point.len() >= best.mount_point.len()) {
            best = Some(mount);
        }
    }
    best
}

/// A sysfs choice list such as a block queue's scheduler or THP's `enabled`: the active choice
/// is the one in [brackets]. Returns the active one and all choices.
pub fn scheduler(text: &str) -> Option<(String, Vec<String>)> {
    let mut active = None;
    let mut choices = Vec::new();
    for word in text.split_whitespace() {
        match word
            .strip_prefix('[')
            .and_then(|word| word.strip_suffix(']'))
        {
            Some(inner) => {
                active = Some(inner.to_string());
                choices.push(inner.to_string());
            }
            None => choices.push(word.to_string()),
        }
    }
    active.map(|active| (active, choices))
}

/// Parses a kernel CPU list such as "0-3,8,10-11" (cpuset(7) "list format").
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    let mut cpus = Vec::new();
    if text.is_empty() {
        return Some(cpus);
    }
    for part in text.split(',') {
        match part.split_once('-') {
            Some((first, last)) => {
                let first: u32 = first.trim().parse().ok()?;
                let last: u32 = last.trim().parse().ok()?;
                if last < first {
                    return None;
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Formats CPUs back into list format ("0-3,8").
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut index = 0;
    while index < cpus.len() {
        let first = cpus[index];
        let mut last = first;
        while index + 1 < cpus.len() && cpus[index + 1] == last + 1 {
            index += 1;
            last = cpus[index];
        }
        parts.push(if first == last {
            first.to_string()
        } else {
            format!("{first}-{last}")
        });
        index += 1;
    }
    parts.join(",")
}

/// One numbered IRQ line of /proc/interrupts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqLine {
    pub irq: u32,
    /// Interrupts taken on each CPU, in the header's column order.
    pub counts: Vec<u64>,
    /// The action names at the end of the line; shared IRQs list several ("a, b").
    pub names: Vec<String>,
}

/// Parses /proc/interrupts: the header names the CPU columns, numbered lines are device IRQs
/// (architecture lines such as "LOC:" are skipped, they belong to no device).
pub fn parse_interrupts(text: &str) -> Vec<IrqLine> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cpu_count = header
        .split_whitespace()
        .filter(|word| word.starts_with("CPU"))
        .count();
    let mut irqs = Vec::new();
    for line in lines {
        let Some((irq, rest)) = line.trim_start().split_once(':') else {
            continue;
        };
        let Ok(irq) = irq.parse::<u32>() else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        if words.len() < cpu_count {
            continue;
        }
        let Ok(counts) = words[..cpu_count]
            .iter()
            .map(|word| word.parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
        else {
            continue;
        };
        // After the counts come the chip name and hardware IRQ, then the actions. Only the
        // last word is surely an action; shared IRQs put ", " between theirs.
        let tail = &words[cpu_count..];
        let mut names = Vec::new();
        if let Some(last) = tail.last() {
            names.push(last.to_string());
            for word in tail.iter().rev().skip(1) {
                match word.strip_suffix(',') {
                    Some(name) => names.insert(0, name.to_string()),
                    None => break,
                }
            }
        }
        irqs.push(IrqLine { irq, counts, names });
    }
    irqs
}

/// The device an IRQ action belongs to, for the device families whose spread over CPUs matters
/// (NVMe, virtio, Mellanox, ethN), or `None`. Queue suffixes are dropped so that all of a
/// device's queues group together: "nvme0q3" → "nvme0", "virtio1-req.0" → "virtio1",
/// "mlx5_comp0@pci:0000:3b:00.0" → "mlx5@pci:0000:3b:00.0", "eth0-TxRx-1" → "eth0".
/// Config, admin and async interrupts are not data-path queues and are skipped.
pub fn irq_device(name: &str) -> Option<String> {
    if name.ends_with("-config") {
        return None;
    }
    if let Some(rest) = name.strip_prefix("nvme") {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let queue = rest[digits.len()..].strip_prefix('q')?;
        // q0 is the admin queue: it carries no IO.
        if digits.is_empty() || queue == "0" {
            return None;
        }
        return Some(format!("nvme{digits}"));
    }
    if name.starts_with("virtio") || name.starts_with("eth") {
        let device = name.split('-').next().unwrap_or(name);
        return Some(device.to_string());
    }
    if name.starts_with("mlx") {
        // Only completion vectors carry traffic; mlx5_async and friends are control.
        if !name.contains("_comp") {
            return None;
        }
        let driver: String = name
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        return Some(match name.split_once('@') {
            Some((_, bus)) => format!("{driver}@{bus}"),
            None => driver,
        });
    }
    None
}

/// `KEY=value` lines, as in a sysfs `uevent` file.
pub fn parse_uevent(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// The leading "major.minor" of a kernel release such as "6.8.0-45-generic".
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Linux's encoding of a 64-bit dev_t (glibc's gnu_dev_major/gnu_dev_minor), so the data
/// directory's device is found without libc.
pub fn dev_major_minor(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_rows_with_and_without_units() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max open files            1024                 524288               files     \n\
                    Max locked memory         unlimited            unlimited            bytes     \n\
                    Max nice priority         0                    0                    \n";
        let limits = parse_limits(text);
        assert_eq!(
            limits["Max open files"],
            Limit {
                soft: LimitValue::Finite(1024),
                hard: LimitValue::Finite(524288)
            }
        );
        assert_eq!(limits["Max locked memory"].soft, LimitValue::Unlimited);
        assert_eq!(limits["Max nice priority"].hard, LimitValue::Finite(0));
        assert_eq!(limits.len(), 3);
    }

    #[test]
    fn mountinfo_escapes_and_longest_prefix() {
        let text = "27 1 259:2 / / rw,relatime - ext4 /dev/nvme0n1p2 rw\n\
                    30 27 259:1 / /var/lib/strata rw,noatime - xfs /dev/nvme0n1p1 rw,attr2,discard\n\
                    31 27 0:40 / /var/lib/strata\\040old rw - tmpfs tmpfs rw\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[2].mount_point, "/var/lib/strata old");
        let mount = mount_for(&mounts, "/var/lib/strata/orders-0").expect("a mount");
        assert_eq!(mount.fs_type, "xfs");
        assert!(mount.options.iter().any(|o| o == "noatime"));
        assert!(mount.options.iter().any(|o| o == "discard"));
        // A sibling whose name merely starts the same is on the root mount.
        assert_eq!(
            mount_for(&mounts, "/var/lib/strataX")
                .expect("a mount")
                .fs_type,
            "ext4"
        );
        assert_eq!(mount_for(&mounts, "/").expect("a mount").fs_type, "ext4");
    }

    #[test]
    fn bracketed_choice() {
        assert_eq!(
            scheduler("[none] mq-deadline kyber\n"),
            Some((
                "none".to_string(),
                vec!["none".into(), "mq-deadline".into(), "kyber".into()]
            ))
        );
        assert_eq!(
            scheduler("always defer defer+madvise [madvise] never")
                .map(|(active, _)| active)
                .as_deref(),
            Some("madvise")
        );
        assert_eq!(scheduler("none"), None);
    }

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn interrupts_lines_and_devices() {
        let text = "           CPU0       CPU1\n\
                    \x20 16:          3          0  IO-APIC  16-fasteoi   ehci_hcd:usb1, uhci_hcd:usb3\n\
                    \x20 36:          0    3870176 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n\
                    NMI:          0          0   Non-maskable interrupts\n";
        let irqs = parse_interrupts(text);
        assert_eq!(irqs.len(), 2);
        assert_eq!(irqs[0].names, vec!["ehci_hcd:usb1", "uhci_hcd:usb3"]);
        assert_eq!(irqs[1].counts, vec![0, 3870176]);
        assert_eq!(irq_device("virtio1-req.0").as_deref(), Some("virtio1"));
        assert_eq!(irq_device("virtio1-config"), None);
        assert_eq!(irq_device("nvme0q3").as_deref(), Some("nvme0"));
        assert_eq!(irq_device("nvme0q0"), None);
        assert_eq!(
            irq_device("mlx5_comp0@pci:0000:3b:00.0").as_deref(),
            Some("mlx5@pci:0000:3b:00.0")
        );
        assert_eq!(irq_device("mlx5_async@pci:0000:3b:00.0"), None);
        assert_eq!(irq_device("eth0-TxRx-1").as_deref(), Some("eth0"));
        assert_eq!(irq_device("ttyS0"), None);
    }

    #[test]
    fn versions_and_devices() {
        assert_eq!(kernel_version("6.8.0-45-generic\n"), Some((6, 8)));
        assert_eq!(
            kernel_version("5.15.153.1-microsoft-standard-WSL2"),
            Some((5, 15))
        );
        assert_eq!(kernel_version("garbage"), None);
        // 0xfe00 is 254:0 (virtio-blk's vda); 259:65536 exercises the high minor bits.
        assert_eq!(dev_major_minor(0xfe00), (254, 0));
        let dev = (259u64 << 8) | ((65536u64 & !0xff) << 12);
        assert_eq!(dev_major_minor(dev), (259, 65536));
    }
}
