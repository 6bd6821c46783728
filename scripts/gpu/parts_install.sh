#!/usr/bin/env bash
# On the GPU host, at the repo root, in each call that carries one or more of pack_parts.sh's OUT_DIR/NN folders:
#   bash scripts/gpu/parts_install.sh NAME OUT_DIR SITE
# keeps the carried parts in /tmp/NAME-parts (it survives between calls while the machine stays warm); once every
# part is there, joins them, checks the sha256 and installs the wheels into SITE. Safe to run again: a part already
# kept is not copied twice, an install already checked is not redone, and a machine that went back (an empty /tmp)
# says which parts to carry again.
set -euo pipefail
name=$1; from=$2; site=$3
keep=${PARTS_KEEP:-/tmp/$name-parts}
mkdir -p "$keep"
for f in "$from"/*/"$name".part-* "$from"/*/"$name".manifest; do
  [ -f "$f" ] || continue
  cmp -s "$f" "$keep/$(basename "$f")" 2>/dev/null || cp "$f" "$keep/"
done
if [ ! -f "$keep/$name.manifest" ]; then
  echo "[$name] no part carried yet: carry $from/00"; exit 0
fi
parts=$(sed -n 's/^parts=//p' "$keep/$name.manifest"); want=$(sed -n 's/^sha256=//p' "$keep/$name.manifest")
if [ -f "$site/.installed-$name" ] && [ "$(cat "$site/.installed-$name")" = "$want" ]; then
  echo "[$name] already installed in $site (sha256 $want)"; exit 0
fi
missing=()
for i in $(seq 0 $((parts - 1))); do
  k=$(printf '%02d' "$i"); [ -f "$keep/$name.part-$k" ] || missing+=("$from/$k")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[$name] have $((parts - ${#missing[@]})) of $parts parts; carry next: ${missing[*]}"; exit 0
fi
tmp=$(mktemp -d "/tmp/$name-join.XXXX"); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 0 $((parts - 1))); do cat "$keep/$(printf '%s.part-%02d' "$name" "$i")"; done > "$tmp/$name.tar"
got=$(sha256sum "$tmp/$name.tar" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "[$name] sha256 mismatch ($got, want $want): parts of two different packings; removed them, carry all again" >&2
  rm -f "$keep/$name".part-* "$keep/$name.manifest"; exit 1
fi
tar -C "$tmp" -xf "$tmp/$name.tar"
mkdir -p "$site"
"${PYTHON:-python3}" -m pip install -q --no-index --no-deps --target "$site" "$tmp"/wheels/*.whl
echo "$want" > "$site/.installed-$name"
echo "[$name] installed $(ls "$tmp"/wheels | wc -l) wheels into $site (sha256 ok)"
