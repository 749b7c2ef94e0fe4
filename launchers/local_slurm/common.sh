# shellcheck shell=bash disable=SC2034  # sourced by start.sh and stop.sh, which use these
# Shared by start.sh and stop.sh (sourced, not run). Every setting can be overridden from the environment;
# start.sh saves the LOCAL_SLURM_* it was given in $STATE/settings.env and later starts reuse them unless told
# otherwise (so a plain `start.sh` from the tests does not undo `LOCAL_SLURM_CPUS=8 start.sh` from CI).
STATE=${LOCAL_SLURM_STATE:-/var/lib/prime-values-slurm}   # kept between starts: job ids, accounting DB, logs
if [[ -f $STATE/settings.env ]]; then
    while IFS='=' read -r key value; do
        [[ $key == LOCAL_SLURM_* && -z ${!key+set} ]] && export "$key=$value"
    done <"$STATE/settings.env"
fi
ACCOUNTING=${LOCAL_SLURM_ACCOUNTING:-1}                  # 1: slurmdbd + a private MariaDB, so sacct works
CLUSTER=${LOCAL_SLURM_CLUSTER:-pvlocal}
PARTITION=${LOCAL_SLURM_PARTITION:-debug}
URGENT=${LOCAL_SLURM_URGENT_PARTITION:-urgent}          # its jobs preempt those of $PARTITION
SLURMD_TIMEOUT=${LOCAL_SLURM_SLURMD_TIMEOUT:-300}        # s before a silent node is DOWN (SLURM's default)
FEATURES=${LOCAL_SLURM_FEATURES:-local}                  # node features, for --constraint
CTLD_PORT=${LOCAL_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${LOCAL_SLURM_SLURMD_PORT:-6818}
DBD_PORT=${LOCAL_SLURM_DBD_PORT:-6819}
DB_PORT=${LOCAL_SLURM_DB_PORT:-6820}                     # private MariaDB on 127.0.0.1, not the system one
CONF_DIR=/etc/slurm                                      # where Debian's daemons and client commands look
MARKER="Managed by prime_values launchers/local_slurm/start.sh"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# is_running NAME PIDFILE: the pid file names a live process (not a zombie left unreaped) whose command is NAME
is_running() {
    local pid
    pid=$(cat "$2" 2>/dev/null) || return 1
    [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] &&
        ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}

# stop_daemon NAME PIDFILE: SIGTERM, wait up to 15 s, then SIGKILL
stop_daemon() {
    local pid
    is_running "$1" "$2" || { rm -f "$2"; return 0; }
    pid=$(cat "$2")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 150); do
        [[ -d /proc/$pid ]] || break
        sleep 0.1
    done
    if [[ -d /proc/$pid ]]; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -f "$2"
}
