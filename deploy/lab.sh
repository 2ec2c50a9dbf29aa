#!/bin/sh
# Serve the lab to a class from one machine: REPLICAS copies of the app on loopback ports,
# behind nginx with sticky sessions (deploy/nginx.conf.in).
#
#   deploy/lab.sh start [REPLICAS] [LISTEN] [FIRST_PORT]   defaults: two per CPU, 8080, 8501
#   deploy/lab.sh stop
#   deploy/lab.sh status
#
# Two per CPU: a replica is bound by its own event loop (one thread sends every session's
# messages) before it is bound by a core (bench/RESULTS.md, Load). Each takes about 0.85 GB
# (0.5 for the server, 0.33 for its kernel-check worker; PAGED_LAB_LIVE_WORKERS=0 saves the
# latter for somewhat slower steps).
# LISTEN is nginx's `listen` (a port, or address:port). Replica i serves on 127.0.0.1:
# FIRST_PORT + i, reachable only through nginx. RUN_DIR (default deploy/run) holds the pids,
# the logs and the rendered nginx.conf. Each replica runs with the settings of a shared
# deployment: no server-side /metrics fetch (PAGED_LAB_URL_FETCH=off), no developer menu
# (rerun, clear cache), error types but no tracebacks in the browser, no file watcher, one BLAS
# thread, and PAGED_LAB_LIVE_WORKERS kernel-check workers (default 1: the replicas themselves
# are the parallelism).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
RUN_DIR=${RUN_DIR:-$here/run}
PYTHON=${PYTHON:-$root/.venv/bin/python}
NGINX_BIN=${NGINX_BIN:-nginx}  # not NGINX: nginx reads that variable itself
START_TIMEOUT_S=${START_TIMEOUT_S:-120}

healthy() {  # healthy PORT: the replica answers its health check
    "$PYTHON" -c "import sys, urllib.request
try:
    urllib.request.urlopen('http://127.0.0.1:$1/_stcore/health', timeout=2)
except OSError:
    sys.exit(1)"
}

start() {
    replicas=${1:-$((2 * $(nproc)))}
    listen=${2:-8080}
    first=${3:-8501}
    mkdir -p "$RUN_DIR/tmp"
    upstreams=""
    i=0
    while [ "$i" -lt "$replicas" ]; do
        port=$((first + i))
        # setsid: each replica (and its workers) in its own process group, stopped as one.
        (cd "$root" && PAGED_LAB_URL_FETCH=off OPENBLAS_NUM_THREADS=1 \
            PAGED_LAB_LIVE_WORKERS=${PAGED_LAB_LIVE_WORKERS:-1} exec setsid "$PYTHON" -m ui.serve \
            --server.port "$port" --server.address 127.0.0.1 --server.headless true \
            --browser.gatherUsageStats false --server.fileWatcherType none \
            --client.toolbarMode viewer --client.showErrorDetails type \
            >"$RUN_DIR/replica-$port.log" 2>&1) &
        echo $! >"$RUN_DIR/replica-$port.pid"
        upstreams="${upstreams}server 127.0.0.1:$port max_fails=3 fail_timeout=10s; "
        i=$((i + 1))
    done
    for pidfile in "$RUN_DIR"/replica-*.pid; do
        port=$(basename "$pidfile" .pid | cut -d- -f2)
        waited=0
        until healthy "$port"; do
            if [ "$waited" -ge "$START_TIMEOUT_S" ] || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
                echo "replica on port $port did not start; see $RUN_DIR/replica-$port.log" >&2
                stop
                exit 1
            fi
            sleep 1
            waited=$((waited + 1))
        done
    done
    sed -e "s|@LISTEN@|$listen|" -e "s|@UPSTREAMS@|$upstreams|" -e "s|@RUN_DIR@|$RUN_DIR|g" \
        "$here/nginx.conf.in" >"$RUN_DIR/nginx.conf"
    "$NGINX_BIN" -q -t -c "$RUN_DIR/nginx.conf" -p "$RUN_DIR"
    "$NGINX_BIN" -c "$RUN_DIR/nginx.conf" -p "$RUN_DIR"
    echo "serving $replicas replica(s) on $listen (logs and pids in $RUN_DIR)"
}

stop() {
    if [ -f "$RUN_DIR/nginx.pid" ]; then
        kill "$(cat "$RUN_DIR/nginx.pid")" 2>/dev/null || true
        rm -f "$RUN_DIR/nginx.pid"
    fi
    for pidfile in "$RUN_DIR"/replica-*.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill -TERM "-$pid" 2>/dev/null || true
        waited=0
        while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 20 ]; do
            sleep 0.5
            waited=$((waited + 1))
        done
        kill -KILL "-$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
}

status() {
    for pidfile in "$RUN_DIR"/replica-*.pid; do
        [ -f "$pidfile" ] || continue
        port=$(basename "$pidfile" .pid | cut -d- -f2)
        if healthy "$port"; then state=healthy; else state=down; fi
        echo "replica 127.0.0.1:$port pid $(cat "$pidfile") $state"
    done
    if [ -f "$RUN_DIR/nginx.pid" ] && kill -0 "$(cat "$RUN_DIR/nginx.pid")" 2>/dev/null; then
        echo "nginx pid $(cat "$RUN_DIR/nginx.pid")"
    else
        echo "nginx not running"
    fi
}

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
    start) start "$@" ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start [REPLICAS] [LISTEN] [FIRST_PORT] | stop | status" >&2; exit 2 ;;
esac
