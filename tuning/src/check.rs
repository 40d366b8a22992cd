//! The checks: each reads a few host files, compares them with Strata's recommendation and
//! returns findings. A value that cannot be read becomes UNKNOWN with the reason, never a
//! guess; a WARN carries the file writes that fix it when /proc or /sys can.

use std::collections::BTreeMap;
use std::path::Path;

use crate::host::Host;
use crate::parse;
use crate::{Finding, Fix, Status};

const MEMLOCK_BYTES_MIN: u64 = 64 << 20;
const NOFILE_MIN: u64 = 1_048_576;
/// The broker asks for 4 MiB UDP socket buffers for QUIC replication; the kernel silently caps
/// the request at rmem_max/wmem_max.
const SOCKET_BUFFER_BYTES_MIN: u64 = 4 << 20;
const SOMAXCONN_MIN: u64 = 4096;
const NR_REQUESTS_MIN: u64 = 256;
/// tokio-uring and the opcodes the storage runtime uses need 5.10 or later.
const KERNEL_MIN: (u32, u32) = (5, 10);

/// Checks `host` with the broker's data directory at `data_dir`.
pub fn check(host: &Host, data_dir: &Path) -> Vec<Finding> {
    let mut findings = Vec::new();
    findings.extend(kernel(host));
    findings.extend(limits(host));
    findings.extend(cpus(host));
    findings.extend(transparent_huge_pages(host));
    findings.extend(sysctls(host));
    findings.push(tcp_congestion(host));
    findings.extend(irqs(host));
    findings.extend(storage(host, data_dir));
    findings.push(clocksource(host));
    findings.push(guest_halt_polling(host));
    findings.push(free_page_reporting(host));
    findings
}

fn kernel(host: &Host) -> Vec<Finding> {
    let release = host.read("/proc/sys/kernel/osrelease");
    let version = release.as_deref().ok().and_then(parse::kernel_version);
    let kernel_why = "io_uring with the opcodes Strata uses";
    let kernel = match (&release, version) {
        (Err(reason), _) => Finding::unreadable("kernel", reason, "≥ 5.10", kernel_why),
        (Ok(release), None) => Finding::unreadable(
            "kernel",
            format!("unparsable release {release:?}"),
            "≥ 5.10",
            kernel_why,
        ),
        (Ok(release), Some(version)) => {
            let status = if version >= KERNEL_MIN {
                Status::Ok
            } else {
                Status::Warn
            };
            Finding::new("kernel", release, "≥ 5.10", kernel_why, status)
                .manual("upgrade the kernel")
        }
    };
    let setting = "kernel.io_uring_disabled";
    let why = "Strata's storage runs on io_uring; 1 or 2 forces the slower blocking fallback";
    let io_uring = match host.read("/proc/sys/kernel/io_uring_disabled") {
        Ok(value) if value == "0" => Finding::new(setting, value, "0", why, Status::Ok),
        Ok(value) => Finding::new(setting, value, "0", why, Status::Warn)
            .fix(Fix::sysctl("kernel.io_uring_disabled", 0)),
        // The switch arrived in 6.6; before it io_uring is always on.
        Err(_) if version.is_some_and(|version| version < (6, 6)) => Finding::new(
            setting,
            "absent (kernel < 6.6: always enabled)",
            "0",
            why,
            Status::Ok,
        ),
        Err(reason) => Finding::unreadable(setting, reason, "0", why),
    };
    vec![kernel, io_uring]
}

fn limits(host: &Host) -> Vec<Finding> {
    let checks = [
        (
            "RLIMIT_MEMLOCK",
            "Max locked memory",
            MEMLOCK_BYTES_MIN,
            "≥ 67108864 (64 MiB) or unlimited",
            "io_uring rings and registered buffers are locked memory (this process's limit; the broker's comes from its unit)",
            "LimitMEMLOCK=infinity in the systemd unit (or memlock in limits.conf)",
        ),
        (
            "RLIMIT_NOFILE",
            "Max open files",
            NOFILE_MIN,
            "≥ 1048576",
            "every partition keeps segment and index files open, plus one per client socket (this process's limit; the broker's comes from its unit)",
            "LimitNOFILE=1048576 in the systemd unit (or nofile in limits.conf)",
        ),
    ];
    let text = host.read("/proc/self/limits");
    let limits = text.as_deref().map(parse::parse_limits);
    checks
        .into_iter()
        .map(|(setting, row, floor, recommended, why, manual)| {
            let limit = match &limits {
                Err(reason) => return Finding::unreadable(setting, reason, recommended, why),
                Ok(limits) => limits.get(row),
            };
            let Some(limit) = limit else {
                return Finding::unreadable(
                    setting,
                    format!("no {row:?} row in /proc/self/limits"),
                    recommended,
                    why,
                );
            };
            let current = format!("{} (hard {})", limit.soft, limit.hard);
            let status = if limit.soft.at_least(floor) {
                Status::Ok
            } else {
                Status::Warn
            };
            Finding::new(setting, current, recommended, why, status).manual(manual)
        })
        .collect()
}

/// The online CPUs, or why they could not be read.
fn online_cpus(host: &Host) -> Result<Vec<u32>, String> {
    let text = host.read("/sys/devices/system/cpu/online")?;
    parse::parse_cpu_list(&text).ok_or_else(|| format!("unparsable cpu list {text:?}"))
}

fn cpus(host: &Host) -> Vec<Finding> {
    let why = "Strata runs one shard per core";
    let online = online_cpus(host);
    let count = match &online {
        Ok(cpus) => Finding::new(
            "cpu.online",
            format!("{} ({})", cpus.len(), parse::format_cpu_list(cpus)),
            "(informational)",
            why,
            Status::Ok,
        ),
        Err(reason) => Finding::unreadable("cpu.online", reason, "(informational)", why),
    };

    let setting = "cpu.governor";
    let why = "frequency scaling adds wake-up latency to every request";
    let governor = match &online {
        Err(reason) => Finding::unreadable(setting, reason, "performance", why),
        Ok(cpus) => governor(host, cpus, setting, why),
    };
    vec![count, governor]
}

fn governor(host: &Host, cpus: &[u32], setting: &str, why: &str) -> Finding {
    let Some(first) = cpus.first() else {
        return Finding::unreadable(setting, "no online cpu", "performance", why);
    };
    // Hypervisors rarely expose frequency control: the absence is normal there.
    if !host.exists(&format!("/sys/devices/system/cpu/cpu{first}/cpufreq")) {
        return Finding::new(
            setting,
            "no cpufreq (VM?)",
            "performance",
            why,
            Status::Unknown,
        );
    }
    let mut by_governor: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut fixes = Vec::new();
    for &cpu in cpus {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor");
        match host.read(&path) {
            Ok(governor) => {
                if governor != "performance" {
                    fixes.push(Fix::sysfs(path, "performance"));
                }
                by_governor.entry(governor).or_default().push(cpu);
            }
            Err(_) => by_governor
                .entry("unreadable".to_string())
                .or_default()
                .push(cpu),
        }
    }
    let current = if by_governor.len() == 1 {
        by_governor.keys().next().cloned().unwrap_or_default()
    } else {
        by_governor
            .iter()
            .map(|(governor, cpus)| format!("{governor} (cpus {})", parse::format_cpu_list(cpus)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let status = if by_governor.contains_key("unreadable") {
        Status::Unknown
    } else if fixes.is_empty() {
        Status::Ok
    } else {
        Status::Warn
    };
    let mut finding = Finding::new(setting, current, "performance", why, status);
    finding.fixes = fixes;
    finding
}

fn transparent_huge_pages(host: &Host) -> Vec<Finding> {
    let base = "/sys/kernel/mm/transparent_hugepage";
    let enabled = choice_finding(
        host,
        "thp.enabled",
        &format!("{base}/enabled"),
        &["madvise", "never"],
        "madvise",
        "madvise or never",
        "with THP always, khugepaged and compaction cause latency spikes",
    );
    let defrag = choice_finding(
        host,
        "thp.defrag",
        &format!("{base}/defrag"),
        &["madvise", "never", "defer", "defer+madvise"],
        "madvise",
        "not always",
        "always stalls page faults on direct compaction",
    );
    vec![enabled, defrag]
}

/// A bracketed sysfs choice that is fine when it is one of `good`, fixed by writing `fix_to`.
fn choice_finding(
    host: &Host,
    setting: &str,
    path: &str,
    good: &[&str],
    fix_to: &str,
    recommended: &str,
    why: &str,
) -> Finding {
    let text = match host.read(path) {
        Ok(text) => text,
        Err(reason) => return Finding::unreadable(setting, reason, recommended, why),
    };
    let Some((active, choices)) = parse::scheduler(&text) else {
        return Finding::unreadable(
            setting,
            format!("no [choice] in {text:?}"),
            recommended,
            why,
        );
    };
    if good.contains(&active.as_str()) {
        return Finding::new(setting, active, recommended, why, Status::Ok);
    }
    let finding = Finding::new(setting, active, recommended, why, Status::Warn);
    if choices.iter().any(|choice| choice == fix_to) {
        finding.fix(Fix::sysfs(path, fix_to))
    } else {
        finding.manual(format!("{path} offers no {fix_to}"))
    }
}

/// How a numeric sysctl compares with its bound.
enum Bound {
    AtMost(u64),
    AtLeast(u64),
}

fn sysctls(host: &Host) -> Vec<Finding> {
    let quic = "QUIC replication asks for 4 MiB UDP socket buffers; the kernel caps it at this";
    let rows: [(&str, Bound, &str); 9] = [
        (
            "vm.swappiness",
            Bound::AtMost(1),
            "a swapped-out index or buffer turns a fetch into a disk read",
        ),
        (
            "vm.dirty_background_ratio",
            Bound::AtMost(5),
            "start background writeback early so fsync finds little to flush",
        ),
        (
            "vm.dirty_ratio",
            Bound::AtMost(20),
            "caps dirty page cache before writers are throttled; large values make fsync stalls long",
        ),
        (
            "vm.dirty_expire_centisecs",
            Bound::AtMost(3000),
            "older dirty pages are written back; longer lets bursts pile up (kernel default 3000)",
        ),
        (
            "vm.dirty_writeback_centisecs",
            Bound::AtMost(500),
            "how often the flusher wakes; longer makes writeback bursty (kernel default 500)",
        ),
        (
            "net.core.somaxconn",
            Bound::AtLeast(SOMAXCONN_MIN),
            "the accept backlog; a reconnect storm of clients overflows a small one",
        ),
        (
            "net.core.rmem_max",
            Bound::AtLeast(SOCKET_BUFFER_BYTES_MIN),
            quic,
        ),
        (
            "net.core.wmem_max",
            Bound::AtLeast(SOCKET_BUFFER_BYTES_MIN),
            quic,
        ),
        (
            "net.core.netdev_max_backlog",
            Bound::AtLeast(1000),
            "packets queued per CPU before the kernel drops them (kernel default 1000)",
        ),
    ];
    rows.into_iter()
        .map(|(name, bound, why)| sysctl(host, name, bound, why))
        .collect()
}

/// The congestion control Strata's connections ask for (`strata serve --tcp-congestion`):
/// the client crate's `DEFAULT_TCP_CONGESTION`, which a test in `cli/tests/tune.rs` holds
/// this to (this crate reads the host and depends on no other Strata crate).
pub const STRATA_TCP_CONGESTION: &str = "cubic";

/// Whether the broker's connections can get cubic: the kernel must offer it and, for a broker
/// that is not root, allow it (`tcp_allowed_congestion_control`; by default only reno and the
/// host's default). Otherwise they keep the host's default, which on hosts set to BBR without
/// the fq qdisc paces every burst with a timer.
fn tcp_congestion(host: &Host) -> Finding {
    let setting = "net.ipv4.tcp_congestion_control";
    let recommended = format!("{STRATA_TCP_CONGESTION} available and allowed");
    let why = "Strata's connections ask for cubic: BBR without the fq qdisc paces every burst with a timer (half a consumer's throughput in docs/performance.md)";
    let read = |name: &str| host.read(&crate::sysctl_path(name));
    let (default, allowed, available) = match (
        read("net.ipv4.tcp_congestion_control"),
        read("net.ipv4.tcp_allowed_congestion_control"),
        read("net.ipv4.tcp_available_congestion_control"),
    ) {
        (Ok(default), Ok(allowed), Ok(available)) => (default, allowed, available),
        (Err(reason), _, _) | (_, Err(reason), _) | (_, _, Err(reason)) => {
            return Finding::unreadable(setting, reason, recommended, why);
        }
    };
    let qdisc = read("net.core.default_qdisc").unwrap_or_else(|_| "unknown".into());
    let has = |list: &str| {
        list.split_whitespace()
            .any(|name| name == STRATA_TCP_CONGESTION)
    };
    let current = format!("{default} (qdisc {qdisc}; allowed: {allowed})");
    if !has(&available) {
        Finding::new(setting, current, recommended, why, Status::Warn)
            .manual("load the tcp_cubic module (modprobe tcp_cubic)")
    } else if default == STRATA_TCP_CONGESTION || has(&allowed) {
        Finding::new(setting, current, recommended, why, Status::Ok)
    } else {
        let widened = format!("{allowed} {STRATA_TCP_CONGESTION}");
        Finding::new(setting, current, recommended, why, Status::Warn).fix(Fix::sysctl(
            "net.ipv4.tcp_allowed_congestion_control",
            widened,
        ))
    }
}

fn sysctl(host: &Host, name: &str, bound: Bound, why: &str) -> Finding {
    let (recommended, target) = match bound {
        Bound::AtMost(max) => (format!("≤ {max}"), max),
        Bound::AtLeast(min) => (format!("≥ {min}"), min),
    };
    let text = match host.read(&crate::sysctl_path(name)) {
        Ok(text) => text,
        Err(reason) => return Finding::unreadable(name, reason, recommended, why),
    };
    let Ok(value) = text.parse::<u64>() else {
        return Finding::unreadable(name, format!("not a number: {text:?}"), recommended, why);
    };
    let good = match bound {
        Bound::AtMost(max) => value <= max,
        Bound::AtLeast(min) => value >= min,
    };
    if good {
        Finding::new(name, text, recommended, why, Status::Ok)
    } else {
        Finding::new(name, text, recommended, why, Status::Warn).fix(Fix::sysctl(name, target))
    }
}

fn irqs(host: &Host) -> Vec<Finding> {
    let why = "one CPU taking every queue's interrupts becomes the bottleneck";
    let recommended = "spread over CPUs";
    let text = match host.read("/proc/interrupts") {
        Ok(text) => text,
        Err(reason) => return vec![Finding::unreadable("irq", reason, recommended, why)],
    };
    let online = online_cpus(host).map(|cpus| cpus.len()).unwrap_or(0);
    let mut devices: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for line in parse::parse_interrupts(&text) {
        if let Some(device) = line.names.iter().find_map(|name| parse::irq_device(name)) {
            devices.entry(device).or_default().push(line.irq);
        }
    }
    devices
        .into_iter()
        .map(|(device, irqs)| {
            let setting = format!("irq.{device}");
            let mut cpus = Vec::new();
            for irq in &irqs {
                let path = format!("/proc/irq/{irq}/smp_affinity_list");
                let parsed = host.read(&path).and_then(|text| {
                    parse::parse_cpu_list(&text).ok_or_else(|| format!("unparsable {path}"))
                });
                match parsed {
                    Ok(list) => cpus.extend(list),
                    Err(reason) => return Finding::unreadable(setting, reason, recommended, why),
                }
            }
            cpus.sort_unstable();
            cpus.dedup();
            let queues = if irqs.len() == 1 { "IRQ" } else { "IRQs" };
            if cpus.len() == 1 && online > 1 {
                Finding::new(
                    setting,
                    format!("{} {queues} all on CPU {}", irqs.len(), cpus[0]),
                    recommended,
                    why,
                    Status::Warn,
                )
                .manual("run irqbalance, or write CPU lists to /proc/irq/N/smp_affinity_list")
            } else {
                Finding::new(
                    setting,
                    format!(
                        "{} {queues} over CPUs {}",
                        irqs.len(),
                        parse::format_cpu_list(&cpus)
                    ),
                    recommended,
                    why,
                    Status::Ok,
                )
            }
        })
        .collect()
}

fn storage(host: &Host, data_dir: &Path) -> Vec<Finding> {
    let mut findings = Vec::new();
    let dir = match host.data_dir(data_dir) {
        Ok(dir) => dir,
        Err(reason) => {
            findings.push(Finding::unreadable(
                "data_dir",
                reason,
                "(informational)",
                "the disk and filesystem checks follow the data directory",
            ));
            return findings;
        }
    };
    findings.extend(block_device(host, &dir));
    findings.extend(filesystem(host, &dir.path));
    findings
}

fn block_device(host: &Host, dir: &crate::host::DataDir) -> Vec<Finding> {
    let mut findings = Vec::new();
    let device_why = "the disk and filesystem checks follow the data directory";
    let uevent_path = format!("/sys/dev/block/{}/uevent", dir.device);
    let disk = host
        .read(&uevent_path)
        .map_err(|reason| {
            // Anonymous devices (major 0) are overlayfs, tmpfs, btrfs subvolumes: no queue.
            if dir.device.major == 0 {
                format!(
                    "{} is on device {}, not a block device (overlay, tmpfs, btrfs or a container?)",
                    dir.path, dir.device
                )
            } else {
                reason
            }
        })
        .and_then(|text| {
            let uevent = parse::parse_uevent(&text);
            let name = uevent
                .get("DEVNAME")
                .cloned()
                .ok_or_else(|| format!("no DEVNAME in {uevent_path}"))?;
            // A partition's queue settings belong to its disk: /sys/block/DISK/PART exists.
            if uevent.get("DEVTYPE").map(String::as_str) == Some("partition") {
                let disks = host.list("/sys/block")?;
                let disk = disks
                    .into_iter()
                    .find(|disk| host.exists(&format!("/sys/block/{disk}/{name}")))
                    .ok_or_else(|| format!("no disk in /sys/block holds partition {name}"))?;
                Ok((name, disk))
            } else {
                Ok((name.clone(), name))
            }
        });
    let (name, disk) = match disk {
        Ok(found) => found,
        Err(reason) => {
            findings.push(Finding::unreadable(
                "block.device",
                reason,
                "(informational)",
                device_why,
            ));
            return findings;
        }
    };
    let mut current = format!("{} on {name} ({})", dir.path, dir.device);
    if name != disk {
        current.push_str(&format!(", disk {disk}"));
    }
    if let Some(note) = &dir.note {
        current.push_str(&format!("; {note}"));
    }
    findings.push(Finding::new(
        "block.device",
        current,
        "(informational)",
        device_why,
        Status::Ok,
    ));

    let queue = format!("/sys/block/{disk}/queue");
    // virtio and Xen disks report whatever the hypervisor says; the host schedules for them.
    let virtual_disk = disk.starts_with("vd") || disk.starts_with("xvd");
    let rotational = host.read(&format!("{queue}/rotational"));
    let spinning = rotational.as_deref() == Ok("1") && !virtual_disk;

    // Scheduler: NVMe, SSDs and virtual disks do best without one; spinning disks want
    // mq-deadline to bound seek-induced starvation.
    let scheduler_path = format!("{queue}/scheduler");
    let (wanted, why) = if spinning {
        (
            "mq-deadline",
            "a spinning disk needs requests ordered to bound seeks",
        )
    } else {
        (
            "none",
            "NVMe, SSDs and virtual disks reorder internally; a scheduler only adds CPU and latency",
        )
    };
    let active_scheduler = match host.read(&scheduler_path) {
        Err(reason) => {
            findings.push(Finding::unreadable("block.scheduler", reason, wanted, why));
            None
        }
        Ok(text) => match parse::scheduler(&text) {
            None if text.trim() == "none" => {
                // Stacked devices (dm, md) print a bare "none": nothing to choose.
                findings.push(Finding::new(
                    "block.scheduler",
                    "none",
                    wanted,
                    why,
                    Status::Ok,
                ));
                Some("none".to_string())
            }
            None => {
                findings.push(Finding::unreadable(
                    "block.scheduler",
                    format!("no [choice] in {text:?}"),
                    wanted,
                    why,
                ));
                None
            }
            Some((active, choices)) => {
                let finding = if active == wanted {
                    Finding::new("block.scheduler", &active, wanted, why, Status::Ok)
                } else if choices.iter().any(|choice| choice == wanted) {
                    Finding::new("block.scheduler", &active, wanted, why, Status::Warn)
                        .fix(Fix::sysfs(&scheduler_path, wanted))
                } else {
                    Finding::new("block.scheduler", &active, wanted, why, Status::Warn)
                        .manual(format!("{scheduler_path} offers no {wanted}"))
                };
                findings.push(finding);
                Some(active)
            }
        },
    };

    // Queue depth: SCSI exposes device/queue_depth; blk-mq devices have one mq/N folder per
    // hardware queue with its tag count.
    let depth_why = "how many requests the device takes at once (informational)";
    let hw_queues: Vec<String> = host
        .list(&format!("/sys/block/{disk}/mq"))
        .map(|names| {
            names
                .into_iter()
                .filter(|name| name.parse::<u32>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    let nr_tags = hw_queues
        .first()
        .and_then(|first| {
            host.read(&format!("/sys/block/{disk}/mq/{first}/nr_tags"))
                .ok()
        })
        .and_then(|text| text.parse::<u64>().ok());
    let depth = if let Ok(depth) = host.read(&format!("/sys/block/{disk}/device/queue_depth")) {
        Finding::new(
            "block.queue_depth",
            depth,
            "(informational)",
            depth_why,
            Status::Ok,
        )
    } else if let Ok(queues) = host.read(&format!("{queue}/nr_hw_queues")) {
        Finding::new(
            "block.queue_depth",
            format!("{queues} hardware queues"),
            "(informational)",
            depth_why,
            Status::Ok,
        )
    } else if let Some(tags) = nr_tags {
        Finding::new(
            "block.queue_depth",
            format!("{tags} tags × {} hardware queue(s)", hw_queues.len()),
            "(informational)",
            depth_why,
            Status::Ok,
        )
    } else {
        Finding::unreadable(
            "block.queue_depth",
            format!("no device/queue_depth, queue/nr_hw_queues or mq/ under /sys/block/{disk}"),
            "(informational)",
            depth_why,
        )
    };
    findings.push(depth);

    // nr_requests cannot exceed the hardware tag count when there is no scheduler.
    let nr_requests_min = match (active_scheduler.as_deref(), nr_tags) {
        (Some("none"), Some(tags)) => NR_REQUESTS_MIN.min(tags),
        _ => NR_REQUESTS_MIN,
    };
    let nr_path = format!("{queue}/nr_requests");
    let nr_why = "requests the block layer queues before writers sleep";
    let recommended = format!("≥ {nr_requests_min}");
    findings.push(match host.read(&nr_path) {
        Err(reason) => Finding::unreadable("block.nr_requests", reason, recommended, nr_why),
        Ok(text) => match text.parse::<u64>() {
            Err(_) => Finding::unreadable(
                "block.nr_requests",
                format!("not a number: {text:?}"),
                recommended,
                nr_why,
            ),
            Ok(value) if value >= nr_requests_min => {
                Finding::new("block.nr_requests", text, recommended, nr_why, Status::Ok)
            }
            Ok(_) => Finding::new("block.nr_requests", text, recommended, nr_why, Status::Warn)
                .fix(Fix::sysfs(&nr_path, nr_requests_min)),
        },
    });

    let cache_why =
        "a volatile (write back) cache is safe only because fsync makes the kernel flush it";
    findings.push(match host.read(&format!("{queue}/write_cache")) {
        Ok(mode) => Finding::new(
            "block.write_cache",
            mode,
            "(informational)",
            cache_why,
            Status::Ok,
        ),
        Err(reason) => {
            Finding::unreadable("block.write_cache", reason, "(informational)", cache_why)
        }
    });

    let rotational_why = if virtual_disk {
        "a seek per partition kills throughput (virtual disks report what the hypervisor says)"
    } else {
        "a seek per partition kills throughput"
    };
    findings.push(match rotational {
        Ok(value) if value == "0" => {
            Finding::new("block.rotational", value, "0", rotational_why, Status::Ok)
        }
        Ok(value) => Finding::new("block.rotational", value, "0", rotational_why, Status::Warn)
            .manual("put the data directory on an SSD or NVMe device"),
        Err(reason) => Finding::unreadable("block.rotational", reason, "0", rotational_why),
    });
    findings
}

fn filesystem(host: &Host, path: &str) -> Vec<Finding> {
    let type_why = "the filesystems Strata is tested on; others may not keep fsync's promises";
    let atime_why = "atime updates turn reads into metadata writes";
    let discard_why = "online discard adds latency to deletes; run fstrim periodically instead";
    let own_why = "a shard makes its flush=interval logs durable with one syncfs, which also waits for whatever else is written to that filesystem";
    let mounts = match host.read("/proc/self/mountinfo") {
        Ok(text) => parse::parse_mountinfo(&text),
        Err(reason) => {
            return vec![
                Finding::unreadable("fs.type", &reason, "xfs or ext4", type_why),
                Finding::unreadable("fs.atime", &reason, "noatime", atime_why),
                Finding::unreadable("fs.discard", &reason, "no discard", discard_why),
                Finding::unreadable("fs.own", &reason, "a filesystem of its own", own_why),
            ];
        }
    };
    let Some(mount) = parse::mount_for(&mounts, path) else {
        let reason = format!("no mount holds {path}");
        return vec![
            Finding::unreadable("fs.type", &reason, "xfs or ext4", type_why),
            Finding::unreadable("fs.atime", &reason, "noatime", atime_why),
            Finding::unreadable("fs.discard", &reason, "no discard", discard_why),
            Finding::unreadable("fs.own", &reason, "a filesystem of its own", own_why),
        ];
    };
    let on = format!("{} on {}", mount.fs_type, mount.mount_point);
    let fs_type = if mount.fs_type == "xfs" || mount.fs_type == "ext4" {
        Finding::new("fs.type", on, "xfs or ext4", type_why, Status::Ok)
    } else {
        Finding::new("fs.type", on, "xfs or ext4", type_why, Status::Warn)
            .manual("put the data directory on an xfs or ext4 filesystem")
    };
    let has = |option: &str| mount.options.iter().any(|o| o == option);
    let atime_option = ["noatime", "relatime", "strictatime", "lazytime"]
        .into_iter()
        .find(|option| has(option))
        .unwrap_or("atime (default relatime)");
    let atime = if has("noatime") {
        Finding::new("fs.atime", "noatime", "noatime", atime_why, Status::Ok)
    } else {
        Finding::new("fs.atime", atime_option, "noatime", atime_why, Status::Warn).manual(format!(
            "mount -o remount,noatime {} and add noatime in /etc/fstab",
            mount.mount_point
        ))
    };
    let discard = if has("discard") {
        Finding::new(
            "fs.discard",
            "discard",
            "no discard",
            discard_why,
            Status::Warn,
        )
        .manual(format!(
            "drop discard from {}'s options in /etc/fstab and enable fstrim.timer",
            mount.mount_point
        ))
    } else {
        Finding::new("fs.discard", "off", "no discard", discard_why, Status::Ok)
    };
    // The root filesystem holds the system's logs, packages and everyone's temporary files.
    let own = if mount.mount_point == "/" {
        Finding::new(
            "fs.own",
            "the root filesystem",
            "a filesystem of its own",
            own_why,
            Status::Warn,
        )
        .manual(format!(
            "mount a filesystem of its own (a disk or partition for Strata alone) at {path}"
        ))
    } else {
        Finding::new(
            "fs.own",
            mount.mount_point.as_str(),
            "a filesystem of its own",
            own_why,
            Status::Ok,
        )
    };
    vec![fs_type, atime, discard, own]
}

fn clocksource(host: &Host) -> Finding {
    let setting = "clocksource";
    let path = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
    let why = "timestamps and timeouts read the clock constantly; tsc is read without a syscall";
    match host.read(path) {
        Err(reason) => Finding::unreadable(setting, reason, "tsc", why),
        Ok(source) if source == "tsc" => Finding::new(setting, source, "tsc", why, Status::Ok),
        Ok(source) if source == "kvm-clock" => Finding::new(
            setting,
            source,
            "tsc",
            "kvm-clock is the paravirtual clock of a KVM guest: fine on a VM",
            Status::Ok,
        ),
        Ok(source) => {
            let available = host
                .read("/sys/devices/system/clocksource/clocksource0/available_clocksource")
                .unwrap_or_default();
            let finding = Finding::new(setting, source, "tsc", why, Status::Warn);
            if available.split_whitespace().any(|name| name == "tsc") {
                finding.fix(Fix::sysfs(path, "tsc"))
            } else {
                finding.manual("this host offers no tsc clocksource")
            }
        }
    }
}

/// The kernel's default `guest_halt_poll_ns`, which the recommendation restores.
const GUEST_HALT_POLL_NS: u64 = 200_000;

/// Whether an idle CPU of a KVM guest polls a moment before it halts (the `haltpoll` cpuidle
/// driver). A halted vCPU is the host's to reschedule: waking it for a request or a follower's
/// answer takes an interrupt through the hypervisor, on every hop of a replicated write.
fn guest_halt_polling(host: &Host) -> Finding {
    let setting = "cpuidle.guest_halt_poll_ns";
    let recommended = "200000 where the driver is haltpoll";
    let why = "a KVM guest's idle vCPU halts to the host, and waking it costs an interrupt through the hypervisor, paid by the waker: small QUIC round trips between two brokers ran 3x as fast with 200 µs of polling, at half the CPU each (docs/performance.md); the cost is up to that long of spinning per idle period, on a CPU that had nothing to do";
    match guest_halt_poll_ns(host) {
        Err(reason) => Finding::unreadable(setting, reason, recommended, why),
        Ok(HaltPolling::OtherDriver(driver)) => Finding::new(
            setting,
            format!("n/a (cpuidle driver {driver})"),
            recommended,
            why,
            Status::Ok,
        ),
        Ok(HaltPolling::Polls(0)) => {
            Finding::new(setting, "0 (polling off)", recommended, why, Status::Warn)
                .fix(Fix::sysfs(GUEST_HALT_POLL_NS_PATH, GUEST_HALT_POLL_NS))
        }
        Ok(HaltPolling::Polls(ns)) => {
            Finding::new(setting, ns.to_string(), recommended, why, Status::Ok)
        }
    }
}

const GUEST_HALT_POLL_NS_PATH: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";

/// What an idle CPU of `host` does before it halts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HaltPolling {
    /// The `haltpoll` cpuidle driver (a KVM guest) polls this many nanoseconds (0: none).
    Polls(u64),
    /// Another cpuidle driver (bare metal, or a guest without haltpoll): nothing to set.
    OtherDriver(String),
}

/// Reads the cpuidle driver and, under `haltpoll`, its `guest_halt_poll_ns`; why not, in words.
/// Also what `strata bench` records of the host a run started on.
pub fn guest_halt_poll_ns(host: &Host) -> Result<HaltPolling, String> {
    let driver = host.read("/sys/devices/system/cpu/cpuidle/current_driver")?;
    if driver != "haltpoll" {
        return Ok(HaltPolling::OtherDriver(driver));
    }
    host.read(GUEST_HALT_POLL_NS_PATH)?
        .parse()
        .map(HaltPolling::Polls)
        .map_err(|_| format!("unparsable {GUEST_HALT_POLL_NS_PATH}"))
}

/// CPU seconds (user and system) this process has used: the broker's cost per GB moved, and
/// the bench tool's own use.
pub fn process_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return 0.0;
        }
        usage.assume_init()
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Bytes of this process's memory resident now (`VmRSS` of `/proc/self/status`): with the
/// partition count, what each partition costs. `None` where the kernel does not say.
pub fn process_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    resident_bytes_of(&status)
}

fn resident_bytes_of(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// File descriptors this process holds open (entries of `/proc/self/fd`): segments, sockets,
/// the io_uring. `None` where it cannot be read.
pub fn process_open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// Microseconds since boot in which some task stalled waiting for memory: the `some total=` of
/// the kernel's pressure stall information (`/proc/pressure/memory`); `None` where the kernel
/// keeps none. Page-cache reclaim under a broker shows here, where the broker's own timings do
/// not (kswapd does the work on another core).
pub fn memory_stalls_us(host: &Host) -> Option<u64> {
    host.read("/proc/pressure/memory")
        .ok()?
        .lines()
        .find(|line| line.starts_with("some "))?
        .split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The virtio feature bit of a balloon device that reports free guest pages to the host
/// (`VIRTIO_BALLOON_F_REPORTING`).
const BALLOON_F_REPORTING: usize = 5;

/// Whether the VM hands its free memory back to the host (virtio-balloon free page reporting).
/// The host then unmaps those pages, and the guest's next touch of each one faults on the host:
/// the page cache a broker writes into is exactly such memory.
fn free_page_reporting(host: &Host) -> Finding {
    let setting = "vm.free_page_reporting";
    let recommended = "off (a broker VM keeps its memory)";
    let why = "memory a VM reported free comes back unbacked: page-cache writes into it ran at ~400 MB/s per core on a 2-vCPU KVM guest, against memory speed once touched (docs/performance.md)";
    let drivers = "/sys/bus/virtio/drivers/virtio_balloon";
    if !host.exists(drivers) {
        return if host.exists("/sys/bus") {
            Finding::new(setting, "no virtio balloon", recommended, why, Status::Ok)
        } else {
            Finding::unreadable(setting, "no /sys/bus", recommended, why)
        };
    }
    let devices = match host.list(drivers) {
        Ok(names) => names
            .into_iter()
            .filter(|name| name.starts_with("virtio"))
            .collect::<Vec<_>>(),
        Err(reason) => return Finding::unreadable(setting, reason, recommended, why),
    };
    let mut reporting = Vec::new();
    for device in &devices {
        // One character per feature bit, bit 0 first.
        match host.read(&format!("{drivers}/{device}/features")) {
            Ok(bits) if bits.as_bytes().get(BALLOON_F_REPORTING) == Some(&b'1') => {
                reporting.push(device.as_str());
            }
            Ok(_) => {}
            Err(reason) => return Finding::unreadable(setting, reason, recommended, why),
        }
    }
    if reporting.is_empty() {
        let current = if devices.is_empty() {
            "no virtio balloon".to_string()
        } else {
            format!("off ({})", devices.join(", "))
        };
        Finding::new(setting, current, recommended, why, Status::Ok)
    } else {
        Finding::new(
            setting,
            format!("on ({})", reporting.join(", ")),
            recommended,
            why,
            Status::Warn,
        )
        .manual("turn free page reporting off on the VM's balloon device (QEMU: -device virtio-balloon,free-page-reporting=off) or give the broker a VM without a balloon")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_bytes_come_from_vmrss() {
        let status = "Name:\tstrata\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nThreads:\t4\n";
        assert_eq!(resident_bytes_of(status), Some(12345 * 1024));
        assert_eq!(resident_bytes_of("Name:\tkthread\n"), None);
        assert!(process_resident_bytes().unwrap() > 0);
        assert!(process_open_fds().unwrap() >= 3);
    }
}
