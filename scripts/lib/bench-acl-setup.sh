#!/usr/bin/env bash
# A_SETUP / B_SETUP for scripts/bench-builds.sh's ACL comparison: creates the user `bench`
# (password: $STRATA_PASSWORD, the same as the bootstrap user `admin`'s) and, with ACLS=1,
# 1,000 bindings through the Kafka listener on $KAFKA (default 127.0.0.1:7490): the bench's own
# (All on its topic and the cluster), 499 literal ones of other users, 499 prefixed ones of its.
set -euo pipefail
echo "$STRATA_PASSWORD" | "$STRATA" user create bench --password-stdin --bootstrap "$BOOTSTRAP" --user admin
if [ -n "${ACLS:-}" ]; then
    ADMIN_PY="$(dirname "$0")/../../cli/tests/security/admin.py" KAFKA="${KAFKA:-127.0.0.1:7490}" python3 - <<'PY'
import json, os, subprocess
acls = [["topic", "pinned", "literal", "User:bench", "all", "allow"],
        ["cluster", "kafka-cluster", "literal", "User:bench", "all", "allow"]]
acls += [["topic", f"t{i}", "literal", f"User:u{i}", "write", "allow"] for i in range(499)]
acls += [["topic", f"p{i}-", "prefixed", "User:bench", "read", "allow"] for i in range(499)]
security = {"protocol": "SASL_PLAINTEXT", "mechanism": "SCRAM-SHA-512", "user": "admin",
            "password": os.environ["STRATA_PASSWORD"]}
out = subprocess.run(["python3", os.environ["ADMIN_PY"], os.environ["KAFKA"], json.dumps(security),
                      "acls-create", json.dumps(acls)], capture_output=True, text=True)
assert '"result"' in out.stdout, out.stdout + out.stderr
PY
fi
