# Sourced by the GPU checks that run Slurm jobs as users (apptainer.sh, gauges-slurm.sh, isolation.sh),
# after slurm-up.sh's inputs are set ($S, $C): a step's heading, a job's state, waiting for its end,
# a command as a user, and Slurm brought up with the demo's confinement.
step() { echo; echo "=================== $* (t=$((SECONDS - ${T0:-0})) s)"; }
state() { scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
wait_done() { for _ in $(seq "${2:-60}"); do case $(state $1) in PENDING|RUNNING|CONFIGURING|COMPLETING) sleep 1;; *) break;; esac; done; state $1; }
asuser() { local u=$1; shift; (cd /home/$u && runuser -u $u -- env SLURM_CONF=$SLURM_CONF PATH=$PATH "$@"); }

# Slurm 22.05 with the demo's confinement (CONFINE=1 through slurm-up.sh), users alice and bob (homes
# 0700), tried as it is and then without what some VMs lack (isolation.sh's fallbacks: the memory
# controller, then job_container/tmpfs) until a trivial job of alice's completes. Sets CONFINED to
# the setting that ran; exits when none did.
confined_slurm_up() {
  CONFINED=""
  local without probe
  for without in "" "CONSTRAIN_RAM=no" "CONSTRAIN_RAM=no JOB_CONTAINER=no"; do
    [ -n "$without" ] && { pkill -x munged; sleep 1; eval "export $without"; echo "-- again without: $without"; }
    CONFINE=1 source $S/slurm-up.sh
    id bob >/dev/null 2>&1 || useradd -m -s /bin/bash bob
    chmod 700 /home/alice /home/bob
    probe=$(asuser alice sbatch --parsable -c 1 --mem=1G -t 2 -o /dev/null --wrap true)
    [ "$(wait_done $probe 30)" = COMPLETED ] && { CONFINED="CONFINE=1 ${without:-(all of it)}"; break; }
    echo "a trivial job ended $(state $probe)"; grep -h error /var/log/slurm/slurmd-*.log | tail -n 3; scancel $probe
  done
  [ -n "$CONFINED" ] || { echo "no confinement setting ran a job"; exit 1; }
}
