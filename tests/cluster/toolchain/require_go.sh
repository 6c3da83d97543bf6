# Sourced by build.sh and build_helm.sh: puts Go on PATH from where installers leave it,
# or stops with what to install.
#   require_go WHAT MIN_GO MAKE_TARGET
# WHAT says what is built from source, e.g. "The chart tests build helm v3.22.0".
require_go() {
  if ! command -v go >/dev/null 2>&1; then
    for candidate in /usr/local/go/bin "$HOME/go/bin" /usr/lib/go/bin; do
      if [ -x "$candidate/go" ]; then PATH="$PATH:$candidate"; break; fi
    done
  fi
  if ! command -v go >/dev/null 2>&1; then
    echo "$(basename "$0"): 'go' not found. $1 from source: install Go >= $2" >&2
    echo "(https://go.dev/dl/) and re-run 'make $3'." >&2
    exit 2
  fi
}
