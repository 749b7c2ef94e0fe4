#!/usr/bin/env bash
# Stop the one-node SLURM cluster that start.sh started (slurmd, slurmctld, slurmdbd, the private MariaDB, and
# munged if start.sh started it). Idempotent. The state directory (job ids, accounting DB, logs) is kept, so the
# next start.sh continues job ids; `stop.sh --purge` also removes it and the config files start.sh wrote.
# Running jobs are killed with slurmd (they are not requeued).
# Exit codes: 0 stopped (or nothing was running) | 2 not root
set -euo pipefail
source "$(dirname "$0")/common.sh"
[[ $(id -u) == 0 ]] || { echo "local_slurm: not root: stopping SLURM daemons needs root" >&2; exit 2; }
[[ -d $STATE ]] || { echo "local SLURM stopped (nothing here: $STATE)"; exit 0; }
exec 9>"$STATE/.lock"
flock 9

# Jobs first, while slurmctld is up: their slurmstepd processes would outlive slurmd.
jobs=()
is_running slurmctld "$STATE/run/slurmctld.pid" && mapfile -t jobs < <(squeue -h -o %A 2>/dev/null || true)
if ((${#jobs[@]})); then
    scancel --quiet "${jobs[@]}" 2>/dev/null || true
    for _ in $(seq 150); do [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break; sleep 0.1; done
fi
for pidfile in "$STATE"/run/slurmd*.pid; do stop_daemon slurmd "$pidfile"; done
stop_daemon slurmctld "$STATE/run/slurmctld.pid"
stop_daemon slurmdbd "$STATE/run/slurmdbd.pid"
stop_daemon mariadbd "$STATE/run/mysql/mariadbd.pid"
if [[ -f $STATE/run/munged.ours ]]; then
    stop_daemon munged /run/munge/munged.pid
    rm -f "$STATE/run/munged.ours"
fi
if [[ ${1:-} == --purge ]]; then
    for f in "$CONF_DIR/slurm.conf" "$CONF_DIR/slurmdbd.conf" "$CONF_DIR/gres.conf"; do
        [[ -f $f ]] && grep -q "$MARKER" "$f" && rm -f "$f"
    done
    rm -rf "$STATE"
    echo "local SLURM stopped and purged ($STATE removed)"
else
    echo "local SLURM stopped (state kept in $STATE)"
fi
