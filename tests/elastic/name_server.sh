# Sourced by the elastic tests' scripts: one ompi-server for the jobs of a test. start_name_server starts it,
# its URI in $dir/uri, sets $server to its pid and waits for the URI; the caller's cleanup ends it.
start_name_server() {
  ompi-server --no-daemonize --report-uri "$dir/uri" &
  server=$!
  for _ in $(seq 100); do [[ -s $dir/uri ]] && break; sleep 0.1; done
  [[ -s $dir/uri ]] || { echo "ompi-server wrote no URI"; exit 1; }
}
