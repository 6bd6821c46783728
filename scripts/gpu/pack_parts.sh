#!/usr/bin/env bash
# Here: pack a folder of wheels into parts a device call can carry (the working tree counts toward its 64 MiB too).
#   bash scripts/gpu/pack_parts.sh NAME WHEELS_DIR OUT_DIR [PART_MB=40]
# writes OUT_DIR/NN/NAME.part-NN and OUT_DIR/NN/NAME.manifest (the parts' count and the archive's sha256, in every
# part's folder); scripts/gpu/parts_install.sh joins and installs them on the GPU host.
set -euo pipefail
name=$1; src=$2; out=$3; mb=${4:-40}
[ -d "$src" ] && ls "$src"/*.whl >/dev/null 2>&1 || { echo "pack_parts: no wheels in $src" >&2; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" && cp "$src"/*.whl "$work/wheels/"
tar -C "$work" -cf "$work/$name.tar" wheels
sum=$(sha256sum "$work/$name.tar" | cut -d' ' -f1)
rm -rf "$out" && mkdir -p "$out"
split -b "${mb}M" -d -a 2 "$work/$name.tar" "$work/$name.part-"
n=$(ls "$work/$name".part-* | wc -l)
for f in "$work/$name".part-*; do
  k=${f##*-}; mkdir -p "$out/$k"; mv "$f" "$out/$k/"
  printf 'parts=%s\nsha256=%s\n' "$n" "$sum" > "$out/$k/$name.manifest"
done
echo "[pack_parts] $name: $(ls "$work/wheels" | wc -l) wheels, $(du -h "$work/$name.tar" | cut -f1) in $n parts under $out"
