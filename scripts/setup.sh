#!/usr/bin/env bash
# Installs everything Armada needs on Debian 12 and builds the pinned llama.cpp into a cache
# outside the work tree. Safe to run again: each step checks whether its work is already done.
#
#   ARMADA_CACHE     cache root (default ~/.cache/armada)
#   ARMADA_PORTABLE  1 = generic CPU build of llama.cpp (default: native)
#   ARMADA_JOBS      parallel build jobs (default 2)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${ARMADA_CACHE:-$HOME/.cache/armada}"
jobs="${ARMADA_JOBS:-2}"
llama_version="v0.4.0"
npm_pkg="node-llama-cpp@3.21.1"
llama_dir="$cache/llama.cpp-$llama_version"
[ "${ARMADA_PORTABLE:-0}" = "1" ] && llama_dir="$llama_dir-portable"

log() { printf '[setup] %s\n' "$*"; }

debs=(
  cmake g++ make git pkg-config ca-certificates
  libboost-dev nlohmann-json3-dev libsqlite3-dev libspdlog-dev libcli11-dev libyaml-cpp-dev
  libhwloc-dev libzstd-dev libssl-dev ca-certificates openssl libgtest-dev libgmock-dev libbenchmark-dev
  clang clang-format clang-tidy libclang-rt-14-dev
  gnuplot-nox python3 curl
  etcd-server nats-server redis-server postgresql libpq-dev libhiredis-dev libnats-dev
  chromium fonts-dejavu-core
)

install_debs() {
  local missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "debian packages present"
    return
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

fetch_llama() {
  if [ -f "$llama_dir/src/CMakeLists.txt" ]; then
    log "llama.cpp source present in $llama_dir/src"
    return
  fi
  log "fetching llama.cpp $llama_version from npm package $npm_pkg"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "$npm_pkg" >/dev/null)
  tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  local tag
  tag="$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$tmp/package/llama/llama.cpp.info.json")"
  if [ "$tag" != "$llama_version" ]; then
    echo "setup: $npm_pkg ships llama.cpp $tag, expected $llama_version" >&2
    exit 1
  fi
  mkdir -p "$llama_dir"
  rm -rf "$llama_dir/src"
  git clone -q "$tmp/package/llama/gitRelease.bundle" "$llama_dir/src"
  rm -rf "$tmp"
}

build_llama() {
  # ggml's AMX matrix multiply crashes (SIGSEGV in ggml_backend_amx_mul_mat) on the first
  # model step on Sapphire Rapids machines: a native build leaves AMX out. The flags are part
  # of the cache's stamp, so a build made with other flags is made again.
  local flags=""
  [ "$(uname -m)" = "x86_64" ] && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  local stamp="flags=$flags"
  if [ -f "$llama_dir/.installed" ] && [ "$(cat "$llama_dir/.installed")" = "$stamp" ]; then
    log "llama.cpp build cached in $llama_dir"
    if [ ! -x "$llama_dir/bin/llama-bench" ] && [ -f "$llama_dir/build/CMakeCache.txt" ]; then
      # A cache built before `make bench` compared prompt rates at depth: only llama-bench is new.
      log "building llama-bench into the cached llama.cpp build"
      cmake --build "$llama_dir/build" -j "$jobs" --target llama-bench >/dev/null
      find "$llama_dir/build" -name 'libllama-bench-impl.so*' \( -type f -o -type l \) -exec cp -a {} "$llama_dir/lib/" \;
      cp -a "$llama_dir/build/bin/llama-bench" "$llama_dir/bin/"
    fi
    return
  fi
  rm -rf "$llama_dir/build" "$llama_dir/lib" "$llama_dir/bin" "$llama_dir/include" "$llama_dir/.installed"
  local native=ON
  [ "${ARMADA_PORTABLE:-0}" = "1" ] && native=OFF
  log "building llama.cpp (native=$native, -j$jobs); this takes about 12 minutes on 2 cores"
  cmake -S "$llama_dir/src" -B "$llama_dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE="$native" -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DCMAKE_INSTALL_RPATH="$llama_dir/lib" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >/dev/null
  cmake --build "$llama_dir/build" -j "$jobs" --target llama llama-common llama-batched-bench llama-server llama-bench
  mkdir -p "$llama_dir/lib" "$llama_dir/bin" "$llama_dir/include"
  find "$llama_dir/build" -name '*.so*' \( -type f -o -type l \) -exec cp -a {} "$llama_dir/lib/" \;
  find "$llama_dir/build" -name '*.a' -type f -exec cp -a {} "$llama_dir/lib/" \;
  cp -a "$llama_dir/build/bin/llama-batched-bench" "$llama_dir/build/bin/llama-server" "$llama_dir/build/bin/llama-bench" \
    "$llama_dir/bin/"
  cp -a "$llama_dir/src/include/"*.h "$llama_dir/src/ggml/include/"*.h "$llama_dir/include/"
  echo "$stamp" > "$llama_dir/.installed"
  log "llama.cpp installed into $llama_dir"
}

# promtool (Debian's prometheus package) lints every process's /metrics in the tests. Only the
# tool is taken from the package: installing it would also start a Prometheus server.
fetch_promtool() {
  local dest="$cache/promtool/promtool"
  if [ -x "$dest" ] || command -v promtool >/dev/null; then
    log "promtool present"
    return
  fi
  log "fetching promtool from Debian's prometheus package"
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && { apt-get download -qq prometheus 2>/dev/null || { apt-get update -qq && apt-get download -qq prometheus; }; })
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
  install -D -m 0755 "$tmp/x/usr/bin/promtool" "$dest"
  rm -rf "$tmp"
}

install_npm_peers() {
  local dir="$here/tests/node"
  # The test peers (@redocly/cli, the agent frameworks) need Node.js 20.19 or later; Debian 12's
  # own nodejs is 18.
  if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)'; then
    echo "setup: the test peers need Node.js 20.19 or later; this machine has $(node --version 2>/dev/null || echo none)" >&2
    exit 1
  fi
  # Installed when any package of package.json is missing or at another version.
  if (cd "$dir" && node -e '
    const fs = require("fs");
    const deps = require("./package.json").dependencies;
    for (const [name, want] of Object.entries(deps)) {
      const f = `node_modules/${name}/package.json`;
      if (!fs.existsSync(f) || JSON.parse(fs.readFileSync(f, "utf8")).version !== want) process.exit(1);
    }'); then
    log "npm test peers present"
    return
  fi
  log "installing npm test peers in tests/node"
  (cd "$dir" && npm install --no-audit --no-fund --silent)
}

install_debs
fetch_promtool
fetch_llama
build_llama
[ -f "$here/tests/node/package.json" ] && install_npm_peers
echo "$llama_dir"
