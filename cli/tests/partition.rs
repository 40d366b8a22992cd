//! A network partition: three brokers, each in its own network namespace behind a bridge
//! (`ip netns` + veth), etcd on the bridge; iptables inside one namespace cuts its broker off
//! from everyone. Needs root, iproute2 and iptables (scripts/test.sh installs them); traffic
//! only ever crosses the namespaces and bridge this test creates.

mod support;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use strata_coordinator::testing::EtcdServer;
use support::netns::{NsNode, TestNet, require_root};
use support::wait_for_at_most;

/// The leader is cut off from its followers and from etcd. It loses leadership; a producer on
/// its side cannot get an `acks=all` write acknowledged; the majority elects a new leader and
/// goes on; once healed and restarted the old leader drops whatever it appended alone, and no
/// acknowledged write is lost.
#[test]
fn an_isolated_leader_loses_leadership_and_acknowledges_nothing() {
    require_root();
    let net = TestNet::create(3);
    let etcd = EtcdServer::start_also_on(&net.gateway());
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<NsNode> = (1..=3)
        .map(|host| {
            NsNode::start(
                &net,
                host,
                &etcd.endpoint,
                "netsplit",
                dirs[host - 1].path(),
                &[],
            )
        })
        .collect();
    wait_for_at_most("three brokers", Duration::from_secs(20), || {
        support::alive_brokers(&nodes[0].cluster_info()).len() == 3
    });
    nodes[0].cli(
        &[
            "topic",
            "create",
            "part",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--min-insync",
            "2",
        ],
        None,
    );
    let before: String = (0..100).map(|i| format!("before-{i}\n")).collect();
    let acked = nodes[0].cli(
        &["produce", "part", "--acks", "all", "--print-offsets"],
        Some(&before),
    );
    assert_eq!(acked.lines().count(), 100);

    let old = nodes[0].leader("part", 0) as usize;
    let majority: Vec<usize> = (1..=3).filter(|host| *host != old).collect();
    net.isolate(old);
    let cut_at = Instant::now();

    // A producer on the isolated side, talking to the old leader over its loopback.
    let mut minority = Command::new("ip")
        .args(["netns", "exec", &net.namespace(old)])
        .arg(env!("CARGO_BIN_EXE_strata"))
        .args(["produce", "part", "--acks", "all", "--print-offsets"])
        .env("STRATA_BOOTSTRAP", &nodes[old - 1].address)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = minority.stdin.take().unwrap();
        let lines: String = (0..50).map(|i| format!("minority-{i}\n")).collect();
        stdin.write_all(lines.as_bytes()).unwrap();
    }

    // The majority side elects a new leader and acknowledges writes.
    let observer_at = majority[0] - 1;
    let observer = &nodes[observer_at];
    wait_for_at_most(
        "a new leader on the majority side",
        Duration::from_secs(15),
        || {
            let leader = observer.leader("part", 0);
            leader > 0 && leader as usize != old
        },
    );
    println!(
        "leadership moved {:?} after the cut (lease TTL 2 s)",
        cut_at.elapsed()
    );
    let after: String = (0..100).map(|i| format!("after-{i}\n")).collect();
    let acked_after = observer.cli(
        &["produce", "part", "--acks", "all", "--print-offsets"],
        Some(&after),
    );
    assert_eq!(acked_after.lines().count(), 100);

    // Well past the lease: the minority producer got nothing acknowledged.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(cut_at.elapsed()));
    let _ = minority.kill();
    let _ = minority.wait();
    let mut minority_acks = String::new();
    minority
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut minority_acks)
        .unwrap();
    assert_eq!(
        minority_acks, "",
        "the isolated side acknowledged acks=all writes"
    );

    // Heal: the old leader takes a new lease, registers again and rejoins as a follower,
    // without a restart.
    net.heal(old);
    wait_for_at_most(
        "the old leader back in the ISR",
        Duration::from_secs(20),
        || {
            observer.describe("part")["partitions"][0]["isr"]
                .as_array()
                .unwrap()
                .len()
                == 3
        },
    );
    let consumed = observer.cli(
        &[
            "consume",
            "part",
            "--from-beginning",
            "--max-messages",
            "200",
        ],
        None,
    );
    let lines: Vec<&str> = consumed.lines().collect();
    assert_eq!(lines.len(), 200);
    for i in 0..100 {
        assert_eq!(
            lines
                .iter()
                .filter(|l| **l == format!("before-{i}"))
                .count(),
            1
        );
        assert_eq!(
            lines.iter().filter(|l| **l == format!("after-{i}")).count(),
            1
        );
    }
    assert!(!consumed.contains("minority"), "{consumed}");
    // The old leader's own copy has the majority's history, not its lonely appends.
    for node in &mut nodes {
        node.kill();
    }
    let old_log =
        std::fs::read(dirs[old - 1].path().join("part-0/00000000000000000000.log")).unwrap();
    let text = String::from_utf8_lossy(&old_log);
    assert!(
        !text.contains("minority"),
        "the old leader kept records it appended alone"
    );
    assert!(text.contains("after-99"), "the old leader caught up");
    drop(nodes);
    drop(etcd);
    drop(net);
}
