# Sourced by the prepare_*.sh scripts that fetch wheels by name for the GPU host: `host_wheels DIR SPEC...` downloads
# each SPEC's wheel for the host's Python 3.12 (cp312, abi3 or pure) on x86-64 Linux, without its dependencies,
# into DIR (a SPEC with no such wheel says so and is skipped; the caller checks what it needs). $PY: the pip's Python.
host_wheels() {
  local dir=$1; shift
  "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dir" "$@" 2>&1 | grep -v "^WARNING" || true
}
