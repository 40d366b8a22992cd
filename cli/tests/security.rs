//! TLS and SASL on the Kafka listener, seen from real clients: kcat (librdkafka 2.0.2),
//! confluent-kafka (librdkafka 2.16), kafka-python and kafkajs produce and consume in a group
//! over `sasl_ssl` with SCRAM-SHA-512 and over `ssl` with a client certificate, against
//! certificates openssl makes here; and each refusal a client can meet is met: plaintext to a
//! TLS port, a wrong CA, a wrong password, an unknown user, a certificate from another CA, a
//! request before authentication, a huge frame before authentication.

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{TestNode, free_base_port};

/// A CA with a broker certificate (for 127.0.0.1) and a client certificate (CN=alice), made
/// with Debian's openssl.
struct Pki {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl (Debian's openssl)");
    assert!(status.success(), "openssl {args:?} failed");
}

impl Pki {
    /// A CA named `name` and its certificates in `dir`.
    fn new(dir: &Path, name: &str) -> Pki {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        std::fs::write(
            dir.join("broker.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("client.ext"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        for (who, subject) in [
            ("broker", "/CN=localhost"),
            ("client", "/O=acme/OU=eng/CN=alice"),
        ] {
            openssl(
                &dir,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &format!("{who}.key"),
                    "-out",
                    &format!("{who}.csr"),
                    "-subj",
                    subject,
                ],
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{who}.csr"),
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &format!("{who}.pem"),
                    "-days",
                    "2",
                    "-extfile",
                    &format!("{who}.ext"),
                ],
            );
        }
        Pki { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

const ADMIN_PASSWORD: &str = "bootstrap-secret-8d1f";

/// A node with `sasl_ssl`, `ssl` and `plaintext` Kafka listeners, the bootstrap user `admin`,
/// and client certificates asked for as `client_auth` says: (node, sasl_ssl, ssl, plaintext).
fn secured_node(
    dir: &Path,
    pki: &Pki,
    client_auth: &str,
    extra: &[&str],
) -> (TestNode, String, String, String) {
    let [sasl_ssl, ssl, plaintext] = [0, 0, 0].map(|_| format!("127.0.0.1:{}", free_base_port(0)));
    let listeners = format!("sasl_ssl://{sasl_ssl},ssl://{ssl},plaintext://{plaintext}");
    let (cert, key, ca) = (
        pki.path("broker.pem"),
        pki.path("broker.key"),
        pki.path("ca.pem"),
    );
    let mut args = vec![
        "--kafka-listen",
        &listeners,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca,
        "--tls-client-auth",
        client_auth,
        "--sasl-mechanisms",
        "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
    ];
    args.extend_from_slice(extra);
    let bootstrap_user = format!("admin:{ADMIN_PASSWORD}");
    let node = TestNode::start_with_env(
        &dir.join("data"),
        2,
        &args,
        &[("STRATA_BOOTSTRAP_USER", &bootstrap_user)],
    );
    (node, sasl_ssl, ssl, plaintext)
}

fn scram(pki: &Pki, user: &str, password: &str) -> serde_json::Value {
    serde_json::json!({
        "protocol": "SASL_SSL", "mechanism": "SCRAM-SHA-512", "user": user,
        "password": password, "ca": pki.path("ca.pem"),
    })
}

fn mtls(pki: &Pki, client: &Pki) -> serde_json::Value {
    serde_json::json!({
        "protocol": "SSL", "ca": pki.path("ca.pem"),
        "cert": client.path("client.pem"), "key": client.path("client.key"),
    })
}

/// kcat's `-X` settings for `security` (as `clients.py` takes it).
fn kcat_settings(security: &serde_json::Value) -> Vec<String> {
    let mut settings = vec![format!(
        "security.protocol={}",
        security["protocol"].as_str().unwrap()
    )];
    for (field, setting) in [
        ("mechanism", "sasl.mechanisms"),
        ("user", "sasl.username"),
        ("password", "sasl.password"),
        ("ca", "ssl.ca.location"),
        ("cert", "ssl.certificate.location"),
        ("key", "ssl.key.location"),
    ] {
        if let Some(value) = security[field].as_str() {
            settings.push(format!("{setting}={value}"));
        }
    }
    settings
        .into_iter()
        .flat_map(|setting| ["-X".to_string(), setting])
        .collect()
}

/// Produces three records with kcat and reads them back; `Err` has kcat's complaint.
fn kcat_round_trip(
    bootstrap: &str,
    topic: &str,
    security: &serde_json::Value,
) -> Result<Vec<String>, String> {
    let settings = kcat_settings(security);
    let mut producer = support::kcat_command()
        .args([
            "-b",
            bootstrap,
            "-P",
            "-t",
            topic,
            "-X",
            "message.timeout.ms=10000",
        ])
        .args(&settings)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat (Debian's kcat)");
    producer
        .stdin
        .take()
        .unwrap()
        .write_all(b"one\ntwo\nthree\n")
        .unwrap();
    let produced = producer.wait_with_output().unwrap();
    let complaint = String::from_utf8_lossy(&produced.stderr).to_string();
    if !produced.status.success() || complaint.contains("ERROR") {
        return Err(complaint);
    }
    let consumed = support::kcat_command()
        .args([
            "-b",
            bootstrap,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-m",
            "10",
        ])
        .args(&settings)
        .output()
        .unwrap();
    if !consumed.status.success() {
        return Err(String::from_utf8_lossy(&consumed.stderr).to_string());
    }
    Ok(String::from_utf8_lossy(&consumed.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// `SecureRoundTrip.java` compiled against the Java client into `out`: the classpath to run
/// it with.
fn java_classpath(out: &Path) -> String {
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/security/SecureRoundTrip.java"
    );
    support::java_classpath(source, out)
}

/// `security` (as `clients.py` takes it) as the Java client's properties.
fn java_properties(security: &serde_json::Value, dir: &Path) -> PathBuf {
    let mut lines = vec![format!(
        "security.protocol={}",
        security["protocol"].as_str().unwrap()
    )];
    if let Some(mechanism) = security["mechanism"].as_str() {
        lines.push(format!("sasl.mechanism={mechanism}"));
        lines.push(format!(
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"{}\" password=\"{}\";",
            security["user"].as_str().unwrap(),
            security["password"].as_str().unwrap()
        ));
    }
    if let Some(ca) = security["ca"].as_str() {
        lines.push("ssl.truststore.type=PEM".into());
        lines.push(format!("ssl.truststore.location={ca}"));
    }
    if let (Some(cert), Some(key)) = (security["cert"].as_str(), security["key"].as_str()) {
        // The Java client takes a PEM key store as the key and its certificate in one file.
        let keystore = dir.join("java-keystore.pem");
        let mut pem = std::fs::read(key).unwrap();
        pem.extend(std::fs::read(cert).unwrap());
        std::fs::write(&keystore, pem).unwrap();
        lines.push("ssl.keystore.type=PEM".into());
        lines.push(format!("ssl.keystore.location={}", keystore.display()));
    }
    let path = dir.join(format!("java-{}.properties", lines.len()));
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// A round trip through `library` (`confluent`, `kafka-python`, `kafkajs`, `java` with the
/// classpath of [`java_classpath`]): its JSON.
fn client_round_trip(
    library: &str,
    bootstrap: &str,
    topic: &str,
    group: &str,
    security: &serde_json::Value,
) -> serde_json::Value {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/security");
    let mut command = if let Some(classpath) = library.strip_prefix("java:") {
        let dir = tempfile::tempdir().unwrap().keep();
        let properties = java_properties(security, &dir);
        let mut command = Command::new("java");
        command.args(["-cp", classpath, "SecureRoundTrip"]);
        let output = command
            .args([bootstrap, topic, group, &properties.display().to_string()])
            .stderr(Stdio::null())
            .output()
            .expect("java (Debian's default-jdk-headless)");
        assert!(output.status.success(), "the Java round trip crashed");
        return serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
            panic!(
                "java printed {:?}: {error}",
                String::from_utf8_lossy(&output.stdout)
            )
        });
    } else if library == "kafkajs" {
        let modules = std::env::var("STRATA_KAFKAJS_DIR")
            .unwrap_or_else(|_| "/var/tmp/strata-kafkajs".to_string());
        let mut command = Command::new("node");
        command
            .arg(format!("{dir}/kafkajs.js"))
            .env("NODE_PATH", Path::new(&modules).join("node_modules"))
            .env("KAFKAJS_NO_PARTITIONER_WARNING", "1");
        command
    } else {
        let mut command = Command::new("python3");
        command.arg(format!("{dir}/clients.py")).arg(library);
        command
    };
    let output = command
        .args([bootstrap, topic, group, &security.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 / node with the Kafka clients (scripts/test.sh installs them)");
    assert!(output.status.success(), "the {library} round trip crashed");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{library} printed {:?}: {error}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

fn values(result: &serde_json::Value) -> Vec<String> {
    result["values"]
        .as_array()
        .unwrap_or_else(|| panic!("no values: {result}"))
        .iter()
        .map(|value| value.as_str().unwrap().to_string())
        .collect()
}

/// Every client library produces and consumes in a group over `sasl_ssl` with SCRAM-SHA-512
/// (as the bootstrap user) and over `ssl` with a client certificate; each request is answered
/// on the listener it came through (Metadata and FindCoordinator name the same listener on
/// every broker).
#[test]
fn every_kafka_client_round_trips_over_sasl_ssl_and_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (node, sasl_ssl, ssl, _) = secured_node(dir.path(), &pki, "required", &[]);
    let admin = scram(&pki, "admin", ADMIN_PASSWORD);
    let certificate = mtls(&pki, &pki);
    let java = format!("java:{}", java_classpath(dir.path()));
    for (i, library) in ["kcat", "confluent", "kafka-python", "kafkajs", &java]
        .iter()
        .enumerate()
    {
        for (protocol, bootstrap, security) in
            [("sasl", &sasl_ssl, &admin), ("mtls", &ssl, &certificate)]
        {
            let topic = format!("{protocol}-{i}");
            node.cli(&["topic", "create", &topic, "--partitions", "2"], None);
            let mut seen = if *library == "kcat" {
                kcat_round_trip(bootstrap, &topic, security)
                    .unwrap_or_else(|why| panic!("kcat over {protocol}: {why}"))
            } else {
                values(&client_round_trip(
                    library,
                    bootstrap,
                    &topic,
                    &format!("g-{topic}"),
                    security,
                ))
            };
            seen.sort();
            assert_eq!(seen, ["one", "three", "two"], "{library} over {protocol}");
        }
    }
}

/// What a client that may not come in meets, each as the client reports it.
#[test]
fn refusals_are_seen_by_real_clients() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let other = Pki::new(dir.path(), "other-ca");
    let (node, sasl_ssl, ssl, _) = secured_node(dir.path(), &pki, "required", &[]);
    node.cli(&["topic", "create", "guarded"], None);
    let java = format!("java:{}", java_classpath(dir.path()));

    // A wrong password and an unknown user: SASL_AUTHENTICATION_FAILED, in the client's words.
    for (user, password) in [("admin", "not-the-password"), ("nobody", ADMIN_PASSWORD)] {
        let why = kcat_round_trip(&sasl_ssl, "guarded", &scram(&pki, user, password)).unwrap_err();
        assert!(
            why.contains("Authentication failed"),
            "kcat as {user}: {why}"
        );
        for library in ["confluent", &java] {
            let refused = client_round_trip(
                library,
                &sasl_ssl,
                "guarded",
                "g",
                &scram(&pki, user, password),
            );
            let error = refused["error"]
                .as_str()
                .unwrap_or_else(|| panic!("{refused}"));
            assert!(
                error.contains("Authentication failed"),
                "{library} as {user}: {error}"
            );
        }
    }
    // Plaintext to a TLS port.
    let plaintext = serde_json::json!({"protocol": "PLAINTEXT"});
    assert!(kcat_round_trip(&ssl, "guarded", &plaintext).is_err());
    // A client that trusts another CA does not take the broker's certificate.
    let wrong_ca = serde_json::json!({
        "protocol": "SASL_SSL", "mechanism": "SCRAM-SHA-512", "user": "admin",
        "password": ADMIN_PASSWORD, "ca": other.path("ca.pem"),
    });
    let why = kcat_round_trip(&sasl_ssl, "guarded", &wrong_ca).unwrap_err();
    assert!(why.contains("certificate verify failed"), "{why}");
    // A client certificate from another CA, or none, where one is required.
    assert!(kcat_round_trip(&ssl, "guarded", &mtls(&pki, &other)).is_err());
    let no_certificate = serde_json::json!({"protocol": "SSL", "ca": pki.path("ca.pem")});
    assert!(kcat_round_trip(&ssl, "guarded", &no_certificate).is_err());
    // The broker took none of it.
    assert_eq!(support::stored_records(&node, "guarded"), 0);
    // And it still serves the right client.
    assert_eq!(
        kcat_round_trip(&sasl_ssl, "guarded", &scram(&pki, "admin", ADMIN_PASSWORD))
            .unwrap()
            .len(),
        3
    );
}

/// A node with one `sasl_plaintext` Kafka listener, the bootstrap user and `extra` flags:
/// (node, listener).
fn sasl_plaintext_node(dir: &Path, extra: &[&str]) -> (TestNode, String) {
    let pki = Pki::new(dir, "ca");
    let listener = format!("127.0.0.1:{}", free_base_port(0));
    let bootstrap_user = format!("admin:{ADMIN_PASSWORD}");
    let kafka = format!("sasl_plaintext://{listener}");
    let (cert, key, ca) = (
        pki.path("broker.pem"),
        pki.path("broker.key"),
        pki.path("ca.pem"),
    );
    let mut args = vec![
        "--kafka-listen",
        &kafka,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca,
    ];
    args.extend_from_slice(extra);
    let node = TestNode::start_with_env(
        &dir.join("data"),
        1,
        &args,
        &[("STRATA_BOOTSTRAP_USER", &bootstrap_user)],
    );
    (node, listener)
}

/// A request before authentication closes the connection, and so does a frame length no
/// unauthenticated peer may send (nothing is allocated for it); the broker serves on.
#[test]
fn an_unauthenticated_peer_gets_nothing_but_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (node, sasl_plaintext) = sasl_plaintext_node(dir.path(), &[]);
    node.cli(&["topic", "create", "hidden"], None);
    // Metadata v1 for every topic, correlation id 7, client id "x".
    let metadata = [0u8, 3, 0, 1, 0, 0, 0, 7, 0, 1, b'x', 0xff, 0xff, 0xff, 0xff];
    let mut frame = (metadata.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&metadata);
    let closed = |bytes: &[u8]| {
        let mut stream = std::net::TcpStream::connect(&sasl_plaintext).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        stream.write_all(bytes).unwrap();
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        read.is_ok() && answer.is_empty()
    };
    assert!(
        closed(&frame),
        "Metadata before authentication is not answered"
    );
    assert!(
        closed(&(1u32 << 30).to_be_bytes()),
        "a 1 GiB frame before authentication"
    );
    // The SASL client that follows the rules still gets in.
    let security = serde_json::json!({
        "protocol": "SASL_PLAINTEXT", "mechanism": "SCRAM-SHA-256", "user": "admin",
        "password": ADMIN_PASSWORD,
    });
    assert_eq!(
        kcat_round_trip(&sasl_plaintext, "hidden", &security)
            .unwrap()
            .len(),
        3
    );
}

/// New certificate files are taken without a restart: after the broker's files are replaced
/// by ones from another CA, clients trusting the new CA connect and those trusting the old one
/// do not.
#[test]
fn certificates_rotate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let live = Pki::new(dir.path(), "live");
    let next = Pki::new(dir.path(), "next");
    let (node, sasl_ssl, _, _) = secured_node(dir.path(), &live, "none", &[]);
    node.cli(&["topic", "create", "rotating"], None);
    let first_ca = dir.path().join("first-ca.pem");
    std::fs::copy(live.dir.join("ca.pem"), &first_ca).unwrap();
    let trusting = |ca: &Path| {
        serde_json::json!({
            "protocol": "SASL_SSL", "mechanism": "SCRAM-SHA-512", "user": "admin",
            "password": ADMIN_PASSWORD, "ca": ca.display().to_string(),
        })
    };
    assert!(kcat_round_trip(&sasl_ssl, "rotating", &trusting(&first_ca)).is_ok());
    for file in ["broker.pem", "broker.key", "ca.pem"] {
        std::fs::copy(next.dir.join(file), live.dir.join(file)).unwrap();
    }
    support::wait_for("the broker to present the new certificate", || {
        kcat_round_trip(&sasl_ssl, "rotating", &trusting(&next.dir.join("ca.pem"))).is_ok()
    });
    assert!(kcat_round_trip(&sasl_ssl, "rotating", &trusting(&first_ca)).is_err());
}

/// Fails if any file under `root` holds `secret`.
fn assert_nowhere_on_disk(root: &Path, secret: &str) {
    let mut files = vec![root.to_path_buf()];
    let mut checked = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .unwrap()
                    .map(|entry| entry.unwrap().path()),
            );
        } else if let Ok(bytes) = std::fs::read(&path) {
            checked += 1;
            assert!(
                !bytes
                    .windows(secret.len())
                    .any(|window| window == secret.as_bytes()),
                "{} holds the password",
                path.display()
            );
        }
    }
    assert!(checked > 0, "no file under {}", root.display());
}

/// The bootstrap user's password is nowhere on disk: the data directory keeps salted keys.
#[test]
fn no_password_is_kept_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (node, sasl_ssl, _, _) = secured_node(dir.path(), &pki, "none", &[]);
    node.cli(&["topic", "create", "t"], None);
    assert!(kcat_round_trip(&sasl_ssl, "t", &scram(&pki, "admin", ADMIN_PASSWORD)).is_ok());
    assert_nowhere_on_disk(&dir.path().join("data"), ADMIN_PASSWORD);
}

/// confluent-kafka's AdminClient (`security/admin.py`) as `security`: its JSON.
fn kafka_admin(bootstrap: &str, security: &serde_json::Value, args: &[&str]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/security/admin.py");
    let output = Command::new("python3")
        .arg(script)
        .arg(bootstrap)
        .arg(security.to_string())
        .args(args)
        // Successful calls take well under a second; a refused login is retried until then.
        .env("ADMIN_TIMEOUT_S", "8")
        .stderr(Stdio::inherit())
        .output()
        .expect("python3 with confluent-kafka");
    assert!(output.status.success(), "admin.py {args:?} crashed");
    serde_json::from_slice(&output.stdout).unwrap()
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|item| item.as_str().unwrap_or("null").to_string())
        .collect()
}

/// Users made and ACLs set through Kafka's admin APIs decide what each principal may do, as
/// Kafka's authorizer decides it: prefixed and literal patterns, a deny beating an allow,
/// Describe implied by Write, topics hidden from Metadata, Create needed to create, a super
/// user passing everything, a client certificate's subject as a principal.
#[test]
fn acls_decide_what_each_principal_may_do() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let (node, sasl_ssl, ssl, _) = secured_node(
        dir.path(),
        &pki,
        "required",
        // The plaintext native port stays a local admin port (as Kafka's pattern of a
        // loopback listener for tools): its anonymous clients are super users here.
        &[
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin;User:ANONYMOUS",
        ],
    );
    let admin = scram(&pki, "admin", ADMIN_PASSWORD);
    let alice = scram(&pki, "alice", "alice-password");
    assert_eq!(
        strings(
            &kafka_admin(
                &sasl_ssl,
                &admin,
                &["user", "alice", "alice-password", "SCRAM-SHA-512"]
            )["result"]
        ),
        ["null"]
    );
    let users = kafka_admin(&sasl_ssl, &admin, &["users"]);
    assert_eq!(
        strings(&users["users"]["alice"]),
        ["SCRAM_SHA_512"],
        "{users}"
    );
    // alice may not manage users or ACLs.
    assert_eq!(
        strings(
            &kafka_admin(
                &sasl_ssl,
                &alice,
                &["user", "mallory", "pw", "SCRAM-SHA-256"]
            )["result"]
        ),
        ["CLUSTER_AUTHORIZATION_FAILED"]
    );
    for topic in [
        "orders-eu",
        "orders-us",
        "orders-blocked",
        "payments",
        "certs",
    ] {
        assert_eq!(
            strings(&kafka_admin(&sasl_ssl, &admin, &["create-topic", topic])["result"]),
            ["null"],
            "the super user creates {topic}"
        );
    }
    let certificate = "User:CN=alice,OU=eng,O=acme";
    let acls = serde_json::json!([
        [
            "topic",
            "orders-",
            "prefixed",
            "User:alice",
            "write",
            "allow"
        ],
        [
            "topic",
            "orders-eu",
            "literal",
            "User:alice",
            "read",
            "allow"
        ],
        [
            "topic",
            "orders-blocked",
            "literal",
            "User:alice",
            "write",
            "deny"
        ],
        ["group", "g-", "prefixed", "User:alice", "read", "allow"],
        ["topic", "certs", "literal", certificate, "all", "allow"],
        ["group", "g-certs", "literal", certificate, "read", "allow"],
    ]);
    let created = kafka_admin(&sasl_ssl, &admin, &["acls-create", &acls.to_string()]);
    assert_eq!(strings(&created["result"]), ["null"; 6], "{created}");
    assert_eq!(
        strings(&kafka_admin(&sasl_ssl, &admin, &["acls"])["acls"]).len(),
        6
    );

    // Read and Write: the whole round trip.
    let round_trip = |topic: &str, group: &str, security: &serde_json::Value, bootstrap: &str| {
        client_round_trip("confluent", bootstrap, topic, group, security)
    };
    assert_eq!(
        values(&round_trip("orders-eu", "g-eu", &alice, &sasl_ssl)).len(),
        3
    );
    // Write without Read: produced, but not consumed.
    let write_only = round_trip("orders-us", "g-us", &alice, &sasl_ssl);
    assert!(values(&write_only).is_empty(), "{write_only}");
    assert!(
        write_only["errors"]
            .to_string()
            .contains("TOPIC_AUTHORIZATION_FAILED"),
        "{write_only}"
    );
    assert_eq!(support::stored_records(&node, "orders-us"), 3);
    // A deny beats the prefixed allow; no ACL at all refuses.
    for topic in ["orders-blocked", "payments"] {
        let refused = round_trip(topic, "g-x", &alice, &sasl_ssl);
        assert!(
            strings(&refused["refused"])
                .iter()
                .all(|e| e == "TOPIC_AUTHORIZATION_FAILED"),
            "{topic}: {refused}"
        );
        assert_eq!(support::stored_records(&node, topic), 0);
    }
    // Metadata lists what alice may Describe (Write implies it), and she may not create.
    assert_eq!(
        strings(&kafka_admin(&sasl_ssl, &alice, &["topics"])["topics"]),
        ["orders-blocked", "orders-eu", "orders-us"]
    );
    assert_eq!(
        strings(&kafka_admin(&sasl_ssl, &alice, &["create-topic", "orders-new"])["result"]),
        ["TOPIC_AUTHORIZATION_FAILED"]
    );
    // The client certificate's subject is a principal of its own.
    assert_eq!(
        values(&round_trip("certs", "g-certs", &mtls(&pki, &pki), &ssl)).len(),
        3
    );
    let not_alice = round_trip("orders-eu", "g-eu", &mtls(&pki, &pki), &ssl);
    assert!(not_alice["error"].as_str().is_some(), "{not_alice}");
    // Deleting the deny lets alice write there.
    let deny = serde_json::json!([
        "topic",
        "orders-blocked",
        "literal",
        "User:alice",
        "write",
        "deny"
    ]);
    let deleted = kafka_admin(&sasl_ssl, &admin, &["acls-delete", &deny.to_string()]);
    assert_eq!(strings(&deleted["deleted"]).len(), 1, "{deleted}");
    let refused = round_trip("orders-blocked", "g-x", &alice, &sasl_ssl);
    assert!(refused["refused"].is_null(), "{refused}");
    assert_eq!(support::stored_records(&node, "orders-blocked"), 3);
}

/// ACLs and users changed through one broker of three reach the other two (the coordinator's
/// watch): a user made on broker 1 logs in on broker 3, an ACL added on broker 2 lets it
/// write on broker 3, and removed there, stops it.
#[test]
fn acl_and_user_changes_on_one_broker_take_effect_on_the_others() {
    let etcd = strata_coordinator::testing::EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let bootstrap_user = format!("admin:{ADMIN_PASSWORD}");
    let mut nodes = Vec::new();
    let mut listeners = Vec::new();
    for id in ["1", "2", "3"] {
        let kafka = format!("127.0.0.1:{}", free_base_port(0));
        let listener = format!("sasl_ssl://{kafka}");
        let mut args = support::etcd_args(&etcd, id);
        let (cert, key, ca) = (
            pki.path("broker.pem"),
            pki.path("broker.key"),
            pki.path("ca.pem"),
        );
        args.extend_from_slice(&[
            "--kafka-listen",
            &listener,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-ca",
            &ca,
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
        ]);
        nodes.push(TestNode::start_with_env(
            &dir.path().join(format!("node-{id}")),
            1,
            &args,
            &[("STRATA_BOOTSTRAP_USER", &bootstrap_user)],
        ));
        listeners.push(kafka);
    }
    let admin = scram(&pki, "admin", ADMIN_PASSWORD);
    let bob = scram(&pki, "bob", "bob-password");
    assert_eq!(
        strings(&kafka_admin(&listeners[0], &admin, &["create-topic", "shared"])["result"]),
        ["null"]
    );
    kafka_admin(
        &listeners[0],
        &admin,
        &["user", "bob", "bob-password", "SCRAM-SHA-512"],
    );
    support::wait_for("broker 3 to know bob", || {
        kafka_admin(&listeners[2], &bob, &["topics"])["topics"].is_array()
    });
    let grant = serde_json::json!([["topic", "shared", "literal", "User:bob", "write", "allow"]]);
    kafka_admin(&listeners[1], &admin, &["acls-create", &grant.to_string()]);
    support::wait_for("broker 3 to let bob write", || {
        strings(&kafka_admin(&listeners[2], &bob, &["topics"])["topics"]) == ["shared"]
    });
    let written = client_round_trip("confluent", &listeners[2], "shared", "g", &bob);
    assert!(written["refused"].is_null(), "{written}");
    // bob's password is in no etcd key (nor anywhere in etcd's files) and no broker's files.
    assert_nowhere_on_disk(etcd.data_dir(), "bob-password");
    assert_nowhere_on_disk(dir.path(), "bob-password");
    let revoke = serde_json::json!(["topic", "shared", "literal", "User:bob", null, null]);
    kafka_admin(&listeners[2], &admin, &["acls-delete", &revoke.to_string()]);
    for listener in &listeners {
        support::wait_for("every broker to hide the topic from bob again", || {
            kafka_admin(listener, &bob, &["topics"])["topics"]
                .as_array()
                .is_some_and(|topics| topics.is_empty())
        });
    }
    drop(nodes);
}

/// `strata ARGS` against `bootstrap` (a TLS listener whose CA is `ca`), as `login` (user,
/// password) when given, with `stdin`: its output.
fn secured_strata(
    bootstrap: &str,
    ca: &str,
    login: Option<(&str, &str)>,
    args: &[&str],
    stdin: &[u8],
) -> std::process::Output {
    let mut command = support::strata();
    command
        .args(args)
        .args(["--bootstrap", bootstrap, "--tls-ca", ca])
        .env_remove("STRATA_BOOTSTRAP")
        .env_remove("STRATA_PASSWORD")
        .env_remove("STRATA_USER");
    if let Some((user, password)) = login {
        command
            .args(["--user", user])
            .env("STRATA_PASSWORD", password);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strata");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// A broker (2 shards) whose only native client listener is `sasl_ssl`, with ACLs on and `admin` its
/// super user (password [`ADMIN_PASSWORD`]), its certificates made under `dir`; `extra` flags
/// added. Returns the node and the CA's path, which clients need.
fn natively_secured_node(dir: &Path, extra: &[&str]) -> (TestNode, String) {
    let pki = Pki::new(dir, "ca");
    let bootstrap_user = format!("admin:{ADMIN_PASSWORD}");
    let (cert, key, ca) = (
        pki.path("broker.pem"),
        pki.path("broker.key"),
        pki.path("ca.pem"),
    );
    let mut args = vec![
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca,
        "--authorizer",
        "acl",
        "--super-users",
        "User:admin",
    ];
    args.extend_from_slice(extra);
    let node = TestNode::start_listening(
        &dir.join("data"),
        2,
        "sasl_ssl",
        &args,
        &[("STRATA_BOOTSTRAP_USER", &bootstrap_user)],
    );
    (node, ca)
}

/// The native CLI against a broker whose client listener is `sasl_ssl` with ACLs on: with
/// credentials every command works (topics, users, ACLs, produce, consume); without them, with
/// a wrong password or without TLS, each fails with one clear line and exit 1; a user's ACLs
/// decide what its commands may do.
#[test]
fn the_native_cli_needs_credentials_on_a_secured_broker() {
    let dir = tempfile::tempdir().unwrap();
    let (node, ca) = natively_secured_node(dir.path(), &[]);
    let bootstrap = format!("sasl_ssl://{}", node.bootstrap());
    let run = |login: Option<(&str, &str)>, args: &[&str], stdin: &[u8]| {
        secured_strata(&bootstrap, &ca, login, args, stdin)
    };
    let admin = Some(("admin", ADMIN_PASSWORD));
    let ok = |output: std::process::Output| {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    ok(run(
        admin,
        &["topic", "create", "ledger", "--partitions", "2"],
        b"",
    ));
    ok(run(
        admin,
        &["user", "create", "carol", "--password-stdin"],
        b"carol-password\n",
    ));
    assert!(ok(run(admin, &["user", "list"], b"")).contains("carol\tSCRAM-SHA-256,SCRAM-SHA-512"));
    ok(run(
        admin,
        &[
            "acl",
            "add",
            "--principal",
            "User:carol",
            "--operation",
            "write",
            "--topic",
            "ledger",
        ],
        b"",
    ));
    assert!(
        ok(run(admin, &["acl", "list"], b""))
            .contains("User:carol Allow Write from * on Topic:Literal:ledger")
    );

    // Without credentials, with a wrong password, or in the clear: one line, exit 1.
    let refused = |output: std::process::Output, expected: &str| {
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
    };
    for args in [
        &["topic", "list"][..],
        &["group", "list"],
        &["user", "list"],
        &["acl", "list"],
        &["produce", "ledger"],
        &["consume", "ledger", "--from-beginning"],
    ] {
        refused(run(None, args, b"x\n"), "needs --user");
        refused(
            run(Some(("admin", "wrong")), args, b"x\n"),
            "invalid credentials",
        );
    }
    let mut plaintext = support::strata();
    let output = plaintext
        .args(["topic", "list", "--bootstrap", &node.bootstrap()])
        .output()
        .unwrap();
    refused(output, "if the listener is TLS");

    // carol may write the ledger, and nothing else.
    let carol = Some(("carol", "carol-password"));
    ok(run(carol, &["produce", "ledger"], b"one\ntwo\n"));
    let described: serde_json::Value = serde_json::from_str(&ok(run(
        admin,
        &["topic", "describe", "ledger", "--format", "json"],
        b"",
    )))
    .unwrap();
    let stored: u64 = described["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["high_watermark"].as_u64().unwrap())
        .sum();
    assert_eq!(stored, 2);
    refused(
        run(carol, &["consume", "ledger", "--from-beginning"], b""),
        "TopicAuthorizationFailed",
    );
    refused(
        run(carol, &["topic", "create", "other"], b""),
        "TopicAuthorizationFailed",
    );
    refused(
        run(carol, &["user", "list"], b""),
        "ClusterAuthorizationFailed",
    );
    // Quotas need DescribeConfigs and AlterConfigs on the cluster, as in Kafka.
    let carol_quota = [
        "quota",
        "set",
        "--entity-user",
        "carol",
        "--producer-byte-rate",
        "1GiB",
    ];
    refused(run(carol, &carol_quota, b""), "ClusterAuthorizationFailed");
    refused(
        run(carol, &["quota", "list"], b""),
        "ClusterAuthorizationFailed",
    );
    ok(run(admin, &carol_quota, b""));
    assert_eq!(
        ok(run(admin, &["quota", "list"], b"")).trim(),
        "user=carol: producer_byte_rate=1073741824"
    );
    // So do broker settings.
    let carol_setting = ["cluster", "config", "set", "log.retention.ms=60000"];
    refused(
        run(carol, &carol_setting, b""),
        "ClusterAuthorizationFailed",
    );
    refused(
        run(carol, &["cluster", "config", "list"], b""),
        "ClusterAuthorizationFailed",
    );
    ok(run(admin, &carol_setting, b""));
    assert_eq!(
        ok(run(admin, &["cluster", "config", "list"], b"")).trim(),
        "log.retention.ms=60000 (every-broker live)"
    );
    // Group configs need DescribeConfigs (to read) and AlterConfigs (to change) on the group.
    let carol_group_config = [
        "group",
        "config",
        "jobs",
        "--set",
        "share.auto.offset.reset=earliest",
    ];
    refused(
        run(carol, &carol_group_config, b""),
        "GroupAuthorizationFailed",
    );
    refused(
        run(carol, &["group", "config", "jobs"], b""),
        "GroupAuthorizationFailed",
    );
    ok(run(admin, &carol_group_config, b""));
    ok(run(
        admin,
        &[
            "acl",
            "add",
            "--principal",
            "User:carol",
            "--operation",
            "DescribeConfigs",
            "--group",
            "jobs",
        ],
        b"",
    ));
    assert!(
        ok(run(carol, &["group", "config", "jobs"], b""))
            .contains("share.auto.offset.reset=earliest (set)")
    );
    refused(
        run(carol, &carol_group_config, b""),
        "GroupAuthorizationFailed",
    );
    assert_eq!(ok(run(carol, &["topic", "list"], b"")).trim(), "ledger");
    // Removing the binding takes the right away...
    ok(run(
        admin,
        &[
            "acl",
            "remove",
            "--principal",
            "User:carol",
            "--operation",
            "write",
            "--topic",
            "ledger",
        ],
        b"",
    ));
    // ... and hides the topic: without Describe, it does not exist for carol.
    refused(
        run(carol, &["produce", "ledger"], b"three\n"),
        "unknown topic ledger",
    );
}

/// With ACLs on, the admin endpoint keeps `/metrics` and `/health` open (Prometheus scrapes
/// them) and asks a super user's credentials for the cluster's layout.
#[test]
fn the_admin_endpoint_shows_the_cluster_to_super_users_only() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let admin_port = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin_port}");
    let (node, sasl_ssl, _, _) = secured_node(
        dir.path(),
        &pki,
        "none",
        &[
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
            "--admin",
            &admin_address,
        ],
    );
    kafka_admin(
        &sasl_ssl,
        &scram(&pki, "admin", ADMIN_PASSWORD),
        &["user", "eve", "eve-password", "SCRAM-SHA-256"],
    );
    let get = |path: &str, login: Option<&str>| {
        use base64::Engine;
        let mut stream = std::net::TcpStream::connect(&admin_address).unwrap();
        let authorization = login
            .map(|login| {
                format!(
                    "authorization: Basic {}\r\n",
                    base64::engine::general_purpose::STANDARD.encode(login)
                )
            })
            .unwrap_or_default();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: x\r\n{authorization}\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer.lines().next().unwrap_or_default().to_string()
    };
    assert!(get("/metrics", None).contains("200"));
    assert!(get("/health", None).contains("200"));
    assert!(get("/v1/cluster", None).contains("401"));
    assert!(
        get("/v1/cluster", Some("eve:eve-password")).contains("401"),
        "not a super user"
    );
    assert!(get("/v1/cluster", Some("admin:wrong")).contains("401"));
    let admin_login = format!("admin:{ADMIN_PASSWORD}");
    assert!(get("/v1/cluster", Some(&admin_login)).contains("200"));
    // SASL exchanges are counted, those refused apart.
    assert!(support::metric_total(admin_port, "strata_authentications_total") >= 1.0);
    assert_eq!(
        support::metric_total(admin_port, "strata_authentication_failures_total"),
        0.0
    );
    let refused = kafka_admin(
        &sasl_ssl,
        &scram(&pki, "eve", "not-eves-password"),
        &["topics"],
    );
    assert!(refused["error"].is_string(), "{refused}");
    assert!(support::metric_total(admin_port, "strata_authentication_failures_total") >= 1.0);
    drop(node);
}

/// Sends `bytes` as one Kafka frame and reads one frame back; `None` when the broker closed
/// the connection instead.
fn exchange_frame(stream: &mut std::net::TcpStream, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut frame = (bytes.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(bytes);
    stream.write_all(&frame).ok()?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).ok()?;
    let mut answer = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut answer).ok()?;
    Some(answer)
}

/// Authenticates a new connection to `listener` as admin with a version-0 SaslHandshake and
/// bare SCRAM-SHA-256 tokens.
fn authenticate_bare(listener: &str) -> std::net::TcpStream {
    let mut stream = std::net::TcpStream::connect(listener).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    // SaslHandshake v0, correlation id 1, client id "t", mechanism SCRAM-SHA-256.
    let mechanism = b"SCRAM-SHA-256";
    let mut handshake = vec![0, 17, 0, 0, 0, 0, 0, 1, 0, 1, b't'];
    handshake.extend_from_slice(&(mechanism.len() as u16).to_be_bytes());
    handshake.extend_from_slice(mechanism);
    let answer = exchange_frame(&mut stream, &handshake).expect("a handshake answer");
    assert_eq!(&answer[..4], &1i32.to_be_bytes(), "the correlation id");
    assert_eq!(&answer[4..6], &0i16.to_be_bytes(), "no error");
    let mut scram = strata_auth::scram::ScramClient::new(
        strata_auth::scram::ScramMechanism::Sha256,
        "admin",
        ADMIN_PASSWORD.as_bytes(),
        "v0nonce".into(),
    );
    let server_first = exchange_frame(&mut stream, &scram.first_message()).unwrap();
    let last = scram.handle_server_first(&server_first).unwrap();
    let server_final = exchange_frame(&mut stream, &last).unwrap();
    scram
        .handle_server_final(&server_final)
        .expect("the broker proves it knows the user");
    stream
}

/// Metadata v1 for every topic, with correlation id `id`.
fn metadata_request(id: u8) -> Vec<u8> {
    vec![0, 3, 0, 1, 0, 0, 0, id, 0, 1, b't', 0xff, 0xff, 0xff, 0xff]
}

/// Kafka's pre-1.0 SASL framing, which librdkafka before 2.1 checks a broker for: after a
/// version-0 SaslHandshake the SCRAM messages travel as bare length-prefixed tokens, and the
/// connection then serves Kafka requests as its user.
#[test]
fn a_version_0_handshake_authenticates_with_bare_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, listener) = sasl_plaintext_node(dir.path(), &[]);
    let mut stream = authenticate_bare(&listener);
    let answer = exchange_frame(&mut stream, &metadata_request(9)).expect("served");
    assert_eq!(&answer[..4], &9i32.to_be_bytes());
}

/// KIP-368: with `--connections-max-reauth`, a session that outlives it without a new
/// exchange is closed at its next request; clients that re-authenticate (librdkafka 2.2+, the
/// Java client) keep producing through several lifetimes.
#[test]
fn sessions_past_their_lifetime_must_authenticate_again() {
    let dir = tempfile::tempdir().unwrap();
    let (node, listener) = sasl_plaintext_node(dir.path(), &["--connections-max-reauth", "2s"]);
    let mut stream = authenticate_bare(&listener);
    assert!(exchange_frame(&mut stream, &metadata_request(1)).is_some());
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(
        exchange_frame(&mut stream, &metadata_request(2)).is_none(),
        "a request after the session's end closes the connection"
    );
    // A client that re-authenticates keeps its connection working past several lifetimes.
    node.cli(&["topic", "create", "long-lived"], None);
    let security = serde_json::json!({
        "protocol": "SASL_PLAINTEXT", "mechanism": "SCRAM-SHA-512", "user": "admin",
        "password": ADMIN_PASSWORD,
    });
    let result = client_round_trip("confluent-slow", &listener, "long-lived", "g", &security);
    assert_eq!(values(&result).len(), 3, "{result}");
}

/// Two native listeners side by side, as Kafka's operators run a loopback one for local tools
/// beside a secured one: each serves with its own security, and Metadata sends each client to
/// the shard ports of the listener it came through (a TLS client sent to plaintext ports would
/// fail its handshake).
#[test]
fn native_listeners_side_by_side_send_clients_to_their_own_ports() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca");
    let secured = format!("127.0.0.1:{}", free_base_port(2));
    let bootstrap_user = format!("admin:{ADMIN_PASSWORD}");
    let (cert, key, ca) = (
        pki.path("broker.pem"),
        pki.path("broker.key"),
        pki.path("ca.pem"),
    );
    let node = TestNode::start_listening(
        &dir.path().join("data"),
        2,
        &format!("plaintext,sasl_ssl://{secured}"),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-ca",
            &ca,
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin;User:ANONYMOUS",
        ],
        &[("STRATA_BOOTSTRAP_USER", &bootstrap_user)],
    );
    // The plaintext listener: the local tools' (its anonymous clients are super users here).
    node.cli(&["topic", "create", "both", "--partitions", "4"], None);
    node.cli(&["produce", "both"], Some(b"plain-1\nplain-2\n"));
    // The secured one: produce and consume through it, every partition's shard port included.
    let secured_bootstrap = format!("sasl_ssl://{secured}");
    let secured_cli = |args: &[&str], stdin: &[u8]| {
        let login = Some(("admin", ADMIN_PASSWORD));
        let output = secured_strata(&secured_bootstrap, &ca, login, args, stdin);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    secured_cli(&["produce", "both"], b"tls-1\ntls-2\ntls-3\ntls-4\n");
    let consumed = secured_cli(
        &["consume", "both", "--from-beginning", "--max-messages", "6"],
        b"",
    );
    let mut lines: Vec<&str> = consumed.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["plain-1", "plain-2", "tls-1", "tls-2", "tls-3", "tls-4"]
    );
    // The secured listener's shard ports speak TLS: plaintext there is turned away.
    let shard_port = secured.rsplit_once(':').unwrap().1.parse::<u16>().unwrap() + 10;
    let output = support::strata()
        .args([
            "topic",
            "list",
            "--bootstrap",
            &format!("127.0.0.1:{shard_port}"),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
}

/// A group's lag, in records and in seconds, on a broker whose only native listener is
/// `sasl_ssl` with ACLs on: the coordinator asks the partitions' leaders through its own shards
/// (and other brokers over the replication endpoint), never through a client listener that
/// would want TLS and credentials.
#[test]
fn lag_in_seconds_is_measured_on_a_broker_whose_only_listener_needs_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_base_port(0);
    let admin_address = format!("127.0.0.1:{admin_port}");
    let (node, ca) = natively_secured_node(dir.path(), &["--admin", &admin_address]);
    let bootstrap = format!("sasl_ssl://{}", node.bootstrap());
    let admin = Some(("admin", ADMIN_PASSWORD));
    let run = |args: &[&str], stdin: &[u8]| {
        let output = secured_strata(&bootstrap, &ca, admin, args, stdin);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    run(&["topic", "create", "aging", "--partitions", "1"], b"");
    run(&["produce", "aging"], b"first\nsecond\nthird\n");
    // The group reads one record and commits: two stay unread, the oldest written now.
    run(
        &[
            "consume",
            "aging",
            "--group",
            "readers",
            "--from-beginning",
            "--max-messages",
            "1",
        ],
        b"",
    );
    // The broker's own measurement, as `/metrics` shows it (`group describe` computes lag in
    // the CLI, with the CLI's credentials).
    let measured = |metric: &str| -> Option<f64> {
        let (_, text) = support::http_get(admin_port, "/metrics");
        text.lines()
            .find(|line| {
                line.starts_with(&format!("{metric}{{")) && line.contains("group=\"readers\"")
            })
            .and_then(|line| line.rsplit_once(' ')?.1.parse().ok())
    };
    support::wait_for_at_most(
        "the broker's measure of the group's lag in records and in seconds",
        std::time::Duration::from_secs(30),
        || {
            measured("strata_consumer_lag") == Some(2.0)
                && measured("strata_group_lag_seconds").is_some_and(|age| age >= 1.0)
        },
    );
}
