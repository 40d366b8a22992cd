# Shared by the bench scripts that start a node per run (source it; they set node_pid).

# Stops the node started last (SIGTERM, then waits), if it still runs.
stop_node() {
    if [ -n "${node_pid:-}" ] && kill -0 "$node_pid" 2>/dev/null; then
        kill "$node_pid"
        wait "$node_pid" 2>/dev/null || true
    fi
    node_pid=""
}

# CPU seconds (user + system) a process has used so far.
cpu_seconds() {
    awk -v ticks="$(getconf CLK_TCK)" '{ print ($14 + $15) / ticks }' "/proc/$1/stat"
}

# Waits (up to 10 s) until something listens on 127.0.0.1:PORT.
wait_for_port() {
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "nothing listens on port $1" >&2
    return 1
}
