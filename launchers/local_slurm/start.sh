#!/usr/bin/env bash
# Start a real one-node SLURM cluster (Debian's Slurm 22.05 + munge, optionally slurmdbd + a private MariaDB)
# on this machine, for the tests and for trying launcher=slurm. Idempotent: installs what is missing, renders
# the config, starts what is not running (restarts what a changed config affects) and prints one line when
# the node accepts jobs. No systemd or cgroups needed. See README.md here.
#
# Exit codes: 0 ready | 2 not root | 3 cannot install the packages (no apt-get, or apt fails)
#             4 /etc/slurm/slurm.conf belongs to someone else | 5 a daemon did not come up (see the log named)
set -euo pipefail
source "$(dirname "$0")/common.sh"

fail() { echo "local_slurm: $2" >&2; exit "$1"; }
t0=$(date +%s%N)
elapsed() { local ms=$((($(date +%s%N) - $1) / 1000000)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }

[[ $(id -u) == 0 ]] || fail 2 "not root: starting SLURM daemons needs root (try: sudo $0)"

mkdir -p "$STATE"
exec 9>"$STATE/.lock"
flock 9  # one start/stop at a time; daemons are started with 9>&- so they do not inherit the lock
env | grep -E '^LOCAL_SLURM_[A-Z_]+=' | grep -v '^LOCAL_SLURM_STATE=' | sort >"$STATE/settings.env" || true

# --- packages -----------------------------------------------------------------------------------------------
PACKAGES=(slurmctld slurmd slurm-client munge)
[[ $ACCOUNTING == 1 ]] && PACKAGES+=(slurmdbd mariadb-server)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    command -v apt-get >/dev/null || fail 3 "no apt-get: install ${missing[*]} yourself (Debian/Ubuntu packages)"
    # Keep the packages' init scripts from starting daemons with their default configs.
    own_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
    fi
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
        >>"$STATE/apt.log" 2>&1; }
    ti=$(date +%s%N)
    ok=1
    apt_install || { apt-get update -q >>"$STATE/apt.log" 2>&1 && apt_install; } || ok=0
    ((own_policy)) && rm -f /usr/sbin/policy-rc.d
    ((ok)) || fail 3 "apt-get could not install ${missing[*]} (log: $STATE/apt.log)"
    echo "local_slurm: installed ${missing[*]} in $(elapsed "$ti") s" >&2
fi

# --- config -------------------------------------------------------------------------------------------------
HOST=$(hostname -s)
if [[ -n ${LOCAL_SLURM_CPUS:-} ]]; then
    NODE_HW="CPUs=$LOCAL_SLURM_CPUS"
else  # the machine's own topology, as slurmd sees it
    NODE_HW=$(slurmd -C | head -1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')
fi
CPUS=$(echo "$NODE_HW" | tr ' ' '\n' | sed -n 's/^CPUs=//p')
MEM_MB=${LOCAL_SLURM_MEM_MB:-$(slurmd -C | head -1 | tr ' ' '\n' | sed -n 's/^RealMemory=//p')}
NODE_HW="$NODE_HW RealMemory=$MEM_MB"
DEF_MEM_PER_CPU=$(( MEM_MB / CPUS < 1024 ? MEM_MB / CPUS : 1024 ))  # a job without --mem does not take the node
# LOCAL_SLURM_NODES > 1: that many nodes on this host, each its own slurmd (`slurmd -N <name>`, its own port, spool
# and pid file), the machine's CPUs and memory split between them: a multi-node cluster to test on
NODES=${LOCAL_SLURM_NODES:-1}
((NODES >= 1 && NODES <= CPUS)) || fail 5 "LOCAL_SLURM_NODES=$NODES: give 1..$CPUS (each node needs a CPU)"
if ((NODES == 1)); then
    NAMES=("$HOST")
else
    NAMES=()
    for ((k = 1; k <= NODES; k++)); do NAMES+=("$HOST-$k"); done
    NODE_HW="CPUs=$((CPUS / NODES)) RealMemory=$((MEM_MB / NODES))"
fi
# fake GPUs: character devices with NVIDIA's major number under the state directory (nothing opens them); slurmd
# hands them out as GRES gpu and sets each step's CUDA_VISIBLE_DEVICES, so GPU binding is testable without GPUs
GPUS=${LOCAL_SLURM_GPUS:-2}
NODE_LINES="" GRES_LINES="" GRES_TYPES=""
((GPUS > 0)) && GRES_TYPES="GresTypes=gpu"
for ((i = 0; i < NODES; i++)); do
    name=${NAMES[$i]} port=$((SLURMD_PORT + 10 * i))
    gres=""
    if ((GPUS > 0)); then
        mkdir -p "$STATE/dev/$name"
        for ((k = 0; k < GPUS; k++)); do
            [[ -c $STATE/dev/$name/nvidia$k ]] || mknod "$STATE/dev/$name/nvidia$k" c 195 "$k" ||
                fail 5 "mknod $STATE/dev/$name/nvidia$k failed"
        done
        gres="Gres=gpu:$GPUS"
        GRES_LINES+="NodeName=$name Name=gpu File=$STATE/dev/$name/nvidia[0-$((GPUS - 1))]\n"
    fi
    NODE_LINES+="NodeName=$name NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$port $NODE_HW $gres Features=$FEATURES State=UNKNOWN\n"
done
NODE_LIST=$(IFS=,; echo "${NAMES[*]}")
if [[ $ACCOUNTING == 1 ]]; then
    ACCT="AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\nAccountingStoragePort=$DBD_PORT"
else
    ACCT="AccountingStorageType=accounting_storage/none"
fi
[[ -f $STATE/db.pass ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$STATE/db.pass")
DB_PASS=$(cat "$STATE/db.pass")

render() {  # render TEMPLATE: substitute @VARS@
    sed -e "s|@CLUSTER@|$CLUSTER|g; s|@HOST@|$HOST|g; s|@STATE@|$STATE|g; s|@PARTITION@|$PARTITION|g; s|@FEATURES@|$FEATURES|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g; s|@SLURMD_PORT@|$SLURMD_PORT|g; s|@DBD_PORT@|$DBD_PORT|g" \
        -e "s|@DB_PORT@|$DB_PORT|g; s|@DB_PASS@|$DB_PASS|g; s|@NODE_HW@|$NODE_HW|g" \
        -e "s|@DEF_MEM_PER_CPU@|$DEF_MEM_PER_CPU|g; s|@ACCOUNTING@|$ACCT|g" \
        -e "s|@GRES_TYPES@|$GRES_TYPES|g; s|@GRES_LINES@|$GRES_LINES|g; s|@NODE_LINES@|$NODE_LINES|g" \
        -e "s|@NODE_LIST@|$NODE_LIST|g; s|@URGENT@|$URGENT|g; s|@SLURMD_TIMEOUT@|$SLURMD_TIMEOUT|g" "$1"
}
# install_conf TEMPLATE DEST MODE: write DEST if it changed; returns 0 when it changed
install_conf() {
    local new
    new=$(render "$1")
    if [[ -f $2 ]] && ! grep -q "$MARKER" "$2"; then
        fail 4 "$2 exists and was not written by this script: refusing to overwrite a real cluster's config"
    fi
    [[ -f $2 ]] && [[ $(cat "$2") == "$new" ]] && return 1
    mkdir -p "$(dirname "$2")"
    (umask 077 && printf '%s\n' "$new" >"$2.tmp") && chmod "$3" "$2.tmp" && mv "$2.tmp" "$2"
    return 0
}
slurm_changed=0; dbd_changed=0
install_conf "$HERE/slurm.conf.in" "$CONF_DIR/slurm.conf" 644 && slurm_changed=1
install_conf "$HERE/gres.conf.in" "$CONF_DIR/gres.conf" 644 && slurm_changed=1
if [[ $ACCOUNTING == 1 ]]; then
    install_conf "$HERE/slurmdbd.conf.in" "$CONF_DIR/slurmdbd.conf" 600 && dbd_changed=1
fi
mkdir -p "$STATE"/{slurmctld,slurmd,log,run}

# --- daemons ------------------------------------------------------------------------------------------------
wait_for() {  # wait_for SECONDS LOG COMMAND...: poll COMMAND until it succeeds
    local secs=$1 log=$2; shift 2
    for _ in $(seq $((secs * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    fail 5 "timed out waiting for: $* (log: $log)"
}

# munge: as the munge user, key 0400, /run/munge created (tmpfs)
MUNGE_PID=/run/munge/munged.pid
if ! is_running munged "$MUNGE_PID"; then
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge && mungekey --create --keyfile=/etc/munge/munge.key
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged --force 9>&- || fail 5 "munged did not start (log: /var/log/munge/munged.log)"
    touch "$STATE/run/munged.ours"  # stop.sh stops munged only if we started it
fi
wait_for 10 /var/log/munge/munged.log bash -c 'munge -n | unmunge'

if [[ $ACCOUNTING == 1 ]]; then
    # A private MariaDB (own datadir, port and socket), leaving any system MariaDB alone.
    DB_DIR=$STATE/mysql DB_RUN=$STATE/run/mysql
    mkdir -p "$DB_RUN" && chown mysql:mysql "$DB_RUN"
    if [[ ! -d $DB_DIR/mysql ]]; then
        mariadb-install-db --no-defaults --datadir="$DB_DIR" --user=mysql --skip-test-db \
            --auth-root-authentication-method=socket >"$STATE/log/mariadb-install.log" 2>&1 ||
            fail 5 "mariadb-install-db failed (log: $STATE/log/mariadb-install.log)"
    fi
    if ! is_running mariadbd "$DB_RUN/mariadbd.pid"; then
        setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR" --socket="$DB_RUN/mysqld.sock" \
            --pid-file="$DB_RUN/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
            --log-error="$STATE/log/mariadb.log" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
            </dev/null >/dev/null 2>&1 9>&- &
    fi
    wait_for 30 "$STATE/log/mariadb.log" mariadb-admin --no-defaults --socket="$DB_RUN/mysqld.sock" ping
    mariadb --no-defaults --socket="$DB_RUN/mysqld.sock" -u root -e "
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
        fail 5 "could not create the slurm database user (log: $STATE/log/mariadb.log)"

    ((dbd_changed)) && stop_daemon slurmdbd "$STATE/run/slurmdbd.pid"
    is_running slurmdbd "$STATE/run/slurmdbd.pid" || /usr/sbin/slurmdbd 9>&- ||
        fail 5 "slurmdbd did not start (log: $STATE/log/slurmdbd.log)"
    wait_for 30 "$STATE/log/slurmdbd.log" sacctmgr -n list cluster
    sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" ||
        sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail 5 "sacctmgr could not add cluster $CLUSTER"
fi

if ((slurm_changed)); then  # a new node shape or accounting setting needs fresh daemons
    for pidfile in "$STATE"/run/slurmd*.pid; do stop_daemon slurmd "$pidfile"; done
    stop_daemon slurmctld "$STATE/run/slurmctld.pid"
fi
is_running slurmctld "$STATE/run/slurmctld.pid" || /usr/sbin/slurmctld -f "$CONF_DIR/slurm.conf" 9>&- ||
    fail 5 "slurmctld did not start (log: $STATE/log/slurmctld.log)"
for name in "${NAMES[@]}"; do
    mkdir -p "$STATE/slurmd/$name"
    is_running slurmd "$STATE/run/slurmd-$name.pid" || /usr/sbin/slurmd -f "$CONF_DIR/slurm.conf" -N "$name" 9>&- ||
        fail 5 "slurmd -N $name did not start (log: $STATE/log/slurmd-$name.log)"
done
wait_for 30 "$STATE/log/slurmctld.log" scontrol ping

node_state() { sinfo -h -n "$1" -o %t 2>/dev/null | head -1; }
for name in "${NAMES[@]}"; do
    for _ in $(seq 300); do
        case $(node_state "$name") in
            idle* | mix* | alloc* | comp*) break ;;
            down* | drain* | drng* | fail*) scontrol update nodename="$name" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.1
    done
    case $(node_state "$name") in
        idle* | mix* | alloc* | comp*) ;;
        *) fail 5 "node $name is '$(node_state "$name")', not accepting jobs (logs: $STATE/log/slurmd-$name.log, slurmctld.log)" ;;
    esac
done

# Jobs slurmctld recovered as running whose processes are gone: the machine (or every daemon with its step daemons)
# stopped under them. Every node is on this host, so a running batch job has a `slurmstepd: [<id>.batch]` here; SLURM
# itself purges such a job only after a node reboot it can see, and would leave it holding its CPUs until its time
# limit. Requeued, as SLURM does after a node failure (the pipeline resumes from its run directory), or cancelled when
# the job does not allow requeueing. Only jobs that started before this script did, so none is still launching.
began=$((t0 / 1000000000))
requeued=() cancelled=()
while read -r id start; do
    [[ -n $id ]] || continue
    (($(date -d "$start" +%s 2>/dev/null || echo "$began") < began)) || continue
    pgrep -f "^slurmstepd: \[$id\.batch\]" >/dev/null && continue
    if scontrol requeue "$id" >/dev/null 2>&1; then requeued+=("$id"); else scancel "$id" && cancelled+=("$id"); fi
done < <(squeue -h -t RUNNING -o "%A %S" 2>/dev/null)
((${#requeued[@]})) && echo "local_slurm: requeued job(s) ${requeued[*]}: recorded as running, but their processes" \
    "are gone (the machine or its daemons stopped under them)" >&2
((${#cancelled[@]})) && echo "local_slurm: cancelled job(s) ${cancelled[*]}: recorded as running, but their" \
    "processes are gone, and they do not allow requeueing" >&2

acct=$([[ $ACCOUNTING == 1 ]] && echo "slurmdbd+mariadb" || echo "none (sacct fails)")
what="node $HOST ($CPUS CPUs, $MEM_MB MB, $GPUS fake GPUs"
((NODES > 1)) && what="$NODES nodes ${NAMES[*]} on $HOST ($((CPUS / NODES)) CPUs, $((MEM_MB / NODES)) MB, $GPUS fake GPUs each"
echo "local SLURM ready in $(elapsed "$t0") s: cluster $CLUSTER, partition $PARTITION, $what," \
    "features $FEATURES), accounting $acct, config $CONF_DIR/slurm.conf, state $STATE"
