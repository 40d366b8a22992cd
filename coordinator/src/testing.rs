//! A real etcd for tests: started on free loopback ports with a temporary data dir, stopped (and
//! its data removed) on drop. Needs the `etcd` binary (Debian `etcd-server`).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdServer {
    child: Child,
    pub endpoint: String,
    data: tempfile::TempDir,
    ports: (u16, u16),
    /// Also serves clients on this address (a test network's bridge), if set.
    also_on: Option<String>,
}

/// A port free now, from a range picked by process id and a counter, so concurrent test
/// processes (nextest runs each test in its own) do not hand the same port to two etcds.
fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let base = 42_000 + (std::process::id() % 900) as u16 * 20;
    loop {
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 20;
        let port = base + offset;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl EtcdServer {
    pub fn start() -> EtcdServer {
        EtcdServer::start_with(None)
    }

    /// Serves clients on `ip` as well as loopback (for brokers in network namespaces behind a
    /// bridge at `ip`); `endpoint` names `ip`.
    pub fn start_also_on(ip: &str) -> EtcdServer {
        EtcdServer::start_with(Some(ip.to_string()))
    }

    /// Free ports are only free when probed: another test may take one before etcd binds it.
    /// Then this etcd exits, and it starts again on other ports.
    fn start_with(also_on: Option<String>) -> EtcdServer {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let data = tempfile::tempdir().expect("temp dir");
            let (client, peer) = (free_port(), free_port());
            let child = spawn(data.path(), client, peer, also_on.as_deref());
            let host = also_on.clone().unwrap_or_else(|| "127.0.0.1".into());
            let mut server = EtcdServer {
                child,
                endpoint: format!("http://{host}:{client}"),
                data,
                ports: (client, peer),
                also_on: also_on.clone(),
            };
            match server.wait_healthy() {
                Ok(()) => return server,
                Err(why) if attempts < 5 => eprintln!("etcd: {why}; again on other ports"),
                Err(why) => panic!("etcd did not start: {why}"),
            }
        }
    }

    /// Kills etcd and starts it again on the same ports and data: a restart of the control
    /// plane that keeps its state.
    pub fn restart(self) -> EtcdServer {
        let mut this = self;
        let _ = this.child.kill();
        let _ = this.child.wait();
        let (client, peer) = this.ports;
        this.child = spawn(this.data.path(), client, peer, this.also_on.as_deref());
        this.wait_ready()
    }

    async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint.as_str()], None)
            .await
            .expect("connect to etcd")
    }

    /// Deletes every key under `prefix` and returns how many there were: tests stand for a
    /// writer that stopped half way with it.
    pub async fn delete_prefix(&self, prefix: &str) -> i64 {
        self.client()
            .await
            .delete(
                prefix,
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .expect("delete from etcd")
            .deleted()
    }

    /// How many keys are under `prefix`.
    pub async fn count_prefix(&self, prefix: &str) -> i64 {
        self.client()
            .await
            .get(
                prefix,
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .expect("count in etcd")
            .count()
    }

    /// The bytes of every key and value under `prefix`: what one read of it moves.
    pub async fn prefix_bytes(&self, prefix: &str) -> usize {
        self.client()
            .await
            .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .expect("read from etcd")
            .kvs()
            .iter()
            .map(|kv| kv.key().len() + kv.value().len())
            .sum()
    }

    /// The bytes etcd has sent its gRPC clients so far (its own metric).
    pub fn sent_bytes(&self) -> u64 {
        self.metric("etcd_network_client_grpc_sent_bytes_total") as u64
    }

    /// The sum of etcd's own metric `series` (a name, or a name with its labels' start, as
    /// `/metrics` spells it: `grpc_server_handled_total{grpc_code="OK",grpc_method="Txn"`).
    pub fn metric(&self, series: &str) -> f64 {
        use std::io::{Read, Write};
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", self.ports.0)).expect("etcd metrics");
        write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").expect("etcd metrics request");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("etcd metrics");
        text.lines()
            .filter(|line| line.starts_with(series))
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// The etcd process's id (to pause it with SIGSTOP: an outage that keeps its state).
    /// Where this etcd keeps its data (its WAL and its database).
    pub fn data_dir(&self) -> &std::path::Path {
        self.data.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(self) -> EtcdServer {
        let mut server = self;
        if let Err(why) = server.wait_healthy() {
            panic!("etcd did not start again: {why}");
        }
        server
    }

    /// Waits until this etcd process answers its own `/health` with `true`: a port that
    /// accepts connections may belong to another process.
    fn wait_healthy(&mut self) -> Result<(), String> {
        let (client, peer) = self.ports;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return Err(format!("it exited (port {client} or {peer} taken?)"));
            }
            if health_is_true(client) && matches!(self.child.try_wait(), Ok(None)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err("no healthy answer within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether the etcd on 127.0.0.1:`port` answers `GET /health` with `"health":"true"`.
fn health_is_true(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET /health HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.contains("\"health\":\"true\"")
}

fn spawn(data: &std::path::Path, client: u16, peer: u16, also_on: Option<&str>) -> Child {
    let mut listen = format!("http://127.0.0.1:{client}");
    let mut advertise = listen.clone();
    if let Some(ip) = also_on {
        listen.push_str(&format!(",http://{ip}:{client}"));
        advertise = format!("http://{ip}:{client}");
    }
    Command::new("etcd")
        .args(["--name", "strata-test"])
        .arg("--data-dir")
        .arg(data)
        .args(["--listen-client-urls", &listen])
        .args(["--advertise-client-urls", &advertise])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args([
            "--initial-cluster",
            &format!("strata-test=http://127.0.0.1:{peer}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd (Debian package etcd-server)")
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real etcd cluster of several members on loopback, for tests of member failures: each
/// member can be killed and started again on its ports and data.
pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    /// Every member's client URL, in member order.
    pub endpoints: Vec<String>,
    data: tempfile::TempDir,
    ports: Vec<(u16, u16)>,
}

impl EtcdCluster {
    pub fn start(size: usize) -> EtcdCluster {
        let data = tempfile::tempdir().expect("temp dir");
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free_port(), free_port())).collect();
        let mut cluster = EtcdCluster {
            members: (0..size).map(|_| None).collect(),
            endpoints: ports
                .iter()
                .map(|(client, _)| format!("http://127.0.0.1:{client}"))
                .collect(),
            data,
            ports,
        };
        for member in 0..size {
            cluster.spawn(member, "new");
        }
        for member in 0..size {
            cluster.wait_listening(member);
        }
        cluster
    }

    /// The client endpoints joined with commas, as `strata serve --etcd` takes them.
    pub fn endpoint_list(&self) -> String {
        self.endpoints.join(",")
    }

    fn spawn(&mut self, member: usize, state: &str) {
        let initial: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let (client, peer) = self.ports[member];
        let child = Command::new("etcd")
            .args(["--name", &format!("m{member}")])
            .arg("--data-dir")
            .arg(self.data.path().join(format!("m{member}")))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
            ])
            .args([
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", state])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (Debian package etcd-server)");
        self.members[member] = Some(child);
    }

    fn wait_listening(&mut self, member: usize) {
        let (client, _) = self.ports[member];
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(
                Instant::now() < deadline,
                "etcd member {member} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL one member.
    pub fn kill(&mut self, member: usize) {
        if let Some(mut child) = self.members[member].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed member again on its ports and data.
    pub fn restart(&mut self, member: usize) {
        assert!(self.members[member].is_none(), "member {member} still runs");
        self.spawn(member, "existing");
        self.wait_listening(member);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in 0..self.members.len() {
            self.kill(member);
        }
    }
}
