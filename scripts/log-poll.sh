# Sourced (bash): waits on the logs of MPI jobs a script started, without forking. Ten polls a second with a
# grep and a sleep each were 23% of the machine's CPU beside 71% for the jobs themselves (perf, four
# engine-job tests at -j4), and took CPU from the jobs a benchmark measures: here nap reads, with a timeout,
# a pipe nobody writes, and a log's lines are matched in bash (an extended regular expression).
# Used by scripts/elastic-bench.sh and tests/elastic/run_join_engine.sh.
exec {nap_fd}<> <(:)
nap() { read -r -t 0.1 -u "$nap_fd" _ || true; }
log_has() {  # log_has LOG ERE: a line of LOG matches ERE
  local line
  [[ -r $1 ]] || return 1
  while IFS= read -r line || [[ -n $line ]]; do [[ $line =~ $2 ]] && return 0; done <"$1"
  return 1
}
log_count() {  # log_count LOG ERE: sets $counted, how many lines of LOG match ERE (no $(...): that forks)
  local line
  counted=0
  [[ -r $1 ]] || return 0
  while IFS= read -r line || [[ -n $line ]]; do [[ $line =~ $2 ]] && counted=$((counted + 1)); done <"$1"
  return 0
}
