//! Architecture invariants that are cheap to check by reading the source.

use std::path::Path;

fn source(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// The log's logic (index, segments, recovery, checkpoints) sees files only through the storage
/// trait: it names no runtime and no OS file API, so it runs unchanged on the simulated storage.
/// Only `writer.rs` (the task that owns a log), `shared_sync.rs` (a shard's sync rounds) and
/// `cleaner/run.rs` (a clean's IO, which waits for its IO limit and yields between chunks) may
/// know the runtime.
#[test]
fn the_log_core_knows_no_runtime_and_no_os_files() {
    // The two adapters at the log's edge: the writer thread and the shared
    // filesystem sync it drives. Every other file of log/ is the core.
    let adapters = [
        "node/src/log/writer.rs",
        "node/src/log/shared_sync.rs",
        "node/src/log/cleaner/run.rs",
    ];
    let core: Vec<_> = sources_under("node/src/log")
        .into_iter()
        .filter(|(path, _)| !adapters.contains(&path.as_str()))
        .collect();
    assert!(
        core.len() >= 10,
        "only {} files of the log core found",
        core.len()
    );
    for (path, text) in core {
        for forbidden in ["tokio", "io_uring", "std::fs", "libc::"] {
            assert!(!text.contains(forbidden), "{path} mentions {forbidden}");
        }
    }
}

/// `wire` is pure: no IO, no async, no runtime.
#[test]
fn wire_does_no_io() {
    let manifest = source("wire/Cargo.toml");
    for forbidden in ["tokio", "io-uring", "quinn", "etcd"] {
        assert!(!manifest.contains(forbidden), "wire depends on {forbidden}");
    }
    for path in [
        "wire/src/lib.rs",
        "wire/src/batch/mod.rs",
        "wire/src/batch/builder.rs",
        "wire/src/batch/layout.rs",
        "wire/src/batch/body.rs",
    ] {
        let text = source(path);
        for forbidden in ["std::fs", "std::net", "async fn", "std::thread"] {
            assert!(!text.contains(forbidden), "{path} uses {forbidden}");
        }
    }
}

/// Every `.rs` file under `dir` (from the workspace root), recursively, as (path, text).
fn sources_under(dir: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut found = Vec::new();
    let mut pending = vec![root.join(dir)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(root).unwrap().display().to_string();
                let text = std::fs::read_to_string(&path).unwrap();
                found.push((relative, text));
            }
        }
    }
    found.sort();
    found
}

/// A file's text up to its test module: tests may start clocks of their own.
fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |at| &text[..at])
}

/// The replication, consumer-group, transaction and quota cores, and the log's pure policies, are state
/// machines: no runtime, no sockets, no files, no clock (time comes in as an argument). Their
/// simulators depend on it. Whole folders are checked, so a new file there is held to it too.
#[test]
fn the_replication_and_group_cores_are_sans_io() {
    let mut checked: Vec<(String, String)> = [
        "node/src/replication",
        "node/src/group",
        "node/src/txn",
        "node/src/share",
        "node/src/tier",
    ]
    .into_iter()
    .flat_map(sources_under)
    .collect();
    for path in [
        "node/src/log/append_path.rs",
        "node/src/log/tail_cache.rs",
        "node/src/log/transactions.rs",
        "node/src/quota.rs",
    ] {
        checked.push((path.to_string(), source(path)));
    }
    assert!(
        checked
            .iter()
            .any(|(path, _)| path.ends_with("group/classic.rs"))
    );
    assert!(
        checked
            .iter()
            .any(|(path, _)| path.ends_with("share/partition.rs"))
    );
    for (path, text) in &checked {
        let text = without_tests(text);
        for forbidden in [
            "tokio",
            "quinn",
            "io_uring",
            "etcd",
            "std::fs",
            "std::net",
            "Instant::now",
            "SystemTime",
            "async fn",
        ] {
            assert!(!text.contains(forbidden), "{path} mentions {forbidden}");
        }
    }
}

/// The broker reads monotonic time and sets timers through its one time source, `Clock`
/// (the runtime's clock, which a paused runtime makes virtual): no module goes around it,
/// except where what is measured is this process's own real work.
#[test]
fn time_is_read_through_the_clock() {
    // (file, uses allowed, why)
    const REAL_TIME: &[(&str, usize, &str)] = &[
        ("node/src/clock.rs", usize::MAX, "the seam itself"),
        (
            "node/src/iotune.rs",
            usize::MAX,
            "a disk benchmark times the disk",
        ),
        (
            "node/src/io/uring.rs",
            usize::MAX,
            "the io_uring backend times its submissions",
        ),
        (
            "node/src/io/sim.rs",
            1,
            "a simulated sync takes the runtime's time",
        ),
        (
            "node/src/log/shared_sync.rs",
            1,
            "a syncfs's duration on the device",
        ),
        (
            "node/src/log/writer.rs",
            1,
            "a sync's duration on the device",
        ),
        (
            "node/src/server/listener/quota.rs",
            1,
            "CPU time inside a request's polls",
        ),
        (
            "node/src/server/tier.rs",
            5,
            "the remote tier's own runtime: object-store transfers are paced and timed in real time",
        ),
    ];
    for (path, text) in sources_under("node/src") {
        let text = without_tests(&text);
        let uses = text.matches("tokio::time::").count() + text.matches("Instant::now()").count();
        let allowed = REAL_TIME
            .iter()
            .find(|(allowed_path, _, _)| *allowed_path == path)
            .map_or(0, |(_, allowed, _)| *allowed);
        assert!(
            uses <= allowed,
            "{path} reads the time or sets a timer around the Clock {uses} times"
        );
    }
}

/// Replication's drivers run in the broker over QUIC and in the simulator over an in-memory
/// network: they name no shard, no server module and no transport, only what they are given.
#[test]
fn the_replication_drivers_know_no_server_and_no_transport() {
    let drivers = sources_under("node/src/replicator");
    assert!(drivers.len() >= 3, "the drivers are found");
    for (path, text) in &drivers {
        for forbidden in ["crate::server", "quinn", "Shard", "etcd", "std::net"] {
            assert!(!text.contains(forbidden), "{path} mentions {forbidden}");
        }
    }
}

/// The functions longer than [`FUNCTION_LINES_MAX`] today, with their length: none may grow,
/// and none may join them. A function that shrinks is ratcheted to its new length, and one that
/// gets under the limit leaves the list (the test says so for both), so the list only shrinks.
const LONG_FUNCTIONS: &[(&str, &str, usize)] = &[
    ("node/src/server/metrics.rs", "render", 157),
    ("tuning/src/check.rs", "block_device", 232),
    (
        "kafka/src/translate/tests.rs",
        "translated_responses_encode_at_every_served_version",
        198,
    ),
];

/// Longer than this, a function holds more than one idea: split it.
const FUNCTION_LINES_MAX: usize = 150;

/// Each function of a rustfmt-formatted file, as (name, lines from its `fn` to its closing
/// brace). A signature ending in `;` (a trait's declaration) has no body and is passed over.
fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let mut rest = trimmed;
        // Any visibility: `pub`, `pub(crate)`, `pub(in crate::server)`.
        if let Some(restricted) = rest.strip_prefix("pub(") {
            rest = restricted.split_once(") ").map_or(rest, |(_, after)| after);
        }
        for prefix in ["pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let Some(signature) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = signature
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let indent = line.len() - trimmed.len();
        let Some(open) = (at..lines.len()).find(|&i| {
            let l = lines[i].trim_end();
            l.ends_with('{') || l.ends_with(';')
        }) else {
            continue;
        };
        if lines[open].trim_end().ends_with(';') {
            continue;
        }
        let close = (open + 1..lines.len()).find(|&i| {
            let l = lines[i];
            l.len() - l.trim_start().len() == indent && l.trim_start().starts_with('}')
        });
        // A one-line body (`fn f() -> u8 { 1 }`) closes on its own line.
        let close = if lines[open].trim_end().ends_with("{}") {
            Some(open)
        } else {
            close
        };
        if let Some(close) = close {
            found.push((name, close - at + 1));
        }
    }
    found
}

#[test]
fn no_function_grows_past_150_lines() {
    let mut long = Vec::new();
    for crate_dir in [
        "wire/src",
        "node/src",
        "coordinator/src",
        "client/src",
        "bench/src",
        "tuning/src",
        "kafka/src",
        "cli/src",
    ] {
        for (path, text) in sources_under(crate_dir) {
            for (name, lines) in functions(&text) {
                if lines > FUNCTION_LINES_MAX {
                    long.push((path.clone(), name, lines));
                }
            }
        }
    }
    let mut problems = Vec::new();
    for (path, name, lines) in &long {
        match LONG_FUNCTIONS
            .iter()
            .find(|(known_path, known_name, _)| known_path == path && known_name == name)
        {
            None => problems.push(format!(
                "{path}: fn {name} is {lines} lines, over {FUNCTION_LINES_MAX}: split it"
            )),
            Some((_, _, allowed)) if lines > allowed => problems.push(format!(
                "{path}: fn {name} grew to {lines} lines (allowed {allowed}, over the limit): split it"
            )),
            Some((_, _, allowed)) if lines < allowed => problems.push(format!(
                "{path}: fn {name} shrank to {lines} lines: ratchet its LONG_FUNCTIONS entry \
                 from {allowed} to {lines}"
            )),
            Some(_) => {}
        }
    }
    for (path, name, allowed) in LONG_FUNCTIONS {
        if !long.iter().any(|(p, n, _)| p == path && n == name) {
            problems.push(format!(
                "{path}: fn {name} is no longer over {FUNCTION_LINES_MAX} lines (was {allowed}): \
                 take it off LONG_FUNCTIONS"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `node/src/server/`'s modules (its files and folders) and which of the others each names
/// (`super::x`, `super::super::x` from a folder's files, `crate::server::x`).
fn server_imports() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let files = sources_under("node/src/server");
    let module_of = |path: &str| -> String {
        let inside = path.strip_prefix("node/src/server/").unwrap();
        let first = inside.split('/').next().unwrap();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: std::collections::BTreeSet<String> = files
        .iter()
        .map(|(path, _)| module_of(path))
        .filter(|module| module != "mod")
        .collect();
    let mut imports = std::collections::BTreeMap::new();
    for (path, text) in &files {
        let module = module_of(path);
        if module == "mod" {
            continue;
        }
        // The `super::` chain that reaches the server from this file: one per module below
        // it (`a.rs` is `server::a`, `a/b.rs` is `server::a::b`, `a/mod.rs` is `server::a`).
        let inside = path.strip_prefix("node/src/server/").unwrap();
        let depth = inside.split('/').count() - usize::from(inside.ends_with("/mod.rs"));
        let to_server = "super::".repeat(depth);
        let named = imports
            .entry(module.clone())
            .or_insert_with(std::collections::BTreeSet::new);
        for prefix in [to_server.as_str(), "crate::server::"] {
            for (at, _) in text.match_indices(prefix) {
                // A longer chain (`super::super::` where `super::` reaches the server) goes
                // above the server, not into it.
                if prefix.starts_with("super") && text[..at].ends_with("super::") {
                    continue;
                }
                let after = &text[at + prefix.len()..];
                let target: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if target != module && modules.contains(&target) {
                    named.insert(target);
                }
            }
        }
    }
    imports
}

/// Groups of modules that reach each other through imports (strongly connected, two or more).
fn circles(
    imports: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<std::collections::BTreeSet<String>> {
    let reaches = |from: &String| {
        let mut seen = std::collections::BTreeSet::new();
        let mut pending = vec![from.clone()];
        while let Some(module) = pending.pop() {
            for next in imports.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    pending.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: std::collections::BTreeMap<&String, std::collections::BTreeSet<String>> = imports
        .keys()
        .map(|module| (module, reaches(module)))
        .collect();
    let mut groups: Vec<std::collections::BTreeSet<String>> = Vec::new();
    for module in imports.keys() {
        let group: std::collections::BTreeSet<String> = imports
            .keys()
            .filter(|other| {
                *other == module
                    || (reach[module].contains(*other) && reach[*other].contains(module))
            })
            .cloned()
            .collect();
        if group.len() > 1 && !groups.contains(&group) {
            groups.push(group);
        }
    }
    groups
}

/// The server's modules import one way: `messages`, `metrics`, `quic`, `topic_config`,
/// `broker_config` and `group_config` are leaves (naming only each other); `shard`, `control` and `groups` name leaves only (and `shard` the groups'
/// routing); `listener` serves the shard; `mod.rs` wires them. No two modules may reach each
/// other through imports, so each can be read, tested and changed from below.
#[test]
fn the_servers_modules_import_one_way() {
    let imports = server_imports();
    let found = circles(&imports);
    assert!(
        found.is_empty(),
        "modules of node/src/server/ that import each other: {found:?}\nimports: {imports:#?}"
    );
    for leaf in [
        "messages",
        "quic",
        "topic_config",
        "broker_config",
        "group_config",
    ] {
        let named = &imports[leaf];
        assert!(
            named
                .iter()
                .all(|module| ["metrics", "topic_config", "broker_config"]
                    .contains(&module.as_str())),
            "{leaf} is a leaf but names {named:?}"
        );
    }
    assert!(
        imports["metrics"].is_empty(),
        "metrics names {:?}",
        imports["metrics"]
    );
    for below in ["shard", "control", "groups", "messages", "metrics"] {
        assert!(
            !imports[below].contains("listener"),
            "{below} names the listeners: they serve it, not the other way round"
        );
    }
}

/// The module a source file under `node/src/` is: `server/groups/mod.rs` is
/// `["server", "groups"]`, `server/groups/lag.rs` is `["server", "groups", "lag"]`.
fn module_of_file(path: &str) -> Vec<String> {
    let inside = path
        .strip_prefix("node/src/")
        .unwrap()
        .trim_end_matches(".rs");
    let mut module: Vec<String> = inside.split('/').map(str::to_string).collect();
    if module
        .last()
        .is_some_and(|last| last == "mod" || last == "lib")
    {
        module.pop();
    }
    module
}

/// Every module path a file names (`crate::a::b`, `super::c`, `self::d`, and each first name
/// of a `{...}` list after one), made absolute from the file's own module.
fn named_modules(module: &[String], text: &str) -> Vec<Vec<String>> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut named = Vec::new();
    let bytes = text.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in text.match_indices(start) {
            // Only where a path starts (not `a::super::`, not `my_crate::`).
            if at > 0 && (is_ident(bytes[at - 1] as char) || text[..at].ends_with("::")) {
                continue;
            }
            let mut base: Vec<String> = match start {
                "crate::" => Vec::new(),
                "self::" => module.to_vec(),
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            let mut rest = &text[at + start.len()..];
            while let Some(tail) = rest.strip_prefix("super::") {
                base.pop();
                rest = tail;
            }
            let mut path = base;
            loop {
                let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
                // Modules are lower case; a type, trait or constant ends the module path.
                if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
                    break;
                }
                rest = &rest[name.len()..];
                path.push(name);
                match rest.strip_prefix("::") {
                    Some(tail) => rest = tail,
                    None => break,
                }
            }
            if let Some(list) = rest.strip_prefix('{') {
                let list = &list[..list.find('}').unwrap_or(list.len())];
                for item in list.split(',') {
                    let first: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
                    if first.starts_with(|c: char| c.is_ascii_lowercase()) && first != "self" {
                        let mut listed = path.clone();
                        listed.push(first);
                        named.push(listed);
                    }
                }
            }
            named.push(path);
        }
    }
    named
}

/// Within every folder of `node/src/` (the crate's top level, the log, the server and each of
/// their folders), the modules side by side import one way: no two reach each other (a
/// folder's `mod.rs` is the root its children hang from, and a module may always name its own
/// ancestors and descendants). Doc links count: a link is a dependency a reader follows. The
/// server's top level is checked with its leaves in `the_servers_modules_import_one_way`.
#[test]
fn modules_side_by_side_import_one_way_in_every_folder() {
    type Imports = std::collections::BTreeMap<String, std::collections::BTreeSet<String>>;
    let mut folders: std::collections::BTreeMap<Vec<String>, Imports> = Default::default();
    for (path, text) in sources_under("node/src") {
        let module = module_of_file(&path);
        for target in named_modules(&module, without_tests(&text)) {
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == module.len() || common == target.len() {
                continue;
            }
            let folder = module[..common].to_vec();
            let imports = folders.entry(folder).or_default();
            imports
                .entry(module[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    assert!(folders.contains_key(&vec!["server".to_string(), "groups".to_string()]));
    let mut found = Vec::new();
    for (folder, imports) in &folders {
        for circle in circles(imports) {
            found.push(format!("{}: {circle:?}", folder.join("/")));
        }
    }
    assert!(
        found.is_empty(),
        "modules that import each other:\n{}",
        found.join("\n")
    );
}

/// The broker library depends on no bench, client or command-line code: the `strata` binary, which
/// needs both, is a crate of its own (`cli/`).
#[test]
fn the_broker_library_depends_on_no_bench_code() {
    let manifest = source("node/Cargo.toml");
    // Nor on the client: the framing both ends share is `strata-net`, and the broker asks its
    // own shards and its peers what it needs to know about partitions.
    for forbidden in ["strata-bench", "strata-client", "[[bin]]"] {
        assert!(
            !manifest.contains(forbidden),
            "node/Cargo.toml names {forbidden}"
        );
    }
    for (path, text) in sources_under("node/src") {
        assert!(!text.contains("strata_bench"), "{path} uses strata_bench");
        assert!(!text.contains("strata_client"), "{path} uses strata_client");
    }
}
