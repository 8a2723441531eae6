# Shared by bench/netns-s3.sh and bench/netns-staging.sh (sourced; the caller sets ME, NS,
# HOST_DEV, NS_DEV, HOST_IP, NS_IP, RATE, LATENCY): a veth pair from the root namespace into
# network namespace $NS, both directions shaped with `tc tbf`.

die() {
    echo "$ME: $*" >&2
    exit 1
}
note() { echo "$ME: $*" >&2; }

need_root_tools() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, veth and tc need it)"
    command -v ip >/dev/null || die "'ip' not found (install iproute2)"
    command -v tc >/dev/null || die "'tc' not found (install iproute2)"
}

# Bytes per second of a tc rate ("1gbit", "500mbit", "100mbps", "1000000"): decimal units,
# bit-based unless the unit ends in "bps" (bytes), as tc(8) reads them.
rate_bytes() {
    awk -v r="$1" 'BEGIN {
        if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
        n = substr(r, 1, RLENGTH) + 0; u = tolower(substr(r, RLENGTH + 1))
        m["bit"] = 1/8; m[""] = 1/8; m["kbit"] = 1e3/8; m["mbit"] = 1e6/8; m["gbit"] = 1e9/8
        m["tbit"] = 1e12/8; m["kibit"] = 1024/8; m["mibit"] = 1048576/8
        m["gibit"] = 1073741824/8; m["bps"] = 1; m["kbps"] = 1e3; m["mbps"] = 1e6
        m["gbps"] = 1e9; m["tbps"] = 1e12
        if (!(u in m)) exit 1
        printf "%.0f\n", n * m[u]
    }' || die "$1: not a tc rate (e.g. 1gbit, 500mbit, 100mbps)"
}

# The namespace, the veth pair (addresses, up) and tbf on both ends; BURST in bytes (default
# 2 ms at the rate, at least 64 KiB: well above one packet and the timer slack, a negligible
# head start on a transfer of many MB). Prints the burst.
link_up() {
    local rate_b burst
    rate_b=$(rate_bytes "$RATE")
    burst=${1:-$((rate_b / 500 > 65536 ? rate_b / 500 : 65536))}
    [ -e "/run/netns/$NS" ] || ip netns add "$NS"
    if ! ip link show "$HOST_DEV" >/dev/null 2>&1; then
        # A half-made pair from an interrupted run: its peer may already sit in the namespace.
        ip -n "$NS" link del "$NS_DEV" 2>/dev/null || true
        ip link add "$HOST_DEV" type veth peer name "$NS_DEV"
        ip link set "$NS_DEV" netns "$NS"
    fi
    ip addr replace "$HOST_IP/24" dev "$HOST_DEV"
    ip link set "$HOST_DEV" up
    ip -n "$NS" addr replace "$NS_IP/24" dev "$NS_DEV"
    ip -n "$NS" link set "$NS_DEV" up
    ip -n "$NS" link set lo up
    echo "$burst"
}

# tbf on both ends: host -> namespace on the host end, namespace -> host inside it.
shape() {
    tc qdisc replace dev "$HOST_DEV" root tbf rate "$RATE" burst "$1" latency "$LATENCY"
    tc -n "$NS" qdisc replace dev "$NS_DEV" root tbf rate "$RATE" burst "$1" latency "$LATENCY"
}

# Kills what still runs in the namespace (SIGTERM first when given "term") and deletes it and
# the pair (deleting the namespace deletes the pair; this catches a pair whose peer never
# moved).
link_down() {
    local p
    if [ -e "/run/netns/$NS" ]; then
        if [ "${1:-}" = term ]; then
            for p in $(ip netns pids "$NS" 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
            sleep 0.2
        fi
        for p in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
        ip netns del "$NS"
    fi
    ip link del "$HOST_DEV" 2>/dev/null || true
}

# Both ends' qdiscs with their counters.
show_shaping() {
    [ -e "/run/netns/$NS" ] || die "namespace $NS does not exist (bench/$ME up)"
    tc -s qdisc show dev "$HOST_DEV"
    tc -n "$NS" -s qdisc show dev "$NS_DEV"
}
