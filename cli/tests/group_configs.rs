//! Group configs on Strata's own protocol (`strata group config`): set, described back,
//! refused when invalid, and applied by the group's coordinator (a share group set to start
//! at the earliest record reads what was produced before it started).

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::TestNode;

/// `strata group config GROUP --format json`, as (name → (value, set)).
fn configs(node: &TestNode, group: &str) -> Vec<(String, String, bool)> {
    let described: Value =
        serde_json::from_str(&node.cli(&["group", "config", group, "--format", "json"], None))
            .expect("group config's JSON");
    assert_eq!(described["group"], group, "{described}");
    described["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .map(|config| {
            (
                config["name"].as_str().expect("a name").to_string(),
                config["value"].as_str().expect("a value").to_string(),
                config["set"].as_bool().expect("set or not"),
            )
        })
        .collect()
}

fn config(node: &TestNode, group: &str, name: &str) -> (String, bool) {
    configs(node, group)
        .into_iter()
        .find(|(named, _, _)| named == name)
        .map(|(_, value, set)| (value, set))
        .unwrap_or_else(|| panic!("{name} is described"))
}

/// `strata ARGS`, which must fail: its stderr.
fn refused(node: &TestNode, args: &[&str]) -> String {
    let output = node.cli_output(args, None);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "strata {args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr
}

/// `strata consume TOPIC --share-group GROUP --max-messages COUNT`, which must finish within
/// a minute: the values it printed.
fn share_consume(node: &TestNode, topic: &str, group: &str, count: usize) -> Vec<String> {
    let count = count.to_string();
    let mut child = support::strata()
        .args(["consume", topic, "--share-group", group])
        .args(["--max-messages", &count, "--format", "json"])
        .env("STRATA_BOOTSTRAP", node.bootstrap())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn strata consume");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("strata consume --share-group {group} printed fewer than {count} records");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().expect("output");
    assert!(output.status.success(), "strata consume: {}", output.status);
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).expect("a JSON record");
            record["value"].as_str().expect("a value").to_string()
        })
        .collect()
}

/// A share group's configs set with `strata group config --set` are described back (others at
/// their defaults, other groups untouched), an invalid change is refused whole with a message
/// naming it, `--delete` goes back to the default, and the group's coordinator applies them:
/// set to start at the earliest record, `strata consume --share-group` reads records produced
/// before it started.
#[test]
fn group_configs_set_natively_are_described_refused_when_invalid_and_applied() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(dir.path(), 2);
    node.cli(&["topic", "create", "jobs", "--partitions", "3"], None);
    let lines: String = (0..30).map(|i| format!("job-{i}\n")).collect();
    node.cli(
        &["produce", "jobs", "--acks", "all"],
        Some(lines.as_bytes()),
    );

    // Every config at its default, whether or not the group exists.
    let defaults = configs(&node, "workers");
    assert!(defaults.iter().all(|(_, _, set)| !set), "{defaults:?}");
    assert_eq!(
        config(&node, "workers", "share.auto.offset.reset"),
        ("latest".to_string(), false)
    );

    let altered = node.cli(
        &[
            "group",
            "config",
            "workers",
            "--set",
            "share.auto.offset.reset=earliest",
            "--set",
            "share.record.lock.duration.ms=5000",
        ],
        None,
    );
    assert_eq!(altered.trim(), "altered group workers");
    assert_eq!(
        config(&node, "workers", "share.auto.offset.reset"),
        ("earliest".to_string(), true)
    );
    assert_eq!(
        config(&node, "workers", "share.record.lock.duration.ms"),
        ("5000".to_string(), true)
    );
    assert_eq!(
        config(&node, "workers", "strata.share.key.ordering"),
        ("false".to_string(), false)
    );
    assert_eq!(
        config(&node, "others", "share.auto.offset.reset"),
        ("latest".to_string(), false),
        "another group keeps its defaults"
    );
    let text = node.cli(&["group", "config", "workers"], None);
    assert!(
        text.lines()
            .any(|line| line == "share.auto.offset.reset=earliest (set)"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|line| line == "share.delivery.count.limit=5 (default)"),
        "{text}"
    );

    // Refused whole, with what is wrong named: a bad value, a name no group has, configs that
    // would disagree, a config named twice.
    let stderr = refused(
        &node,
        &[
            "group",
            "config",
            "workers",
            "--set",
            "share.record.lock.duration.ms=6000",
            "--set",
            "share.auto.offset.reset=sideways",
        ],
    );
    assert!(
        stderr.contains("share.auto.offset.reset=sideways") && stderr.contains("InvalidConfig"),
        "{stderr}"
    );
    let stderr = refused(
        &node,
        &["group", "config", "workers", "--set", "no.such.config=1"],
    );
    assert!(
        stderr.contains("not a group config: no.such.config"),
        "{stderr}"
    );
    let stderr = refused(
        &node,
        &[
            "group",
            "config",
            "workers",
            "--set",
            "share.heartbeat.interval.ms=60000",
        ],
    );
    assert!(
        stderr.contains("share.heartbeat.interval.ms (60000) must be less than"),
        "{stderr}"
    );
    let stderr = refused(
        &node,
        &[
            "group",
            "config",
            "workers",
            "--set",
            "share.record.lock.duration.ms=6000",
            "--delete",
            "share.record.lock.duration.ms",
        ],
    );
    assert!(stderr.contains("is named twice"), "{stderr}");
    assert_eq!(
        config(&node, "workers", "share.record.lock.duration.ms"),
        ("5000".to_string(), true),
        "nothing of a refused change is stored"
    );

    // --delete goes back to the default.
    node.cli(
        &[
            "group",
            "config",
            "workers",
            "--delete",
            "share.record.lock.duration.ms",
        ],
        None,
    );
    assert_eq!(
        config(&node, "workers", "share.record.lock.duration.ms"),
        ("30000".to_string(), false)
    );

    // The group starts at the earliest record: the 30 produced before it joined are read.
    let mut values = share_consume(&node, "jobs", "workers", 30);
    values.sort_by_key(|value| value["job-".len()..].parse::<u32>().unwrap());
    let expected: Vec<String> = (0..30).map(|i| format!("job-{i}")).collect();
    assert_eq!(values, expected);
}
