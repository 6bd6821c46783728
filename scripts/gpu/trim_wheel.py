"""Write a copy of a wheel without some top-level subpackages (and their RECORD lines):
``python scripts/gpu/trim_wheel.py IN.whl OUT_DIR ray/jars ray/rllib ...``. Used to make Ray's wheel
small enough to travel with one GPU-host call (scripts/gpu/prepare_ray.sh)."""

import sys
import zipfile
from pathlib import Path

src, out_dir, *drop = sys.argv[1:]
prefixes = tuple(d.rstrip("/") + "/" for d in drop)
out = Path(out_dir) / Path(src).name
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    for info in zin.infolist():
        if info.filename.startswith(prefixes):
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(ln for ln in data.splitlines(keepends=True) if not ln.decode().startswith(prefixes))
        zout.writestr(info, data)  # keeps external_attr: the executables stay executable
print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB")
