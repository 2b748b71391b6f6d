#!/usr/bin/env bash
# make test-arm: cross-builds llama.cpp and Armada for aarch64 (armv8.2-a+dotprod, Kunpeng 920
# class) and runs the unit tests and a tiny-model generation test under qemu-aarch64.
#
# The arm64 libraries come from Debian multiarch. libyaml-cpp-dev cannot be installed for two
# architectures at once, so its arm64 package is unpacked into a prefix in the cache instead.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${ARMADA_CACHE:-$HOME/.cache/armada}"
jobs="${JOBS:-2}"
host_llama="$cache/llama.cpp-v0.4.0"
arm_llama="$cache/llama.cpp-v0.4.0-aarch64"
extra="$cache/arm64-extra"
build="$here/build-arm"
models="${MODEL_DIR:-$cache/models}"
log() { printf '\033[1m[test-arm]\033[0m %s\n' "$*"; }

install_cross() {
  local need=0
  command -v aarch64-linux-gnu-g++ >/dev/null || need=1
  command -v qemu-aarch64-static >/dev/null || need=1
  dpkg -s libspdlog-dev:arm64 >/dev/null 2>&1 || need=1
  dpkg -s libssl-dev:arm64 >/dev/null 2>&1 || need=1
  dpkg -s libpq-dev:arm64 >/dev/null 2>&1 || need=1
  dpkg -s libnats-dev:arm64 libhiredis-dev:arm64 >/dev/null 2>&1 || need=1
  [ "$need" = 0 ] && return
  log "installing the aarch64 cross compiler, qemu-user-static and arm64 libraries (multiarch)"
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    g++-aarch64-linux-gnu qemu-user-static libboost-dev:arm64 libspdlog-dev:arm64 libsqlite3-dev:arm64 \
    libhwloc-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libzstd-dev:arm64 libgomp1:arm64 \
    libyaml-cpp0.7:arm64 libssl-dev:arm64 libpq-dev:arm64 libnats-dev:arm64 libhiredis-dev:arm64 >/dev/null
}

unpack_yaml_cpp() {
  [ -f "$extra/.done" ] && return
  log "unpacking libyaml-cpp-dev:arm64 into $extra"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && apt-get download -q libyaml-cpp-dev:arm64 >/dev/null)
  rm -rf "$extra"
  mkdir -p "$extra"
  dpkg -x "$tmp"/libyaml-cpp-dev_*_arm64.deb "$extra"
  rm -rf "$tmp"
  # The package's CMake files name the runtime library beside them; it comes from multiarch.
  local lib=/usr/lib/aarch64-linux-gnu
  for f in "$lib"/libyaml-cpp.so.0.7*; do ln -sf "$f" "$extra$lib/$(basename "$f")"; done
  ln -sf "$lib/libyaml-cpp.so.0.7" "$extra$lib/libyaml-cpp.so"
  touch "$extra/.done"
}

build_llama_arm() {
  [ -f "$arm_llama/.installed" ] && { log "aarch64 llama.cpp cached in $arm_llama"; return; }
  [ -d "$host_llama/src" ] || { echo "test-arm: run 'make setup' first (no llama.cpp source in $host_llama)" >&2; exit 1; }
  log "cross-building llama.cpp for aarch64 (armv8.2-a+dotprod, -j$jobs)"
  mkdir -p "$arm_llama"
  ln -sfn "$host_llama/src" "$arm_llama/src"
  cmake -S "$host_llama/src" -B "$arm_llama/build" -DCMAKE_TOOLCHAIN_FILE="$here/cmake/aarch64-linux-gnu.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DCMAKE_INSTALL_RPATH="$arm_llama/lib" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >/dev/null
  cmake --build "$arm_llama/build" -j "$jobs" --target llama llama-common
  mkdir -p "$arm_llama/lib" "$arm_llama/include"
  find "$arm_llama/build" -name '*.so*' \( -type f -o -type l \) -exec cp -a {} "$arm_llama/lib/" \;
  find "$arm_llama/build" -name '*.a' -type f -exec cp -a {} "$arm_llama/lib/" \;
  cp -a "$host_llama/src/include/"*.h "$host_llama/src/ggml/include/"*.h "$arm_llama/include/"
  touch "$arm_llama/.installed"
}

libpath="$arm_llama/lib:/usr/lib/aarch64-linux-gnu:/lib/aarch64-linux-gnu:$extra/usr/lib/aarch64-linux-gnu"
# -cpu max has dotprod. The loader and libc are the multiarch arm64 ones (/lib/ld-linux-aarch64.so.1);
# the cross toolchain's prefix (-L /usr/aarch64-linux-gnu) holds an older libc build, and mixing
# its loader with the multiarch libc hangs the first pthread_create.
export ARMADA_ARM_EMULATOR="qemu-aarch64-static -cpu max -E LD_LIBRARY_PATH=$libpath"

build_armada_arm() {
  log "cross-building Armada for aarch64"
  cmake -S "$here" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$here/cmake/aarch64-linux-gnu.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DLLAMA_DIR="$arm_llama" \
    -Dyaml-cpp_DIR="$extra/usr/lib/aarch64-linux-gnu/cmake/yaml-cpp" >/dev/null
  cmake --build "$build" -j "$jobs" --target armada armada_unit armada_model_tests
}

run_tests() {
  log "file: $(file -b "$build/armada" | cut -d, -f1-2)"
  log "unit tests under qemu-aarch64"
  $ARMADA_ARM_EMULATOR "$build/tests/armada_unit" --gtest_brief=1
  log "tiny-model generation under qemu-aarch64"
  ARMADA_MODEL_DIR="$models" $ARMADA_ARM_EMULATOR "$build/tests/armada_model_tests" --gtest_brief=1 \
    --gtest_filter='EngineModel.StopStringEndsGeneration:EngineModel.FollowUpTurnReusesKv:PromptCache.RestoreFromRamIsTokenIdentical'
}

install_cross
unpack_yaml_cpp
build_llama_arm
build_armada_arm
run_tests
log "aarch64 build and tests passed"
