# Sourced by the prepare_*.sh scripts that fetch wheels by name for the GPU host: `host_wheels DIR SPEC...` downloads
# each SPEC's wheel for the host's Python 3.12 (cp312, abi3 or pure) on x86-64 Linux, without its dependencies,
# into DIR (a SPEC with no such wheel says so and is skipped; the caller checks what it needs). $PY: the pip's Python.
host_wheels() {
  local dir=$1; shift
  "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dir" "$@" 2>&1 | grep -v "^WARNING" || true
}

# `start_wheels FOLDER`: the preamble every prepare_*.sh shares: FOLDER (.gpu-NAME, where the parts go) kept out of
# git, a scratch folder $work/wheels removed on exit, and `get SPEC...` (host_wheels into it).
start_wheels() {
  grep -qx "/$1/" .git/info/exclude 2>/dev/null || echo "/$1/" >> .git/info/exclude
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/wheels"
}
get() { host_wheels "$work/wheels" "$@"; }
