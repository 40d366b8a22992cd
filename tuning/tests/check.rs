//! `check` and `apply` over fixture roots captured from an NVMe server (`nvme-host`) and a
//! KVM guest (`vm-host`), and over the live host and an empty root to show nothing panics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use strata_tuning::{DevId, Finding, Host, Status, check, plan, report};

const DATA_DIR: &str = "/var/lib/strata";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn nvme_host(root: &Path) -> Host {
    Host::fixture(
        root,
        DevId {
            major: 259,
            minor: 3,
        },
    )
}

fn vm_host(root: &Path) -> Host {
    Host::fixture(
        root,
        DevId {
            major: 253,
            minor: 1,
        },
    )
}

fn by_setting(findings: &[Finding]) -> BTreeMap<&str, &Finding> {
    let mut map = BTreeMap::new();
    for finding in findings {
        assert!(
            map.insert(finding.setting.as_str(), finding).is_none(),
            "setting {} reported twice",
            finding.setting
        );
    }
    map
}

/// Asserts a finding's status and current value, naming the finding on failure.
#[track_caller]
fn expect(findings: &BTreeMap<&str, &Finding>, setting: &str, status: Status, current: &str) {
    let finding = findings
        .get(setting)
        .unwrap_or_else(|| panic!("no finding for {setting}: {findings:#?}"));
    assert_eq!(
        (finding.status, finding.current.as_str()),
        (status, current),
        "{finding:#?}"
    );
}

#[test]
fn nvme_host_findings() {
    let findings = check(&nvme_host(&fixture("nvme-host")), Path::new(DATA_DIR));
    let map = by_setting(&findings);
    use Status::*;
    expect(&map, "kernel", Ok, "6.8.0-45-generic");
    expect(&map, "kernel.io_uring_disabled", Ok, "0");
    expect(&map, "RLIMIT_MEMLOCK", Ok, "unlimited (hard unlimited)");
    expect(&map, "RLIMIT_NOFILE", Warn, "1024 (hard 524288)");
    expect(&map, "cpu.online", Ok, "8 (0-7)");
    expect(&map, "cpu.governor", Warn, "powersave");
    expect(&map, "thp.enabled", Warn, "always");
    expect(&map, "thp.defrag", Ok, "madvise");
    expect(&map, "vm.swappiness", Warn, "60");
    expect(&map, "vm.dirty_background_ratio", Warn, "10");
    expect(&map, "vm.dirty_ratio", Ok, "20");
    expect(&map, "vm.dirty_expire_centisecs", Ok, "3000");
    expect(&map, "vm.dirty_writeback_centisecs", Ok, "500");
    expect(&map, "net.core.somaxconn", Ok, "4096");
    expect(&map, "net.core.rmem_max", Warn, "212992");
    expect(&map, "net.core.wmem_max", Warn, "212992");
    // The admin queue (nvme0q0) and the NIC's async vector are not data queues.
    expect(&map, "irq.nvme0", Ok, "8 IRQs over CPUs 0-7");
    expect(
        &map,
        "irq.mlx5@pci:0000:3b:00.0",
        Warn,
        "8 IRQs all on CPU 0",
    );
    expect(
        &map,
        "block.device",
        Ok,
        "/var/lib/strata on nvme0n1p3 (259:3), disk nvme0n1",
    );
    expect(&map, "block.scheduler", Ok, "none");
    expect(
        &map,
        "block.queue_depth",
        Ok,
        "1023 tags × 8 hardware queue(s)",
    );
    expect(&map, "block.nr_requests", Ok, "1023");
    expect(&map, "block.write_cache", Ok, "write back");
    expect(&map, "block.rotational", Ok, "0");
    expect(&map, "fs.type", Ok, "xfs on /var/lib/strata");
    expect(&map, "fs.atime", Ok, "noatime");
    expect(&map, "fs.discard", Ok, "off");
    expect(&map, "fs.own", Ok, "/var/lib/strata");
    expect(&map, "clocksource", Ok, "tsc");
    expect(
        &map,
        "cpuidle.guest_halt_poll_ns",
        Ok,
        "n/a (cpuidle driver intel_idle)",
    );
    expect(&map, "vm.free_page_reporting", Ok, "no virtio balloon");
    expect(
        &map,
        "net.ipv4.tcp_congestion_control",
        Ok,
        "cubic (qdisc fq_codel; allowed: reno cubic)",
    );
    // A complete capture: everything was readable.
    let unknown: Vec<_> = findings.iter().filter(|f| f.status == Unknown).collect();
    assert!(unknown.is_empty(), "{unknown:#?}");
}

#[test]
fn vm_host_findings() {
    let findings = check(&vm_host(&fixture("vm-host")), Path::new(DATA_DIR));
    let map = by_setting(&findings);
    use Status::*;
    expect(&map, "kernel", Ok, "5.15.0-105-generic");
    expect(
        &map,
        "kernel.io_uring_disabled",
        Ok,
        "absent (kernel < 6.6: always enabled)",
    );
    expect(&map, "RLIMIT_MEMLOCK", Warn, "65536 (hard 65536)");
    expect(&map, "RLIMIT_NOFILE", Ok, "1048576 (hard 1048576)");
    expect(&map, "cpu.online", Ok, "4 (0-3)");
    expect(&map, "cpu.governor", Unknown, "no cpufreq (VM?)");
    expect(&map, "thp.enabled", Ok, "madvise");
    expect(&map, "thp.defrag", Warn, "always");
    expect(&map, "vm.swappiness", Ok, "1");
    expect(&map, "vm.dirty_ratio", Warn, "40");
    expect(&map, "net.core.wmem_max", Warn, "212992");
    expect(&map, "irq.virtio0", Ok, "4 IRQs over CPUs 0-3");
    expect(&map, "irq.virtio1", Warn, "2 IRQs all on CPU 0");
    expect(
        &map,
        "block.device",
        Ok,
        "/var/lib/strata on vda1 (253:1), disk vda",
    );
    expect(&map, "block.scheduler", Warn, "mq-deadline");
    expect(
        &map,
        "block.queue_depth",
        Ok,
        "256 tags × 4 hardware queue(s)",
    );
    expect(&map, "block.nr_requests", Warn, "64");
    expect(&map, "block.rotational", Warn, "1");
    expect(&map, "fs.type", Ok, "ext4 on /");
    expect(&map, "fs.atime", Warn, "relatime");
    expect(&map, "fs.discard", Warn, "discard");
    expect(&map, "fs.own", Warn, "the root filesystem");
    // kvm-clock is what a KVM guest should use: OK, with the reason saying so.
    expect(&map, "clocksource", Ok, "kvm-clock");
    assert!(map["clocksource"].why.contains("VM"));
    // A KVM guest's idle vCPUs halt at once: the fix turns the kernel's polling back on.
    expect(&map, "cpuidle.guest_halt_poll_ns", Warn, "0 (polling off)");
    // The balloon reports free pages to the host: no file write fixes that, the VM's
    // configuration does.
    expect(&map, "vm.free_page_reporting", Warn, "on (virtio0)");
    assert!(map["vm.free_page_reporting"].fixes.is_empty());
    assert!(
        map["vm.free_page_reporting"]
            .manual
            .as_deref()
            .is_some_and(|how| how.contains("free-page-reporting=off"))
    );
    // BBR by default, and cubic (which Strata's connections ask for) not allowed to an
    // unprivileged broker: they would keep BBR.
    expect(
        &map,
        "net.ipv4.tcp_congestion_control",
        Warn,
        "bbr (qdisc pfifo_fast; allowed: reno bbr)",
    );
}

fn commands(host: &Host) -> Vec<String> {
    plan(&check(host, Path::new(DATA_DIR)))
        .into_iter()
        .map(|fix| fix.command)
        .collect()
}

#[test]
fn apply_plans_over_the_fixtures() {
    let mut expected: Vec<String> = (0..8)
        .map(|cpu| {
            format!("echo performance > /sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
        })
        .collect();
    expected.extend(
        [
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled",
            "sysctl -w vm.swappiness=1",
            "sysctl -w vm.dirty_background_ratio=5",
            "sysctl -w net.core.rmem_max=4194304",
            "sysctl -w net.core.wmem_max=4194304",
        ]
        .map(String::from),
    );
    assert_eq!(commands(&nvme_host(&fixture("nvme-host"))), expected);

    assert_eq!(
        commands(&vm_host(&fixture("vm-host"))),
        [
            "echo madvise > /sys/kernel/mm/transparent_hugepage/defrag",
            "sysctl -w vm.dirty_ratio=20",
            "sysctl -w net.core.wmem_max=4194304",
            "sysctl -w net.ipv4.tcp_allowed_congestion_control=\"reno bbr cubic\"",
            "echo none > /sys/block/vda/queue/scheduler",
            "echo 256 > /sys/block/vda/queue/nr_requests",
            "echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns",
        ]
    );
}

/// Copies a fixture tree so that `apply` can write to it.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read fixture dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy fixture file");
        }
    }
}

/// Every file under `root` with its contents.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let contents = std::fs::read(&path).expect("read file");
                files.insert(path, contents);
            }
        }
    }
    files
}

#[test]
fn dry_run_writes_nothing_and_apply_writes_every_fix() {
    let temp = tempfile::tempdir().expect("temp dir");
    let root = temp.path().join("nvme-host");
    copy_tree(&fixture("nvme-host"), &root);
    let host = nvme_host(&root);
    let findings = check(&host, Path::new(DATA_DIR));

    let before = snapshot(&root);
    let mut out = Vec::new();
    let failed = report(&host, &findings, true, &mut out).expect("report");
    let out = String::from_utf8(out).expect("utf-8");
    assert_eq!(failed, 0);
    assert!(out.contains("\nsysctl -w vm.swappiness=1\n"), "{out}");
    assert!(
        out.contains("RLIMIT_NOFILE"),
        "manual fixes are listed: {out}"
    );
    assert!(out.contains("tuning/sysctl.d/99-strata.conf"), "{out}");
    assert_eq!(snapshot(&root), before, "a dry run changed the fixture");

    let mut out = Vec::new();
    let failed = report(&host, &findings, false, &mut out).expect("report");
    let out = String::from_utf8(out).expect("utf-8");
    assert_eq!(failed, 0, "{out}");
    let read = |path: &str| std::fs::read_to_string(host.path(path)).expect("read written file");
    assert_eq!(read("/proc/sys/vm/swappiness"), "1\n");
    assert_eq!(read("/proc/sys/net/core/rmem_max"), "4194304\n");
    assert_eq!(
        read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "madvise\n"
    );
    assert_eq!(
        read("/sys/devices/system/cpu/cpu7/cpufreq/scaling_governor"),
        "performance\n"
    );
    // Unfixed settings are untouched.
    assert_eq!(read("/proc/sys/vm/dirty_ratio"), "20\n");
    assert!(out.contains("13 of 13 change(s) applied"), "{out}");
}

#[test]
fn apply_reports_each_failure_and_goes_on() {
    let temp = tempfile::tempdir().expect("temp dir");
    let root = temp.path().join("vm-host");
    copy_tree(&fixture("vm-host"), &root);
    let host = vm_host(&root);
    let findings = check(&host, Path::new(DATA_DIR));
    // A knob that vanished between check and apply: its write fails, the others still happen.
    std::fs::remove_file(host.path("/sys/block/vda/queue/scheduler")).expect("remove");
    let mut out = Vec::new();
    let failed = report(&host, &findings, false, &mut out).expect("report");
    let out = String::from_utf8(out).expect("utf-8");
    assert_eq!(failed, 1, "{out}");
    assert!(
        out.contains("# FAILED  echo none > /sys/block/vda/queue/scheduler"),
        "{out}"
    );
    assert!(out.contains("6 of 7 change(s) applied"), "{out}");
    assert_eq!(
        std::fs::read_to_string(host.path("/proc/sys/net/ipv4/tcp_allowed_congestion_control"))
            .expect("read"),
        "reno bbr cubic\n",
        "a value with spaces is written whole"
    );
    assert_eq!(
        std::fs::read_to_string(host.path("/sys/block/vda/queue/nr_requests")).expect("read"),
        "256\n"
    );
    assert_eq!(
        std::fs::read_to_string(host.path("/sys/module/haltpoll/parameters/guest_halt_poll_ns"))
            .expect("read"),
        "200000\n"
    );
    // The write did not create the missing file.
    assert!(!host.path("/sys/block/vda/queue/scheduler").exists());
}

#[test]
fn live_host_check_does_not_panic() {
    let temp = tempfile::tempdir().expect("temp dir");
    let findings = check(&Host::live(), &temp.path().join("strata-data"));
    assert!(findings.len() > 20, "{findings:#?}");
    for finding in &findings {
        if finding.current.starts_with("unreadable:") {
            assert_eq!(finding.status, Status::Unknown, "{finding:#?}");
        }
        if finding.status == Status::Unknown {
            assert!(
                finding.current.starts_with("unreadable:")
                    || finding.current == "no cpufreq (VM?)"
                    || finding.current.contains("unreadable"),
                "an UNKNOWN must say why: {finding:#?}"
            );
        }
    }
}

#[test]
fn an_empty_root_is_all_unknown() {
    // A container without /proc and /sys mounted: every probe says why, none guesses.
    let temp = tempfile::tempdir().expect("temp dir");
    let host = Host::fixture(temp.path(), DevId { major: 8, minor: 1 });
    let findings = check(&host, Path::new(DATA_DIR));
    let not_unknown: Vec<_> = findings
        .iter()
        .filter(|finding| finding.status != Status::Unknown)
        .collect();
    assert!(not_unknown.is_empty(), "{not_unknown:#?}");
    assert!(plan(&findings).is_empty());
}

#[test]
fn json_has_the_stable_fields_only() {
    let findings = check(&nvme_host(&fixture("nvme-host")), Path::new(DATA_DIR));
    let json = serde_json::to_value(&findings).expect("serialize");
    let array = json.as_array().expect("an array");
    assert_eq!(array.len(), findings.len());
    for object in array {
        let object = object.as_object().expect("an object");
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["setting", "current", "recommended", "why", "status"],
            "{object:?}"
        );
        assert!(matches!(
            object["status"].as_str(),
            Some("OK" | "WARN" | "UNKNOWN")
        ));
    }
}

#[test]
fn table_aligns_columns() {
    let findings = check(&vm_host(&fixture("vm-host")), Path::new(DATA_DIR));
    let table = strata_tuning::render_table(&findings);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), findings.len() + 1);
    assert!(lines[0].starts_with("SETTING"));
    // The status column starts at the same character in every row.
    let column = lines[0].find("STATUS").expect("status header");
    for line in &lines[1..] {
        let rest: String = line.chars().skip(column).collect();
        assert!(
            ["OK", "WARN", "UNKNOWN"]
                .iter()
                .any(|status| rest.starts_with(status)),
            "{line}"
        );
    }
}

/// A balloon without the reporting feature bit is fine; with it (bit 5 of the device's feature
/// string) the finding warns.
#[test]
fn free_page_reporting_follows_the_balloon_feature_bit() {
    for (bits, status, current) in [
        ("0110000100", Status::Ok, "off (virtio0)"),
        ("0110010100", Status::Warn, "on (virtio0)"),
    ] {
        let temp = tempfile::tempdir().expect("temp dir");
        let device = temp
            .path()
            .join("sys/bus/virtio/drivers/virtio_balloon/virtio0");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::write(device.join("features"), format!("{bits}\n")).unwrap();
        let host = Host::fixture(temp.path(), DevId { major: 8, minor: 1 });
        let findings = check(&host, Path::new(DATA_DIR));
        expect(
            &by_setting(&findings),
            "vm.free_page_reporting",
            status,
            current,
        );
    }
}

/// Guest halt polling matters only under the `haltpoll` cpuidle driver: off there warns (and
/// apply turns it on), on is fine, and another driver has nothing to set.
#[test]
fn guest_halt_polling_follows_the_cpuidle_driver() {
    for (driver, poll_ns, status, current) in [
        ("haltpoll", Some("0"), Status::Warn, "0 (polling off)"),
        ("haltpoll", Some("200000"), Status::Ok, "200000"),
        ("haltpoll", None, Status::Unknown, ""),
        (
            "acpi_idle",
            None,
            Status::Ok,
            "n/a (cpuidle driver acpi_idle)",
        ),
    ] {
        let temp = tempfile::tempdir().expect("temp dir");
        let cpuidle = temp.path().join("sys/devices/system/cpu/cpuidle");
        std::fs::create_dir_all(&cpuidle).unwrap();
        std::fs::write(cpuidle.join("current_driver"), format!("{driver}\n")).unwrap();
        if let Some(poll_ns) = poll_ns {
            let parameters = temp.path().join("sys/module/haltpoll/parameters");
            std::fs::create_dir_all(&parameters).unwrap();
            std::fs::write(
                parameters.join("guest_halt_poll_ns"),
                format!("{poll_ns}\n"),
            )
            .unwrap();
        }
        let host = Host::fixture(temp.path(), DevId { major: 8, minor: 1 });
        let findings = check(&host, Path::new(DATA_DIR));
        let map = by_setting(&findings);
        let finding = &map["cpuidle.guest_halt_poll_ns"];
        assert_eq!(finding.status, status, "{driver} {poll_ns:?}: {finding:?}");
        if status != Status::Unknown {
            assert_eq!(finding.current, current, "{driver} {poll_ns:?}");
        }
        assert_eq!(
            finding.fixes.len(),
            usize::from(status == Status::Warn),
            "{driver} {poll_ns:?}"
        );
    }
}

/// Memory stalls come from the `some` line of `/proc/pressure/memory`, and are absent where the
/// kernel keeps no pressure stall information.
#[test]
fn memory_stalls_are_read_from_pressure_stall_information() {
    let temp = tempfile::tempdir().expect("temp dir");
    let host = Host::fixture(temp.path(), DevId { major: 8, minor: 1 });
    assert_eq!(strata_tuning::memory_stalls_us(&host), None);
    let pressure = temp.path().join("proc/pressure");
    std::fs::create_dir_all(&pressure).unwrap();
    std::fs::write(
        pressure.join("memory"),
        "some avg10=0.23 avg60=0.74 avg300=0.30 total=15772768\n\
         full avg10=0.21 avg60=0.66 avg300=0.26 total=12836161\n",
    )
    .unwrap();
    assert_eq!(strata_tuning::memory_stalls_us(&host), Some(15_772_768));
    std::fs::write(pressure.join("memory"), "full total=3\n").unwrap();
    assert_eq!(strata_tuning::memory_stalls_us(&host), None);
}
