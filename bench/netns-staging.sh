#!/usr/bin/env bash
# A network namespace for staging servers in the staging benchmark (`bench/run.sh --suite
# staging`): the node (root namespace) reaches the servers over a veth pair whose two
# directions are each shaped with `tc tbf` to ${CASCADE_STAGE_LINK_RATE:-10gbit}, and the
# servers reach the throttled S3 store of bench/netns-s3.sh through the root namespace, i.e.
# over its 1 Gbit/s link (the drain).
#
#   cst-host 10.78.0.1/24 (root namespace, shapes node -> servers)
#     <-> cst-ns 10.78.0.2/24 (namespace cascade-stage, shapes servers -> node; default route
#         via 10.78.0.1)
#   forwarding on cst-host and cs3-host only (net.ipv4.conf.DEV.forwarding, not ip_forward),
#   and in namespace cascade-s3 a route to 10.78.0.0/24 via 10.77.0.1 (when it exists: run
#   bench/netns-s3.sh up first)
#
# The benchmark starts the servers itself (setns into the namespace); this script only builds
# the link.
#
# usage: bench/netns-staging.sh up        set everything up (idempotent)
#        bench/netns-staging.sh down      remove namespace, veth pair, route and forwarding
#        bench/netns-staging.sh env       print `export CASCADE_BENCH_STAGE_...=...` lines
#        bench/netns-staging.sh status    show the shaping, routes and forwarding
# Settings (environment): CASCADE_STAGE_LINK_RATE (10gbit; tc syntax), CASCADE_STAGE_LINK_BURST
# (bytes; default 2 ms at the rate, at least 64 KiB), CASCADE_STAGE_LINK_LATENCY (50ms),
# CASCADE_STAGE_OFFLOADS (on: the veth pair keeps TSO/GSO, so tbf shapes 64 KiB
# super-packets, which at 10 Gbit/s it can; off: MTU-sized packets, which two cores cannot
# push at 10 Gbit/s). Needs root and iproute2 (ip, tc); ethtool for CASCADE_STAGE_OFFLOADS=off.
set -euo pipefail

NS=cascade-stage
HOST_DEV=cst-host
NS_DEV=cst-ns
HOST_IP=10.78.0.1
NS_IP=10.78.0.2
NET=10.78.0.0/24
# bench/netns-s3.sh's names.
S3_NS=cascade-s3
S3_HOST_DEV=cs3-host
S3_HOST_IP=10.77.0.1
RATE=${CASCADE_STAGE_LINK_RATE:-10gbit}
LATENCY=${CASCADE_STAGE_LINK_LATENCY:-50ms}
OFFLOADS=${CASCADE_STAGE_OFFLOADS:-on}
# Whether `up` turned forwarding on for cs3-host (then `down` turns it off again).
FWD_STATE=/run/cascade-stage.cs3-forwarding

ME=netns-staging.sh
# shellcheck source=bench/netns-lib.sh
. "$(dirname "$0")/netns-lib.sh"

forwarding() {
    local f="/proc/sys/net/ipv4/conf/$1/forwarding"
    [ -e "$f" ] || return 0
    echo "$2" >"$f"
}

up() {
    need_root_tools
    local burst
    burst=$(link_up "${CASCADE_STAGE_LINK_BURST:-}")
    ip -n "$NS" route replace default via "$HOST_IP"
    if [ "$OFFLOADS" = off ]; then
        command -v ethtool >/dev/null || die "CASCADE_STAGE_OFFLOADS=off needs ethtool"
        ethtool -K "$HOST_DEV" tso off gso off gro off >/dev/null 2>&1 || true
        ip netns exec "$NS" ethtool -K "$NS_DEV" tso off gso off gro off >/dev/null 2>&1 || true
    fi
    shape "$burst"
    # The drain: namespace -> cst-host -> (forwarded) -> cs3-host (1 Gbit/s) -> S3, and back.
    forwarding "$HOST_DEV" 1
    if [ -e "/run/netns/$S3_NS" ] && ip link show "$S3_HOST_DEV" >/dev/null 2>&1; then
        if [ ! -e "$FWD_STATE" ]; then
            cat "/proc/sys/net/ipv4/conf/$S3_HOST_DEV/forwarding" >"$FWD_STATE"
        fi
        forwarding "$S3_HOST_DEV" 1
        ip -n "$S3_NS" route replace "$NET" via "$S3_HOST_IP"
        note "up: $NS_IP in namespace $NS, link $RATE each way (tbf burst $burst B, latency $LATENCY, offloads $OFFLOADS); routed to namespace $S3_NS"
    else
        note "up: $NS_IP in namespace $NS, link $RATE each way (tbf burst $burst B, latency $LATENCY, offloads $OFFLOADS); no namespace $S3_NS (bench/netns-s3.sh up first): servers here cannot reach it"
    fi
}

down() {
    need_root_tools
    # Anything still running in the namespace is a server of an interrupted benchmark.
    link_down term
    if [ -e "/run/netns/$S3_NS" ]; then
        ip -n "$S3_NS" route del "$NET" 2>/dev/null || true
    fi
    if [ -e "$FWD_STATE" ]; then
        forwarding "$S3_HOST_DEV" "$(cat "$FWD_STATE")" 2>/dev/null || true
        rm -f "$FWD_STATE"
    fi
    note "down"
}

env_lines() {
    printf "export CASCADE_BENCH_STAGE_NETNS='%s'\n" "$NS"
    printf "export CASCADE_BENCH_STAGE_IP='%s'\n" "$NS_IP"
    printf "export CASCADE_BENCH_STAGE_LINK_DEV='%s'\n" "$HOST_DEV"
}

status() {
    need_root_tools
    show_shaping
    ip -n "$NS" route
    echo "forwarding: $HOST_DEV $(cat "/proc/sys/net/ipv4/conf/$HOST_DEV/forwarding" 2>/dev/null || echo -)," \
        "$S3_HOST_DEV $(cat "/proc/sys/net/ipv4/conf/$S3_HOST_DEV/forwarding" 2>/dev/null || echo -)"
    if [ -e "/run/netns/$S3_NS" ]; then
        echo "route in $S3_NS: $(ip -n "$S3_NS" route show "$NET" || true)"
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    env) env_lines ;;
    status) status ;;
    *)
        echo "usage: bench/netns-staging.sh up|down|env|status" >&2
        exit 2
        ;;
esac
