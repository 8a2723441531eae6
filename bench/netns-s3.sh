#!/usr/bin/env bash
# A throttled S3 store for the durable benchmark (`bench/run.sh --suite durable`): versitygw in
# network namespace cascade-s3, reached from the root namespace over a veth pair whose two
# directions are each shaped with `tc tbf` to ${CASCADE_LINK_RATE:-1gbit}.
#
#   cs3-host 10.77.0.1/24 (root namespace, shapes host -> S3, the upload direction)
#     <-> cs3-ns 10.77.0.2/24 (namespace cascade-s3, shapes S3 -> host, the download direction)
#   versitygw (posix backend) on 10.77.0.2:7070, bucket cascade-bench, fixed test credentials
#
# usage: bench/netns-s3.sh up          set everything up (idempotent); prints the durable URL
#        bench/netns-s3.sh down        stop the server, remove namespace, veth and data dir
#        bench/netns-s3.sh env         print `export CASCADE_BENCH_S3_...=...` lines
#        bench/netns-s3.sh status      show the shaping and whether the server answers
#        bench/netns-s3.sh linktest [MiB]
#                                      raw TCP goodput host -> namespace through the shaped
#                                      link (python3 sender and receiver; default 256 MiB)
# Settings (environment): CASCADE_LINK_RATE (1gbit; tc syntax: kbit, mbit, gbit, bit, bps...),
# CASCADE_LINK_BURST (bytes; default 2 ms at the rate, at least 64 KiB),
# CASCADE_LINK_LATENCY (50ms), CASCADE_S3_DATA (/var/tmp/cascade-s3-data), VERSITYGW (path of
# the versitygw binary; default: PATH, then ~/go/bin, /root/go/bin).
# Needs root, iproute2 (ip, tc); ethtool to turn segmentation offloads off (installed with
# apt-get when missing; without it, shaping is less exact); python3 for linktest.
set -euo pipefail

NS=cascade-s3
HOST_DEV=cs3-host
NS_DEV=cs3-ns
HOST_IP=10.77.0.1
NS_IP=10.77.0.2
PORT=7070
LINKTEST_PORT=7071
BUCKET=cascade-bench
ACCESS=cascadebenchkey
SECRET=cascadebenchsecret0123456789
RATE=${CASCADE_LINK_RATE:-1gbit}
LATENCY=${CASCADE_LINK_LATENCY:-50ms}
DATA=${CASCADE_S3_DATA:-/var/tmp/cascade-s3-data}
PIDFILE=/run/cascade-s3.pid
LOG=/run/cascade-s3.log
# Written into the data directory by `up`; `down` removes only a directory that has it.
DATA_TAG=.cascade-s3-data

ME=netns-s3.sh
# shellcheck source=bench/netns-lib.sh
. "$(dirname "$0")/netns-lib.sh"

url() {
    echo "s3://$BUCKET?endpoint=http://$NS_IP:$PORT&access_key=$ACCESS&secret_key=$SECRET"
}

find_versitygw() {
    local c
    for c in "${VERSITYGW:-}" "$(command -v versitygw || true)" "${HOME:-/root}/go/bin/versitygw" \
        /root/go/bin/versitygw; do
        if [ -n "$c" ] && [ -x "$c" ]; then
            echo "$c"
            return
        fi
    done
    die "versitygw not found (set VERSITYGW, or: go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)"
}

# The pid of our running server, or nothing.
server_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 0
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = versitygw ]; then
        echo "$pid"
    fi
}

# True once something accepts TCP connections on $NS_IP:$1 (from the root namespace).
answers() {
    timeout 2 bash -c ": >/dev/tcp/$NS_IP/$1" 2>/dev/null
}

# Turns off segmentation offloads on a device (run as `ethtool_off DEV [netns]`): with TSO/GSO
# the qdisc sees up to 64 KiB super-packets, which tbf must split (or drop when larger than
# the burst); without them it shapes real MTU-sized packets.
ethtool_off() {
    local dev="$1" in=()
    [ "${2:-}" = ns ] && in=(ip netns exec "$NS")
    if ! command -v ethtool >/dev/null; then
        if command -v apt-get >/dev/null; then
            note "installing ethtool"
            (apt-get install -y -qq ethtool || (apt-get update -qq && apt-get install -y -qq ethtool)) \
                >/dev/null 2>&1 || true
        fi
    fi
    if command -v ethtool >/dev/null; then
        "${in[@]}" ethtool -K "$dev" tso off gso off gro off >/dev/null 2>&1 ||
            note "ethtool -K $dev tso off gso off gro off failed; shaping sees offloaded super-packets"
    else
        note "no ethtool: offloads stay on, tbf shapes (split) super-packets; less exact"
    fi
}

up() {
    need_root_tools
    local burst gw pid i p
    burst=$(link_up "${CASCADE_LINK_BURST:-}")
    ethtool_off "$HOST_DEV"
    ethtool_off "$NS_DEV" ns
    shape "$burst"

    mkdir -p "$DATA/$BUCKET"
    touch "$DATA/$DATA_TAG"
    pid=$(server_pid)
    if [ -z "$pid" ]; then
        gw=$(find_versitygw)
        # With the posix backend every top-level directory of $DATA is a bucket. setsid: in a
        # session of its own, so that a Ctrl-C meant for the caller does not reach it.
        setsid ip netns exec "$NS" "$gw" --port "$NS_IP:$PORT" --access "$ACCESS" \
            --secret "$SECRET" --quiet posix "$DATA" </dev/null >"$LOG" 2>&1 &
        # setsid forks when it leads a process group (job control on), so $! may be a parent
        # that is gone; the server is the versitygw process in the namespace.
        pid=""
        for ((i = 0; i < 100; i++)); do
            for p in $(ip netns pids "$NS" 2>/dev/null); do
                if [ "$(cat "/proc/$p/comm" 2>/dev/null || true)" = versitygw ]; then
                    pid=$p
                fi
            done
            [ -n "$pid" ] && break
            sleep 0.05
        done
        [ -n "$pid" ] || die "versitygw did not start: $(tail -n 5 "$LOG" 2>/dev/null | tr '\n' ' ')"
        echo "$pid" >"$PIDFILE"
    fi
    # Wait until it answers (at most 30 s), failing early if it exited.
    for ((i = 0; i < 300; i++)); do
        answers "$PORT" && break
        if [ ! -d "/proc/$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != versitygw ]; then
            rm -f "$PIDFILE"
            die "versitygw exited: $(tail -n 5 "$LOG" 2>/dev/null | tr '\n' ' ')"
        fi
        sleep 0.1
    done
    answers "$PORT" || die "versitygw (pid $pid) does not answer on $NS_IP:$PORT after 30 s; log: $LOG"
    note "up: versitygw pid $pid on $NS_IP:$PORT (data $DATA), link $RATE each way (tbf burst ${burst} B, latency $LATENCY)"
    url
}

down() {
    need_root_tools
    local pid i
    pid=$(server_pid)
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            [ -d "/proc/$pid" ] || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    # Anything else still running in the namespace was started by this script (a linktest
    # receiver of an interrupted run).
    link_down
    if [ -d "$DATA" ]; then
        if [ -e "$DATA/$DATA_TAG" ]; then
            rm -rf -- "$DATA"
        else
            note "left $DATA in place: it was not made by netns-s3.sh up (no $DATA_TAG in it)"
        fi
    fi
    rm -f "$LOG"
    note "down"
}

env_lines() {
    printf "export CASCADE_BENCH_S3_URL='%s'\n" "$(url)"
    printf "export CASCADE_BENCH_S3_ENDPOINT='http://%s:%s'\n" "$NS_IP" "$PORT"
    printf "export CASCADE_BENCH_S3_BUCKET='%s'\n" "$BUCKET"
    printf "export CASCADE_BENCH_S3_ACCESS_KEY='%s'\n" "$ACCESS"
    printf "export CASCADE_BENCH_S3_SECRET_KEY='%s'\n" "$SECRET"
    printf "export CASCADE_BENCH_NETNS='%s'\n" "$NS"
    printf "export CASCADE_BENCH_LINK_DEV='%s'\n" "$HOST_DEV"
    printf "export CASCADE_BENCH_LINK_RATE='%s'\n" "$RATE"
    if [ -z "$(server_pid)" ]; then
        note "warning: the server is not running (bench/netns-s3.sh up)"
    fi
}

status() {
    need_root_tools
    show_shaping
    local pid
    pid=$(server_pid)
    if [ -n "$pid" ] && answers "$PORT"; then
        echo "versitygw pid $pid answers on $NS_IP:$PORT"
    else
        echo "versitygw is not answering"
        return 1
    fi
}

linktest() {
    need_root_tools
    local mib="${1:-256}" rx out rc
    [[ "$mib" =~ ^[0-9]+$ ]] && [ "$mib" -gt 0 ] || die "linktest: MiB must be a positive number"
    [ -e "/run/netns/$NS" ] || die "namespace $NS does not exist (bench/netns-s3.sh up)"
    command -v python3 >/dev/null || die "linktest needs python3"
    # Receiver in the namespace: counts bytes until EOF, then answers with the count.
    ip netns exec "$NS" python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(30)
c, _ = s.accept()
c.settimeout(None)
buf = bytearray(1 << 20)
n = 0
while True:
    k = c.recv_into(buf)
    if not k:
        break
    n += k
c.sendall(str(n).encode())
c.close()
' "$NS_IP" "$LINKTEST_PORT" &
    rx=$!
    # Sender on the host: the clock runs from the connect until the receiver has counted
    # every byte (one round trip more than the data needs).
    set +e
    out=$(python3 -c '
import os, socket, sys, time
ip, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) << 20
deadline = time.monotonic() + 10
while True:
    try:
        s = socket.create_connection((ip, port), timeout=5)
        break
    except (ConnectionRefusedError, socket.timeout):
        if time.monotonic() > deadline:
            sys.exit("linktest: no receiver on %s:%d" % (ip, port))
        time.sleep(0.05)
s.settimeout(None)
piece = memoryview(os.urandom(8 << 20))
t0 = time.monotonic()
sent = 0
while sent < total:
    k = min(len(piece), total - sent)
    s.sendall(piece[:k])
    sent += k
s.shutdown(socket.SHUT_WR)
got = int(s.recv(64) or b"0")
t1 = time.monotonic()
if got != total:
    sys.exit("linktest: receiver counted %d of %d bytes" % (got, total))
print("%d %.6f" % (total, t1 - t0))
' "$NS_IP" "$LINKTEST_PORT" "$mib")
    rc=$?
    set -e
    wait "$rx" 2>/dev/null || true
    [ "$rc" = 0 ] || exit "$rc"
    local rate_b
    rate_b=$(rate_bytes "$RATE")
    awk -v out="$out" -v mib="$mib" -v rate="$rate_b" -v r="$RATE" 'BEGIN {
        split(out, f, " "); bytes = f[1]; s = f[2]; g = bytes / s
        printf "linktest: %d MiB host -> %s in %.3f s: goodput %.1f MB/s (%.0f Mbit/s); ", mib, "'"$NS"'", s, g / 1e6, g * 8 / 1e6
        printf "nominal %s = %.1f MB/s; %.1f %% of nominal\n", r, rate / 1e6, 100 * g / rate
        printf "goodput_bytes_per_s=%.0f nominal_bytes_per_s=%.0f seconds=%.6f bytes=%d\n", g, rate, s, bytes
    }'
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    env) env_lines ;;
    status) status ;;
    linktest) linktest "${2:-256}" ;;
    *)
        echo "usage: bench/netns-s3.sh up|down|env|status|linktest [MiB]" >&2
        exit 2
        ;;
esac
