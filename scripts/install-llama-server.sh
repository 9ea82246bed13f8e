#!/usr/bin/env bash
# Build llama.cpp's llama-server from the tree vendored in the llama-cpp-python sdist (trusted source:
# PyPI sdist, built here) and install it as $TUNER_CACHE/llama.cpp/bin/llama-server.
# Idempotent: does nothing when that binary exists and runs. Non-interactive. ~8 min on 2 cores.
# Env: TUNER_CACHE (default ~/.cache/tuner), LLAMA_CPP_PYTHON_VERSION (default 0.3.36, the sdist the
#      recorded fixtures came from; "latest" for the newest), TUNER_BUILD_JOBS (default 2).
set -euo pipefail

CACHE="${TUNER_CACHE:-$HOME/.cache/tuner}"
PREFIX="$CACHE/llama.cpp"
BIN="$PREFIX/bin/llama-server"
JOBS="${TUNER_BUILD_JOBS:-2}"
log() { echo "[install-llama-server] $*" >&2; }

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
    log "already installed: $BIN"
    echo "$BIN"
    exit 0
fi

# Build deps: a C/C++ toolchain and CMake (git/curl are not needed: the sdist carries the sources).
missing=()
for tool in cmake gcc g++ make; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
python3 -m pip --version >/dev/null 2>&1 || missing+=("pip")  # `pip download` fetches the sdist
if ((${#missing[@]})); then
    log "missing build tools: ${missing[*]}; installing with apt-get"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo -n"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends build-essential cmake python3-pip >&2
fi

PY="$(command -v python3)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tuner-llama-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
spec="llama-cpp-python"; [[ $version != latest ]] && spec+="==$version"
log "downloading sdist $spec"
"$PY" -m pip download --quiet --no-binary :all: --no-deps -d "$WORK/sdist" "$spec" >&2
sdist="$(find "$WORK/sdist" -maxdepth 1 -name 'llama*cpp*python-*.tar.gz' | head -1)"
[[ -n "$sdist" ]] || { log "no sdist downloaded"; exit 1; }
log "unpacking $(basename "$sdist")"
tar -xzf "$sdist" -C "$WORK"
src="$(find "$WORK" -mindepth 3 -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -1)"
[[ -f "$src/CMakeLists.txt" ]] || { log "vendored llama.cpp not found in sdist"; exit 1; }

# Static, portable (no -march=native so the binary also runs on other CI hosts), no OpenSSL/curl/OpenMP/UI
# deps: a loopback test server needs none of them (LLAMA_CURL only matters to older vendored trees).
log "configuring (source $src)"
cmake -S "$src" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
log "building llama-server with -j$JOBS (takes minutes)"
start=$SECONDS
cmake --build "$WORK/build" --config Release --target llama-server -j"$JOBS" >&2
log "built in $((SECONDS - start)) s"

mkdir -p "$PREFIX/bin"
built="$(find "$WORK/build" -type f -name llama-server -perm -u+x | head -1)"
install -m 0755 "$built" "$BIN.tmp"
# Any shared libs from the build tree (none expected with BUILD_SHARED_LIBS=OFF) go next to the binary.
find "$WORK/build" -name '*.so*' -type f -exec cp -t "$PREFIX/bin" {} + 2>/dev/null || true
mv "$BIN.tmp" "$BIN"
if ldd "$BIN" | grep -q "not found"; then
    log "unresolved shared libraries:"; ldd "$BIN" >&2; exit 1
fi
printf '%s\n' "$(basename "$sdist")" >"$PREFIX/SOURCE"
"$BIN" --version >&2 2>&1 || true
echo "$BIN"
