//! The admin HTTP endpoint (`--admin`, default 127.0.0.1:7380): `/metrics` (Prometheus text),
//! `/health`, `/v1/cluster` (JSON), and `/dashboard`, a self-contained live latency page (plain
//! HTML and JS polling `/metrics`; no build step, no CDN). Runs on its own thread; gathers per-shard snapshots over the
//! shards' mailboxes, so recording a metric never takes a lock shared between shards.
//!
//! With `--authorizer acl`, `/v1/cluster` (the cluster's layout, more than metrics) needs a super
//! user's credentials (HTTP Basic, checked against the user's stored SCRAM credential); the
//! metrics, health and the dashboard that plots the metrics stay open, as Prometheus expects.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::server::NodeConfig;
use crate::server::messages::GroupMessage;
use crate::server::messages::ShardMessage;
use crate::server::metrics;

pub fn start(
    config: Arc<NodeConfig>,
    shards: Arc<Vec<mpsc::UnboundedSender<ShardMessage>>>,
    groups: mpsc::UnboundedSender<GroupMessage>,
    tier: Option<Arc<crate::server::tier::TierMetrics>>,
    address: SocketAddr,
) -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(address)
        .map_err(|error| anyhow::anyhow!("admin endpoint {address}: {error}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("strata-admin".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread runtime builds");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                let started = config.clock.now();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (config, shards, groups) = (config.clone(), shards.clone(), groups.clone());
                    let tier = tier.clone();
                    tokio::spawn(async move {
                        let mailboxes = Mailboxes {
                            shards: &shards,
                            groups: &groups,
                            tier: tier.as_deref(),
                        };
                        let _ = serve(stream, &config, mailboxes, started).await;
                    });
                }
            });
        })?;
    Ok(bound)
}

/// Who the endpoint asks for what it serves.
struct Mailboxes<'a> {
    shards: &'a [mpsc::UnboundedSender<ShardMessage>],
    groups: &'a mpsc::UnboundedSender<GroupMessage>,
    tier: Option<&'a crate::server::tier::TierMetrics>,
}

async fn serve(
    mut stream: tokio::net::TcpStream,
    config: &NodeConfig,
    Mailboxes {
        shards,
        groups,
        tier,
    }: Mailboxes<'_>,
    started: std::time::Instant,
) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        request.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split_whitespace().nth(1).unwrap_or("/");
    let (status, content_type, body) = match path {
        "/metrics" => {
            let mut snapshots = Vec::new();
            for shard in shards {
                let (reply, answer) = oneshot::channel();
                if shard.send(ShardMessage::Metrics { reply }).is_ok()
                    && let Ok(snapshot) = answer.await
                {
                    snapshots.push(snapshot);
                }
            }
            let mut body = metrics::render(config.node_id, started.elapsed(), &snapshots);
            let (reply, answer) = oneshot::channel();
            if groups.send(GroupMessage::Metrics { reply }).is_ok()
                && let Ok(group_metrics) = answer.await
            {
                body.push_str(&group_metrics);
            }
            if let Some(tier) = tier {
                tier.render(&mut body);
            }
            ("200 OK", "text/plain; version=0.0.4", body)
        }
        "/health" => health(config, shards).await,
        "/dashboard" | "/" => (
            "200 OK",
            "text/html; charset=utf-8",
            include_str!("dashboard.html").to_string(),
        ),
        "/v1/cluster" => {
            let (reply, answer) = oneshot::channel();
            let view = match shards.first() {
                Some(shard) if shard.send(ShardMessage::View { reply }).is_ok() => {
                    answer.await.ok()
                }
                _ => None,
            };
            let credentials = basic_credentials(&text);
            match view {
                Some(view) if !admitted(config, &view, credentials).await => (
                    "401 Unauthorized",
                    "text/plain",
                    "a super user's credentials are needed (HTTP Basic)\n".into(),
                ),
                Some(view) => (
                    "200 OK",
                    "application/json",
                    serde_json::json!({
                        "cluster": config.cluster,
                        "node": config.node_id,
                        "controller": view.controller,
                        "brokers": brokers_with_liveness(&view),
                        "topics": view.topics.as_ref(),
                        "shards": config.shards,
                        "data_dir": config.data_dir,
                    })
                    .to_string(),
                ),
                None => ("503 Service Unavailable", "text/plain", "starting\n".into()),
            }
        }
        _ => ("404 Not Found", "text/plain", "not found\n".into()),
    };
    // `strata-pid` names the process answering, so a script that started a node can tell it
    // from another broker on the same ports (client ports are shared with SO_REUSEPORT).
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nstrata-pid: {}\r\nconnection: close\r\n\r\n{body}",
        body.len(),
        std::process::id()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The user and password of an `Authorization: Basic` header.
fn basic_credentials(request: &str) -> Option<(String, String)> {
    use base64::Engine;
    let value = request.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then(|| value.trim())
    })?;
    let encoded = value
        .strip_prefix("Basic ")
        .or(value.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// Whether a request with `credentials` may read what only super users may (always, when the
/// node does not authorize).
async fn admitted(
    config: &NodeConfig,
    view: &crate::server::messages::ClusterView,
    credentials: Option<(String, String)>,
) -> bool {
    let Some(authorizer) = &config.security.authorizer else {
        return true;
    };
    let Some((user, password)) = credentials else {
        return false;
    };
    if !authorizer
        .super_users
        .contains(&strata_auth::Principal::user(&user))
    {
        return false;
    }
    let Some(credential) = view.security.any_credential(&user).cloned() else {
        return false;
    };
    // PBKDF2 takes milliseconds: off the admin thread's runtime.
    tokio::task::spawn_blocking(move || credential.verify_password(password.as_bytes()))
        .await
        .unwrap_or(false)
}

/// Registered brokers (alive), then brokers that hold replicas but are not registered (dead,
/// or cut off past their lease), not alive and without an address.
fn brokers_with_liveness(view: &crate::server::messages::ClusterView) -> Vec<serde_json::Value> {
    let mut brokers: Vec<serde_json::Value> = view
        .brokers
        .iter()
        .map(|broker| {
            serde_json::json!({
                "id": broker.id,
                "addr": format!("{}:{}", broker.host, broker.port),
                "alive": true,
                "shard_ports": broker.shard_ports,
                "rack": broker.rack,
            })
        })
        .collect();
    let dead: std::collections::BTreeSet<i32> = view
        .topics
        .iter()
        .flat_map(|topic| topic.partitions.iter())
        .flat_map(|partition| partition.replicas.iter().copied())
        .filter(|id| !view.brokers.iter().any(|broker| broker.id == *id))
        .collect();
    brokers.extend(dead.into_iter().map(|id| {
        serde_json::json!({ "id": id, "addr": null, "alive": false, "shard_ports": [], "rack": null })
    }));
    brokers
}

/// 200 only when every shard answers and this broker is registered in the cluster it serves:
/// a load balancer or orchestrator then stops sending clients to a node that is starting, has a
/// stuck shard, or was cut off from the coordinator past its lease.
async fn health(
    config: &NodeConfig,
    shards: &[mpsc::UnboundedSender<ShardMessage>],
) -> (&'static str, &'static str, String) {
    let unavailable = |why: String| ("503 Service Unavailable", "text/plain", why);
    let mut view = None;
    for (index, shard) in shards.iter().enumerate() {
        let (reply, answer) = oneshot::channel();
        let answered = if shard.send(ShardMessage::View { reply }).is_ok() {
            config
                .clock
                .timeout(std::time::Duration::from_secs(2), answer)
                .await
                .and_then(Result::ok)
        } else {
            None
        };
        match answered {
            Some(shard_view) => {
                view.get_or_insert(shard_view);
            }
            None => return unavailable(format!("shard {index} is not answering\n")),
        }
    }
    let Some(view) = view else {
        return unavailable("no shards\n".into());
    };
    if !view
        .brokers
        .iter()
        .any(|broker| broker.id == config.node_id)
    {
        return unavailable(format!(
            "broker {} is not registered in cluster {} (starting, or its coordinator lease lapsed)\n",
            config.node_id, config.cluster
        ));
    }
    ("200 OK", "text/plain", "ok\n".to_string())
}
