#!/usr/bin/env bash
# A highly-available PostgreSQL on loopback, as production runs it: a
# three-member etcd cluster, two or three PostgreSQL nodes each run by Patroni
# with synchronous replication, and HAProxy in front following Patroni's
# `/primary` health check. Everything is a local process with its own port
# and directory under DIR, started and stopped by PID; nothing listens beyond
# 127.0.0.1. Used by tests/ha.rs and scripts/bench-ha.sh.
#
#   cluster.sh install              Debian packages (patroni, etcd, haproxy), when missing
#   cluster.sh up DIR [NODES] [MODE] start everything (NODES 2 or 3, default 3; MODE sync,
#                                   the default: synchronous_mode; strict: also
#                                   synchronous_mode_strict; async); writes DIR/cluster.env
#   cluster.sh down DIR             stop everything and delete DIR
#   cluster.sh leader DIR           the Patroni leader's name
#   cluster.sh sync DIR             the synchronous standby's name
#   cluster.sh wait-healthy DIR     a leader and a streaming synchronous standby, every node running
#   cluster.sh fault DIR NAME [ARG] one fault (below); prints what it did
#   cluster.sh start-node DIR NODE  start a node's Patroni again (it rejoins as a replica)
#   cluster.sh start-etcd DIR N     start etcd member N again
#
# Faults: kill-leader (the leader's machine dies: Patroni and PostgreSQL
# SIGKILLed; restart it with start-node), kill-leader-postgres (the leader's
# PostgreSQL alone, Patroni left to act), switchover (patronictl switchover to
# the synchronous standby), stop-leader SECONDS (the leader's machine hangs:
# Patroni and PostgreSQL SIGSTOPped, then SIGCONT), vanish-leader SECONDS
# (the leader's packets dropped, then its processes killed, so nothing ever
# answers; lifted after SECONDS: only in a private network namespace, with
# nftables), kill-etcd-leader (restart it with start-etcd).
#
# Patroni talks to etcd through its v2 API by default (HA_DCS=etcd3 for the
# v3 one): Patroni 3.0.2's etcd3 backend renews a leader key without checking
# who holds it, so a leader frozen past the TTL takes the key back when it
# resumes and the new leader demotes itself, discarding what it acknowledged
# (docs/OPERATIONS.md). The v2 backend compares the holder's name first.
#
# cluster.env gives DATABASE_URL (multi-host, target_session_attrs=read-write),
# HAPROXY_URL, the ports, and the node names. Timings are short on purpose
# (ttl 10 s, loop_wait 1 s) so a failover completes in seconds in a test.
set -euo pipefail

PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
PY=/usr/bin/python3   # Patroni is Debian's, on Debian's Python

die() { echo "ha: $*" >&2; exit 1; }

# N free loopback ports, one per line.
free_ports() {
    "$PY" - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))
EOF
}

install() {
    local missing=()
    command -v patroni >/dev/null || missing+=(patroni)
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v etcdctl >/dev/null || missing+=(etcd-client)
    command -v haproxy >/dev/null || missing+=(haproxy)
    "$PY" -c 'import etcd' 2>/dev/null || missing+=(python3-etcd)
    command -v nft >/dev/null || missing+=(nftables)
    if [ ${#missing[@]} -gt 0 ]; then
        local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
        $sudo apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
    fi
    # Where an init system started the packages' own services, they are left
    # alone: every process here has its own port.
}

load() {
    [ -f "$1/cluster.env" ] || die "no cluster in $1"
    # shellcheck disable=SC1091
    . "$1/cluster.env"
}

# Start one background process in its own session; its pid (= its process
# group) goes to DIR/pids/NAME.
spawn() {
    local dir=$1 name=$2; shift 2
    setsid "$@" >>"$dir/logs/$name.log" 2>&1 < /dev/null &
    echo $! > "$dir/pids/$name"
}

start_etcd() {
    local dir=$1 i=$2
    local cport pport
    cport=$(eval echo "\$ETCD_CLIENT_$i"); pport=$(eval echo "\$ETCD_PEER_$i")
    local state=new; [ -d "$dir/etcd$i/member" ] && state=existing
    spawn "$dir" "etcd$i" etcd --name "e$i" --data-dir "$dir/etcd$i" \
        --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "$ETCD_INITIAL" --initial-cluster-state "$state" --initial-cluster-token queen-ha \
        --heartbeat-interval 100 --election-timeout 1000 --enable-v2=true
}

start_node() {
    local dir=$1 node=$2
    if [ "$(id -u)" = 0 ]; then
        spawn "$dir" "$node" runuser -u postgres -- patroni "$dir/$node/patroni.yml"
    else
        spawn "$dir" "$node" patroni "$dir/$node/patroni.yml"
    fi
}

node_config() {
    local dir=$1 node=$2 pgport=$3 apiport=$4 sync=$5 strict=$6
    cat > "$dir/$node/patroni.yml" <<EOF
scope: queen-ha
name: $node
log:
  level: INFO
restapi:
  listen: 127.0.0.1:$apiport
  connect_address: 127.0.0.1:$apiport
$DCS:
  hosts: $ETCD_HOSTS
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: $sync
    synchronous_mode_strict: $strict
    synchronous_node_count: 1
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 200
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        TimeZone: UTC
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$pgport
  connect_address: 127.0.0.1:$pgport
  data_dir: $dir/$node/data
  bin_dir: $PGBIN
  pgpass: $dir/$node/pgpass
  authentication:
    superuser: {username: postgres, password: postgres}
    replication: {username: replicator, password: replicator}
    rewind: {username: postgres, password: postgres}
  parameters:
    unix_socket_directories: $dir/$node
    max_connections: 200
tags:
  nofailover: false
  noloadbalance: false
EOF
}

up() {
    local dir=$1 nodes=${2:-3} mode=${3:-sync}
    [ "$nodes" = 2 ] || [ "$nodes" = 3 ] || die "NODES is 2 or 3"
    local sync strict=false
    case "$mode" in
        sync) sync=true ;;
        strict) sync=true; strict=true ;;
        async) sync=false ;;
        *) die "MODE is sync, strict or async" ;;
    esac
    [ -n "$PGBIN" ] && [ -x "$PGBIN/postgres" ] || die "no PostgreSQL server binaries (PGBIN)"
    command -v patroni >/dev/null && command -v etcd >/dev/null && command -v haproxy >/dev/null || die "run: $0 install"
    mkdir -p "$dir/pids" "$dir/logs"
    mapfile -t ports < <(free_ports $((6 + 2 * nodes + 1)))
    local env="$dir/cluster.env" names=() hosts=() initial=() urlhosts=()
    {
        echo "DIR=$dir"
        for i in 1 2 3; do
            echo "ETCD_CLIENT_$i=${ports[$((2 * i - 2))]}"
            echo "ETCD_PEER_$i=${ports[$((2 * i - 1))]}"
            hosts+=("127.0.0.1:${ports[$((2 * i - 2))]}")
            initial+=("e$i=http://127.0.0.1:${ports[$((2 * i - 1))]}")
        done
        echo "ETCD_HOSTS=$(IFS=,; echo "${hosts[*]}")"
        echo "ETCD_INITIAL=$(IFS=,; echo "${initial[*]}")"
        for i in $(seq 1 "$nodes"); do
            names+=("n$i")
            echo "PG_PORT_n$i=${ports[$((6 + 2 * i - 2))]}"
            echo "API_PORT_n$i=${ports[$((6 + 2 * i - 1))]}"
            urlhosts+=("127.0.0.1:${ports[$((6 + 2 * i - 2))]}")
        done
        echo "NODES=\"${names[*]}\""
        echo "MODE=$mode"
        echo "DCS=${HA_DCS:-etcd}"
        echo "HAPROXY_PORT=${ports[$((6 + 2 * nodes))]}"
        echo "DATABASE_URL=postgres://postgres@$(IFS=,; echo "${urlhosts[*]}")/postgres?target_session_attrs=read-write"
        echo "HAPROXY_URL=postgres://postgres@127.0.0.1:${ports[$((6 + 2 * nodes))]}/postgres"
    } > "$env"
    load "$dir"
    for i in 1 2 3; do start_etcd "$dir" "$i"; done
    wait_for "etcd to elect a leader" 30 etcd_leader "$dir"
    for node in $NODES; do
        local pgport apiport
        pgport=$(eval echo "\$PG_PORT_$node"); apiport=$(eval echo "\$API_PORT_$node")
        mkdir -p "$dir/$node"
        node_config "$dir" "$node" "$pgport" "$apiport" "$sync" "$strict"
        [ "$(id -u)" = 0 ] && chown -R postgres: "$dir/$node"
        start_node "$dir" "$node"
        # The first node bootstraps alone, so it is the leader; the rest
        # join it by pg_basebackup.
        [ "$node" = n1 ] && wait_for "n1 to bootstrap as the leader" 90 is_leader "$dir" n1
    done
    haproxy_config "$dir"
    spawn "$dir" haproxy haproxy -db -f "$dir/haproxy.cfg"
    wait_healthy "$dir"
    echo "ha: up in $dir ($mode replication, leader $(leader "$dir"))"
}

haproxy_config() {
    local dir=$1
    {
        cat <<EOF
global
    maxconn 2000
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 2s
listen primary
    bind 127.0.0.1:$HAPROXY_PORT
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
EOF
        for node in $NODES; do
            echo "    server $node 127.0.0.1:$(eval echo "\$PG_PORT_$node") check port $(eval echo "\$API_PORT_$node")"
        done
    } > "$dir/haproxy.cfg"
}

wait_for() {
    local what=$1 seconds=$2; shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || die "timed out waiting for $what (logs in ${DIR:-?}/logs)"
        sleep 0.3
    done
}

etcd_leader() {
    local dir=$1
    load "$dir"
    local i
    for i in 1 2 3; do
        local port; port=$(eval echo "\$ETCD_CLIENT_$i")
        local status
        status=$(ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$port" --dial-timeout 1s --command-timeout 1s endpoint status -w json 2>/dev/null) || continue
        if [ "$(echo "$status" | jq -r '.[0].Status.leader == .[0].Status.header.member_id')" = true ]; then
            echo "$i"; return 0
        fi
    done
    return 1
}

# A node's role by its REST API: `GET /primary` answers 200 on the leader only.
api() {
    local dir=$1 node=$2 path=$3
    curl -fsS --max-time 2 "http://127.0.0.1:$(eval echo "\$API_PORT_$node")$path"
}

is_leader() {
    load "$1"
    api "$1" "$2" /primary >/dev/null
}

members() {
    load "$1"
    local node
    for node in $NODES; do
        api "$1" "$node" /cluster 2>/dev/null && return 0
    done
    return 1
}

leader() {
    members "$1" | jq -er '.members[] | select(.role == "leader") | .name'
}

# The synchronous standby (any streaming replica with asynchronous replication).
sync_standby() {
    members "$1" | jq -er '[.members[] | select((.role == "sync_standby" or .role == "replica") and (.state == "streaming" or .state == "running"))] | sort_by(.role != "sync_standby") | .[0].name'
}

healthy() {
    local dir=$1 m
    m=$(members "$dir") || return 1
    load "$dir"
    local n; n=$(echo "$NODES" | wc -w)
    [ "$(echo "$m" | jq '[.members[] | select(.role == "leader" and .state == "running")] | length')" = 1 ] || return 1
    if [ "$MODE" != async ]; then
        [ "$(echo "$m" | jq '[.members[] | select(.role == "sync_standby" and (.state == "streaming" or .state == "running"))] | length')" -ge 1 ] || return 1
    fi
    [ "$(echo "$m" | jq '[.members[] | select(.state == "streaming" or .state == "running")] | length')" = "$n" ] || return 1
    # HAProxy routes to the leader.
    psql "$HAPROXY_URL" -Atc 'SELECT NOT pg_is_in_recovery()' 2>/dev/null | grep -qx t
}

wait_healthy() {
    load "$1"
    wait_for "a leader, a synchronous standby and every node streaming" 120 healthy "$1"
}

# Signals every process of a node: its Patroni session, its postmaster (in a
# session Patroni made for it) and the postmaster's children (PostgreSQL puts
# each backend in a session of its own, so they must be found by parent).
signal_node() {
    local dir=$1 node=$2 sig=$3 pm=""
    local pidfile="$dir/$node/data/postmaster.pid"
    [ -f "$pidfile" ] && pm=$(head -1 "$pidfile")
    # Stopping: the parent first, so it forks nothing new meanwhile;
    # continuing: the children first, so the parent finds them running.
    if [ -n "$pm" ] && [ "$sig" = CONT ]; then pkill "-$sig" -P "$pm" || true; kill "-$sig" "$pm" 2>/dev/null || true; fi
    [ -f "$dir/pids/$node" ] && { kill "-$sig" -- "-$(cat "$dir/pids/$node")" 2>/dev/null || true; }
    if [ -n "$pm" ] && [ "$sig" != CONT ]; then kill "-$sig" "$pm" 2>/dev/null || true; pkill "-$sig" -P "$pm" || true; fi
    return 0
}

kill_postgres() {
    local dir=$1 node=$2 pid
    pid=$(head -1 "$dir/$node/data/postmaster.pid")
    # Frozen first so it cannot reap and clean up, then its backends, then it.
    kill -STOP "$pid"; pkill -9 -P "$pid" || true; kill -9 "$pid" || true
}

fault() {
    local dir=$1 name=$2 arg=${3:-}
    load "$dir"
    local l; l=$(leader "$dir") || die "no leader before the fault"
    case "$name" in
        kill-leader)
            kill_postgres "$dir" "$l"
            signal_node "$dir" "$l" KILL
            echo "killed node $l (Patroni and PostgreSQL)" ;;
        kill-leader-postgres)
            kill_postgres "$dir" "$l"
            echo "killed $l's PostgreSQL" ;;
        switchover)
            local s; s=$(sync_standby "$dir") || die "no synchronous standby to switch over to"
            "$PY" /usr/bin/patronictl -c "$dir/$l/patroni.yml" switchover queen-ha --leader "$l" --candidate "$s" --force >/dev/null
            echo "switched over from $l to $s" ;;
        stop-leader)
            signal_node "$dir" "$l" STOP
            sleep "${arg:-20}"
            signal_node "$dir" "$l" CONT
            echo "stopped node $l for ${arg:-20} s" ;;
        vanish-leader)
            # The leader's machine drops off the network and dies there: its
            # packets are dropped first, so when its processes are killed not
            # even a RST answers (a power cut, a partition). The rules are
            # lifted after SECONDS; start the node again with start-node.
            # Needs nftables, and a private network namespace: the rules
            # match loopback ports.
            command -v nft >/dev/null || die "vanish-leader needs nftables (Debian: nftables)"
            [ "$(ip -o link | wc -l)" = 1 ] || die "vanish-leader runs only in a private network namespace (unshare -n)"
            local pg api; pg=$(eval echo "\$PG_PORT_$l"); api=$(eval echo "\$API_PORT_$l")
            nft add table inet queen_ha
            nft add chain inet queen_ha input '{ type filter hook input priority 0; policy accept; }'
            nft add rule inet queen_ha input tcp dport "{ $pg, $api }" drop
            nft add rule inet queen_ha input tcp sport "{ $pg, $api }" drop
            kill_postgres "$dir" "$l"
            signal_node "$dir" "$l" KILL
            sleep "${arg:-30}"
            nft delete table inet queen_ha
            echo "node $l vanished for ${arg:-30} s" ;;
        kill-etcd-leader)
            local e; e=$(etcd_leader "$dir") || die "no etcd leader"
            kill -9 -- "-$(cat "$dir/pids/etcd$e")" 2>/dev/null || true
            echo "killed etcd member $e (the leader)" ;;
        *) die "unknown fault $name" ;;
    esac
}

down() {
    local dir=$1
    [ -d "$dir/pids" ] || { rm -rf "$dir"; return 0; }
    local node
    if [ -f "$dir/cluster.env" ]; then
        load "$dir"
        for node in $NODES; do
            signal_node "$dir" "$node" CONT
            signal_node "$dir" "$node" KILL
            [ -f "$dir/$node/data/postmaster.pid" ] && kill_postgres "$dir" "$node" 2>/dev/null || true
        done
    fi
    local f
    for f in "$dir"/pids/*; do
        [ -f "$f" ] && { kill -9 -- "-$(cat "$f")" 2>/dev/null || kill -9 "$(cat "$f")" 2>/dev/null || true; }
    done
    rm -rf "$dir"
}

cmd=${1:-}; shift || true
case "$cmd" in
    install) install ;;
    up) up "$@" ;;
    down) down "$@" ;;
    leader) leader "$@" ;;
    sync) sync_standby "$@" ;;
    wait-healthy) wait_healthy "$@" ;;
    fault) fault "$@" ;;
    start-node) load "$1"; start_node "$1" "$2" ;;
    start-etcd) load "$1"; start_etcd "$1" "$2" ;;
    *) sed -n '2,30p' "$0"; exit 2 ;;
esac
