# Sourced by the scripts that build (quickstart.sh, test.sh, rdkafka-suite.sh): one build cache
# outside the clone, so repeated runs and fresh clones build incrementally.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/strata-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

mkdir -p "$CARGO_TARGET_DIR"

# A build that fills the disk fails halfway ("No space left on device"), and a cache kept
# across many checkouts and toolchains only grows. With less than STRATA_CACHE_MIN_FREE_GB
# (default 20) free beside it, its incremental state goes first (rebuilt as needed), then, if
# that is not enough, the whole cache (a full build from scratch).
strata_free_gb() { df -Pk "$CARGO_TARGET_DIR" | awk 'NR == 2 { print int($4 / 1048576) }'; }
strata_min_free_gb="${STRATA_CACHE_MIN_FREE_GB:-20}"
case "$strata_min_free_gb" in
'' | *[!0-9]*)
    echo "STRATA_CACHE_MIN_FREE_GB must be a whole number of GB, not '$strata_min_free_gb'" >&2
    exit 1
    ;;
esac
if [ "$(strata_free_gb)" -lt "$strata_min_free_gb" ]; then
    echo "== under ${strata_min_free_gb} GB free beside the build cache: dropping its incremental state"
    rm -rf "$CARGO_TARGET_DIR"/*/incremental
    if [ "$(strata_free_gb)" -lt "$strata_min_free_gb" ]; then
        echo "== still under ${strata_min_free_gb} GB free: emptying the build cache"
        rm -rf "$CARGO_TARGET_DIR"
        mkdir -p "$CARGO_TARGET_DIR"
    fi
fi

# Cargo names a workspace crate's artifacts by its path *within* the workspace, and judges them
# fresh by the source files they were built from, so a cache last built from another checkout
# (another clone, a worktree) could look up to date while holding that checkout's code. Rebuild
# the workspace's own crates (dependencies stay cached) whenever the checkout changes.
strata_checkout_marker="$CARGO_TARGET_DIR/.strata-checkout"
if [ "$(cat "$strata_checkout_marker" 2>/dev/null)" != "$PWD" ]; then
    echo "== the build cache was built from another checkout: rebuilding the workspace crates"
    cargo clean --quiet -p strata-wire -p strata-net -p strata-node -p strata-cli -p strata-coordinator -p strata-client \
        -p strata-bench -p strata-tuning -p strata-kafka -p strata-auth
    echo "$PWD" > "$strata_checkout_marker"
fi

# The release `strata` to benchmark: $STRATA_BIN when set (to compare builds), else built here.
strata_release_binary() {
    if [ -n "${STRATA_BIN:-}" ]; then
        echo "$STRATA_BIN"
        return
    fi
    cargo build --release -q -p strata-cli --bin strata >&2
    echo "$CARGO_TARGET_DIR/release/strata"
}
