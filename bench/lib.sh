# Helpers shared by the bench scripts (sourced).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_ready() {  # url pid
  for _ in $(seq 1 600); do
    if curl -fs "$1/health" >/dev/null 2>&1; then return 0; fi
    kill -0 "$2" 2>/dev/null || { echo "server exited" >&2; return 1; }
    sleep 0.2
  done
  echo "server never became ready" >&2
  return 1
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
