#!/bin/sh
# Slurm prolog (runs as root on every node of a job before its first step): a node-level
# Cascade agent for the job, run as the job's user. The job's ranks (`cascade run`) then
# only attach to the store and use this agent. Configure in slurm.conf: Prolog=<this file>.
# Site settings (CASCADE_DURABLE, CASCADE_CAPACITY, spill, staging) come from
# /etc/cascade/config.toml, which the agent reads like every cascade command.
set -eu
store="/cascade-$SLURM_JOB_UID"
unit="cascade-agent-$SLURM_JOB_ID"
systemd-run --unit "$unit" --uid "$SLURM_JOB_UID" --gid "$SLURM_JOB_GID" \
    --setenv CASCADE_STORE="$store" \
    --setenv SLURM_JOB_ID="$SLURM_JOB_ID" \
    --setenv SLURM_JOB_NAME="${SLURM_JOB_NAME:-}" \
    --setenv SLURMD_NODENAME="$SLURMD_NODENAME" \
    --setenv SLURM_JOB_NODELIST="${SLURM_JOB_NODELIST:-}" \
    --setenv SLURM_JOB_NUM_NODES="${SLURM_JOB_NUM_NODES:-1}" \
    /usr/local/bin/cascade agent
