//! Brokers in network namespaces for network faults: each host `i` is a namespace behind a
//! veth pair on a bridge (`ip netns` + veth), and iptables inside a host's namespace cuts or
//! thins its traffic. Needs root, iproute2 and iptables (scripts/test.sh installs them);
//! traffic only ever crosses the namespaces and bridge a test creates.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn sh(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

/// Panics with a clear message unless the test runs as root.
pub fn require_root() {
    // SAFETY: geteuid(2) has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test builds network namespaces: run it as root (CI does)"
    );
}

/// Namespaces `<tag>n<i>` with addresses `<subnet>.1<i>`, a bridge at `<subnet>.1`.
pub struct TestNet {
    tag: String,
    subnet: String,
    hosts: usize,
}

impl TestNet {
    pub fn create(hosts: usize) -> TestNet {
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

    pub fn namespace(&self, host: usize) -> String {
        format!("{}n{host}", self.tag)
    }

    pub fn ip(&self, host: usize) -> String {
        format!("{}.{}", self.subnet, 10 + host)
    }

    /// The bridge's address: the root namespace (etcd, the test's clients) as hosts see it.
    pub fn gateway(&self) -> String {
        format!("{}.1", self.subnet)
    }

    pub fn exec(&self, host: usize, program: &str, args: &[&str]) {
        let namespace = self.namespace(host);
        let mut full = vec!["netns", "exec", &namespace, program];
        full.extend_from_slice(args);
        sh("ip", &full);
    }

    /// Drops everything in and out of `host` except its own loopback traffic.
    pub fn isolate(&self, host: usize) {
        self.drop_rules(host, "-I");
    }

    pub fn heal(&self, host: usize) {
        self.drop_rules(host, "-D");
    }

    /// Cuts `host` off from the other hosts only: etcd and clients (the gateway) still reach it.
    pub fn isolate_from_peers(&self, host: usize) {
        for peer in (1..=self.hosts).filter(|peer| *peer != host) {
            let ip = self.ip(peer);
            self.exec(host, "iptables", &["-I", "INPUT", "-s", &ip, "-j", "DROP"]);
            self.exec(host, "iptables", &["-I", "OUTPUT", "-d", &ip, "-j", "DROP"]);
        }
    }

    /// Drops each packet in or out of `host` (loopback aside) with probability `loss`
    /// (iptables' statistic match: this kernel has no `tc netem`).
    pub fn lossy(&self, host: usize, loss: f64) {
        let probability = format!("{loss:.3}");
        for (chain, interface) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            self.exec(
                host,
                "iptables",
                &[
                    "-I",
                    chain,
                    "!",
                    interface,
                    "lo",
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &probability,
                    "-j",
                    "DROP",
                ],
            );
        }
    }

    /// Removes every rule inside `host`'s namespace: whatever cut or loss it had is gone.
    pub fn heal_all(&self, host: usize) {
        self.exec(host, "iptables", &["-F", "INPUT"]);
        self.exec(host, "iptables", &["-F", "OUTPUT"]);
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

/// `strata serve` inside a namespace, client port 7300 and replication port 7301 on the host's
/// address, one shard, on `etcd` with a 2 s lease.
pub struct NsNode {
    child: Option<Child>,
    command: Vec<String>,
    pub address: String,
}

impl NsNode {
    /// Broker `host` of cluster `cluster`, with `extra` serve flags.
    pub fn start(
        net: &TestNet,
        host: usize,
        etcd: &str,
        cluster: &str,
        data: &Path,
        extra: &[&str],
    ) -> NsNode {
        let ip = net.ip(host);
        let mut command = vec![
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
            cluster.into(),
            "--node-id".into(),
            host.to_string(),
            "--lease-ttl-ms".into(),
            "2000".into(),
        ];
        command.extend(extra.iter().map(|flag| flag.to_string()));
        let mut node = NsNode {
            child: None,
            command,
            address: format!("{ip}:7300"),
        };
        node.spawn();
        node
    }

    /// Starts the process (again, after `kill` or `stop`: same flags and data) and waits until
    /// it listens.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "the node still runs");
        // `ip netns exec` execs the program: the child is `strata serve` itself, so signals
        // reach it.
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

    /// SIGKILL: no clean shutdown, no flush.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait: a clean shutdown.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let status = child.wait().expect("wait");
            assert!(status.success(), "clean shutdown exits 0, got {status}");
        }
    }

    /// Sends a signal (SIGSTOP, SIGCONT, ...) to the node process.
    pub fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("the node runs");
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, signal) };
    }

    pub fn cli(&self, args: &[&str], stdin: Option<&str>) -> String {
        self.try_cli(args, stdin)
            .unwrap_or_else(|error| panic!("strata {args:?}: {error}"))
    }

    /// A client command against this node: its stdout, or its stderr when it failed.
    pub fn try_cli(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut child = super::strata()
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
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        Ok(String::from_utf8(output.stdout).unwrap())
    }

    pub fn describe(&self, topic: &str) -> serde_json::Value {
        serde_json::from_str(&self.cli(&["topic", "describe", topic, "--format", "json"], None))
            .unwrap()
    }

    pub fn cluster_info(&self) -> serde_json::Value {
        serde_json::from_str(&self.cli(&["cluster", "info", "--format", "json"], None)).unwrap()
    }

    /// The leader of `topic`'s `partition` as this node sees it (-1: none).
    pub fn leader(&self, topic: &str, partition: usize) -> i64 {
        self.describe(topic)["partitions"][partition]["leader"]
            .as_i64()
            .unwrap()
    }
}

impl Drop for NsNode {
    fn drop(&mut self) {
        self.kill();
    }
}
