//! A network partition: three brokers, each in its own network namespace behind a bridge
//! (`ip netns` + veth), etcd on the bridge; iptables inside one namespace cuts its broker off
//! from everyone. Needs root, iproute2 and iptables (scripts/test.sh installs them); traffic
//! only ever crosses the namespaces and bridge this test creates.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata_coordinator::testing::EtcdServer;
use support::{strata, wait_for_at_most};

fn sh(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

/// Namespaces `<tag>n<i>` with addresses `<subnet>.1<i>`, a bridge at `<subnet>.1`.
struct TestNet {
    tag: String,
    subnet: String,
    hosts: usize,
}

impl TestNet {
    fn create(hosts: usize) -> TestNet {
        let pid = std::process::id();
        let tag = format!("st{}", pid % 100_000);
        let subnet = format!("10.{}.{}", 200 + pid % 50, (pid / 50) % 250);
        let net = TestNet { tag, subnet, hosts };
        let bridge = net.bridge();
        sh("ip", &["link", "add", &bridge, "type", "bridge"]);
        sh(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}.1/24", net.subnet),
                "dev",
                &bridge,
            ],
        );
        sh("ip", &["link", "set", &bridge, "up"]);
        for host in 1..=hosts {
            let namespace = net.namespace(host);
            let (outside, inside) = (format!("{}h{host}", net.tag), format!("{}v{host}", net.tag));
            sh("ip", &["netns", "add", &namespace]);
            sh(
                "ip",
                &[
                    "link", "add", &outside, "type", "veth", "peer", "name", &inside,
                ],
            );
            sh("ip", &["link", "set", &inside, "netns", &namespace]);
            sh("ip", &["link", "set", &outside, "master", &bridge]);
            sh("ip", &["link", "set", &outside, "up"]);
            let address = format!("{}/24", net.ip(host));
            net.exec(host, "ip", &["addr", "add", &address, "dev", &inside]);
            net.exec(host, "ip", &["link", "set", &inside, "up"]);
            net.exec(host, "ip", &["link", "set", "lo", "up"]);
        }
        net
    }

    fn bridge(&self) -> String {
        format!("{}b", self.tag)
    }

    fn namespace(&self, host: usize) -> String {
        format!("{}n{host}", self.tag)
    }

    fn ip(&self, host: usize) -> String {
        format!("{}.{}", self.subnet, 10 + host)
    }

    fn gateway(&self) -> String {
        format!("{}.1", self.subnet)
    }

    fn exec(&self, host: usize, program: &str, args: &[&str]) {
        let namespace = self.namespace(host);
        let mut full = vec!["netns", "exec", &namespace, program];
        full.extend_from_slice(args);
        sh("ip", &full);
    }

    /// Drops everything in and out of `host` except its own loopback traffic.
    fn isolate(&self, host: usize) {
        self.drop_rules(host, "-I");
    }

    fn heal(&self, host: usize) {
        self.drop_rules(host, "-D");
    }

    /// Inserts (`-I`) or deletes (`-D`) the two rules that cut `host` off.
    fn drop_rules(&self, host: usize, action: &str) {
        for (chain, interface) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            self.exec(
                host,
                "iptables",
                &[action, chain, "!", interface, "lo", "-j", "DROP"],
            );
        }
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for host in 1..=self.hosts {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.namespace(host)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge()])
            .status();
    }
}

/// `strata serve` inside a namespace.
struct NsNode {
    child: Option<Child>,
    command: Vec<String>,
    address: String,
}

impl NsNode {
    fn start(net: &TestNet, host: usize, etcd: &str, data: &Path) -> NsNode {
        let ip = net.ip(host);
        let command = vec![
            "netns".to_string(),
            "exec".into(),
            net.namespace(host),
            env!("CARGO_BIN_EXE_strata").into(),
            "serve".into(),
            "--data-dir".into(),
            data.display().to_string(),
            "--listen".into(),
            format!("{ip}:7300"),
            "--replication".into(),
            format!("{ip}:7301"),
            "--advertised-host".into(),
            ip.clone(),
            "--shards".into(),
            "1".into(),
            "--etcd".into(),
            etcd.into(),
            "--cluster".into(),
            "netsplit".into(),
            "--node-id".into(),
            host.to_string(),
            "--lease-ttl-ms".into(),
            "2000".into(),
        ];
        let mut node = NsNode {
            child: None,
            command,
            address: format!("{ip}:7300"),
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        self.child = Some(
            Command::new("ip")
                .args(&self.command)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn strata serve in a namespace"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&self.address).is_err() {
            assert!(Instant::now() < deadline, "{} did not start", self.address);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn cli(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut child = strata()
            .args(args)
            .env("STRATA_BOOTSTRAP", &self.address)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.unwrap_or("").as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "strata {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::from_str(&self.cli(&["topic", "describe", "part", "--format", "json"], None))
            .unwrap()
    }

    fn leader(&self) -> i64 {
        self.describe()["partitions"][0]["leader"].as_i64().unwrap()
    }
}

impl Drop for NsNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The leader is cut off from its followers and from etcd. It loses leadership; a producer on
/// its side cannot get an `acks=all` write acknowledged; the majority elects a new leader and
/// goes on; once healed and restarted the old leader drops whatever it appended alone, and no
/// acknowledged write is lost.
#[test]
fn an_isolated_leader_loses_leadership_and_acknowledges_nothing() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test builds network namespaces: run it as root (CI does)"
    );
    let net = TestNet::create(3);
    let etcd = EtcdServer::start_also_on(&net.gateway());
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<NsNode> = (1..=3)
        .map(|host| NsNode::start(&net, host, &etcd.endpoint, dirs[host - 1].path()))
        .collect();
    wait_for_at_most("three brokers", Duration::from_secs(20), || {
        let info: serde_json::Value =
            serde_json::from_str(&nodes[0].cli(&["cluster", "info", "--format", "json"], None))
                .unwrap();
        support::alive_brokers(&info).len() == 3
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

    let old = nodes[0].leader() as usize;
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
            let leader = observer.leader();
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
            observer.describe()["partitions"][0]["isr"]
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
