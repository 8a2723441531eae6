#!/bin/sh
# Slurm epilog (runs as root on every node after the job): wait until every file the job
# left in the node store is durable, stop the job's agent, free the store's memory.
# A checkpoint written by several nodes is complete once the last node's part is in; this
# node only has to make its own part durable. Configure in slurm.conf: Epilog=<this file>.
set -u
store="/cascade-$SLURM_JOB_UID"
unit="cascade-agent-$SLURM_JOB_ID"
export CASCADE_STORE="$store"
status=0
if runuser -u "#$SLURM_JOB_UID" -- /usr/local/bin/cascade status >/dev/null 2>&1; then
    runuser -u "#$SLURM_JOB_UID" -- /usr/local/bin/cascade wait / --level durable \
        --timeout 3600 || status=1
fi
systemctl stop "$unit" 2>/dev/null || true
# Keep the store (and what is not durable in it) when the wait failed: an administrator
# can still drain it; otherwise free the node's memory for the next job. Destroyed as the
# job's user: Cascade uses only stores of the caller's own uid, root included, so that the
# header of a store someone else made (which names the spill file to remove) is never
# trusted (docs/security.md).
[ "$status" -eq 0 ] && runuser -u "#$SLURM_JOB_UID" -- /usr/local/bin/cascade destroy --force --store "$store"
exit "$status"
