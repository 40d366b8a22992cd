//! Each parser over the captured files of the fixture hosts.

use std::path::Path;

use strata_tuning::parse::{self, Limit, LimitValue};

fn read(host: &str, path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(host)
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

#[test]
fn limits() {
    let limits = parse::parse_limits(&read("nvme-host", "proc/self/limits"));
    assert_eq!(limits.len(), 16);
    assert_eq!(
        limits["Max open files"],
        Limit {
            soft: LimitValue::Finite(1024),
            hard: LimitValue::Finite(524288)
        }
    );
    assert_eq!(limits["Max locked memory"].soft, LimitValue::Unlimited);
    let vm = parse::parse_limits(&read("vm-host", "proc/self/limits"));
    assert_eq!(vm["Max locked memory"].soft, LimitValue::Finite(65536));
    assert!(!vm["Max locked memory"].soft.at_least(64 << 20));
}

#[test]
fn mountinfo() {
    let mounts = parse::parse_mountinfo(&read("nvme-host", "proc/self/mountinfo"));
    assert_eq!(mounts.len(), 11);
    let data = parse::mount_for(&mounts, "/var/lib/strata/orders-0").expect("a mount");
    assert_eq!(
        (
            data.device.as_str(),
            data.fs_type.as_str(),
            data.source.as_str()
        ),
        ("259:3", "xfs", "/dev/nvme0n1p3")
    );
    assert!(data.options.contains(&"noatime".to_string()));
    assert!(data.options.contains(&"logbsize=32k".to_string()));

    let mounts = parse::parse_mountinfo(&read("vm-host", "proc/self/mountinfo"));
    let root = parse::mount_for(&mounts, "/var/lib/strata").expect("a mount");
    assert_eq!(
        (root.mount_point.as_str(), root.fs_type.as_str()),
        ("/", "ext4")
    );
    // ext4's discard is a super option, after the " - ".
    assert!(root.options.contains(&"discard".to_string()));
    assert!(root.options.contains(&"relatime".to_string()));
}

#[test]
fn schedulers_and_choices() {
    let nvme = read("nvme-host", "sys/block/nvme0n1/queue/scheduler");
    assert_eq!(
        parse::scheduler(&nvme),
        Some(("none".into(), vec!["none".into(), "mq-deadline".into()]))
    );
    let vm = read("vm-host", "sys/block/vda/queue/scheduler");
    assert_eq!(
        parse::scheduler(&vm).map(|(a, _)| a).as_deref(),
        Some("mq-deadline")
    );
    let thp = read("nvme-host", "sys/kernel/mm/transparent_hugepage/enabled");
    assert_eq!(
        parse::scheduler(&thp).map(|(a, _)| a).as_deref(),
        Some("always")
    );
    let defrag = read("vm-host", "sys/kernel/mm/transparent_hugepage/defrag");
    let (active, choices) = parse::scheduler(&defrag).expect("a choice");
    assert_eq!((active.as_str(), choices.len()), ("always", 5));
}

#[test]
fn interrupts() {
    let irqs = parse::parse_interrupts(&read("nvme-host", "proc/interrupts"));
    assert!(irqs.iter().all(|line| line.counts.len() == 8));
    let nvme: Vec<_> = irqs
        .iter()
        .filter(|line| line.names.iter().any(|name| name.starts_with("nvme0q")))
        .collect();
    assert_eq!(nvme.len(), 9, "admin queue plus 8 IO queues");
    assert_eq!(nvme[0].irq, 124);
    // Each IO queue's interrupts land on its own CPU.
    for (queue, line) in nvme.iter().enumerate().skip(1) {
        let busy: Vec<usize> = (0..8).filter(|&cpu| line.counts[cpu] > 0).collect();
        assert_eq!(busy, [queue - 1]);
    }
    let shared = irqs.iter().find(|line| line.irq == 16).expect("irq 16");
    assert_eq!(shared.names, ["ehci_hcd:usb1", "i801_smbus"]);

    let vm = parse::parse_interrupts(&read("vm-host", "proc/interrupts"));
    let devices: Vec<String> = vm
        .iter()
        .flat_map(|line| line.names.iter().filter_map(|name| parse::irq_device(name)))
        .collect();
    assert_eq!(
        devices,
        [
            "virtio0", "virtio0", "virtio0", "virtio0", "virtio1", "virtio1"
        ]
    );
}

#[test]
fn cpu_lists_uevents_and_versions() {
    assert_eq!(
        parse::parse_cpu_list(&read("nvme-host", "sys/devices/system/cpu/online")),
        Some((0..8).collect())
    );
    assert_eq!(
        parse::parse_cpu_list(&read("nvme-host", "proc/irq/124/smp_affinity_list")),
        Some((0..8).collect())
    );
    let uevent = parse::parse_uevent(&read("nvme-host", "sys/dev/block/259:3/uevent"));
    assert_eq!(uevent["DEVNAME"], "nvme0n1p3");
    assert_eq!(uevent["DEVTYPE"], "partition");
    assert_eq!(
        parse::kernel_version(&read("vm-host", "proc/sys/kernel/osrelease")),
        Some((5, 15))
    );
}
