//! Socket settings Strata's TCP connections share, on both ends.

/// The congestion control Strata's connections (broker and client ends) ask for unless told
/// otherwise. Many hosts default to BBR, which needs paced sending; without the `fq` queueing
/// discipline (and loopback has none) TCP paces by itself with a timer per burst of packets.
/// On the VM of docs/performance.md, that halved one consumer's throughput and tripled the
/// broker's CPU per consumed byte against cubic, Linux's own default.
pub const DEFAULT_TCP_CONGESTION: &str = "cubic";

/// The word that leaves a connection on the host's default congestion control.
pub const HOST_TCP_CONGESTION: &str = "system";

/// Reads a `--tcp-congestion` setting: an algorithm's name, or [`HOST_TCP_CONGESTION`] for
/// the host's default (`None`).
pub fn parse_tcp_congestion(setting: &str) -> Option<String> {
    let setting = setting.trim();
    (setting != HOST_TCP_CONGESTION && !setting.is_empty()).then(|| setting.to_string())
}

/// Switches `stream` to the congestion control `algorithm` (`None`: leaves the host's). A
/// host that refuses it (not built in, or not in `net.ipv4.tcp_allowed_congestion_control`
/// for an unprivileged process) keeps its default; that is said once per process, not per
/// connection.
pub fn apply_tcp_congestion(stream: &tokio::net::TcpStream, algorithm: Option<&str>) {
    let Some(algorithm) = algorithm else {
        return;
    };
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_congestion(algorithm.as_bytes()) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                algorithm,
                "TCP congestion control not available ({error}); connections keep the host's default"
            );
        });
    }
}

/// The congestion control `stream` uses.
pub fn tcp_congestion(stream: &tokio::net::TcpStream) -> std::io::Result<String> {
    let name = socket2::SockRef::from(stream).tcp_congestion()?;
    Ok(String::from_utf8_lossy(&name)
        .trim_end_matches('\0')
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::{apply_tcp_congestion, parse_tcp_congestion, tcp_congestion};

    #[test]
    fn system_means_the_hosts_default() {
        assert_eq!(parse_tcp_congestion("system"), None);
        assert_eq!(parse_tcp_congestion(""), None);
        assert_eq!(parse_tcp_congestion("reno"), Some("reno".into()));
    }

    #[tokio::test]
    async fn a_connection_takes_the_algorithm_asked_for_and_survives_an_unknown_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        // reno is built into every Linux kernel and always allowed.
        apply_tcp_congestion(&stream, Some("reno"));
        assert_eq!(tcp_congestion(&stream).unwrap(), "reno");
        apply_tcp_congestion(&stream, Some("no-such-algorithm"));
        assert_eq!(
            tcp_congestion(&stream).unwrap(),
            "reno",
            "unchanged, no panic"
        );
        let before = tcp_congestion(&stream).unwrap();
        apply_tcp_congestion(&stream, None);
        assert_eq!(tcp_congestion(&stream).unwrap(), before);
    }
}
