# Sourced by install-apptainer.sh and build-slurm.sh: apt over a private state that knows one Debian suite
# of the same registry, signed by the Debian archive keyring (apt checks each file's SHA256 against the
# signed index). The machine's own apt sources, lists and preferences are neither read nor touched.
#
#   private_apt deb unstable      # or: private_apt deb-src trixie
#   apt-get "${apt_opts[@]}" update -q
#
# Sets apt_opts (the options that point apt at the private state) and private_apt_state (its folder,
# removed when the shell exits). Needs MIRROR.
private_apt() {
  local kind=$1 suite=$2
  private_apt_state=$(mktemp -d)
  trap 'rm -rf "$private_apt_state"' EXIT
  mkdir -p "$private_apt_state"/{lists/partial,cache/archives/partial,parts,prefs}
  echo "$kind [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main" \
    > "$private_apt_state/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$private_apt_state/sources.list" -o "Dir::Etc::SourceParts=$private_apt_state/parts"
            -o "Dir::State::Lists=$private_apt_state/lists" -o "Dir::Cache=$private_apt_state/cache"
            -o "Dir::Etc::Preferences=$private_apt_state/prefs/none"
            -o "Dir::Etc::PreferencesParts=$private_apt_state/prefs" -o "APT::Sandbox::User=root")
}
