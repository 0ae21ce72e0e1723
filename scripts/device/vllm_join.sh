#!/usr/bin/env bash
# Device side of the vllm carry (see scripts/device/README.md).
#   vllm_join.sh stash    copy the piece(s) this call carried (.vllm-pieces/NN/) to /tmp/vpieces
#   vllm_join.sh install  stash, then join, verify sha256, unpack to /tmp/vsite, import check
# /tmp survives between calls only while the machine stays warm (about 30 s idle).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p /tmp/vpieces
shopt -s nullglob
for f in .vllm-pieces/*/vsite.tar.xz.* .vllm-pieces/*/manifest.json; do cp "$f" /tmp/vpieces/; done
ls -la /tmp/vpieces
[ "${1:-stash}" = stash ] && exit 0

man=/tmp/vpieces/manifest.json
[ -f "$man" ] || { echo "manifest.json missing: the last piece's folder was not carried" >&2; exit 2; }
want=$(python3 -c "import json;m=json.load(open('$man'));print(m['pieces'],m['sha256'])")
n=${want% *}; sha=${want#* }
have=$(ls /tmp/vpieces/vsite.tar.xz.* | wc -l)
[ "$have" = "$n" ] || { echo "have $have of $n pieces (machine given back between calls?)" >&2; exit 3; }
t0=$(date +%s.%N)
cat /tmp/vpieces/vsite.tar.xz.* > /tmp/vsite.tar.xz
got=$(sha256sum /tmp/vsite.tar.xz | cut -d' ' -f1)
[ "$got" = "$sha" ] || { echo "sha256 mismatch: $got != $sha" >&2; exit 4; }
rm -rf /tmp/vsite && mkdir -p /tmp/vsite
xz -T0 -dc /tmp/vsite.tar.xz | tar -x -C /tmp/vsite
# Wheels carried beside the archive (added after it was built) go into the same tree.
extra=(.vllm-pieces/*/*.whl)
if [ ${#extra[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/vsite "${extra[@]}"
  echo "extra wheels: ${extra[*]}"
fi
echo "unpacked in $(python3 -c "import time;print(round(time.time()-$t0,1))")s: $(du -sh /tmp/vsite | cut -f1)"

before=$(python3 -c 'import torch;print(torch.__version__, torch.__file__)')
PYTHONPATH=/tmp/vsite python3 - "$before" <<'PY'
import sys, time
t = time.time()
import torch
import vllm
from vllm import LLM, SamplingParams  # noqa: F401
after = f"{torch.__version__} {torch.__file__}"
print(f"import vllm {vllm.__version__} ok in {time.time() - t:.1f}s ({vllm.__file__})")
print(f"torch before: {sys.argv[1]}")
print(f"torch after:  {after}")
assert after == sys.argv[1], "torch changed"
print("torch unchanged; cuda", torch.version.cuda, torch.cuda.get_device_name())
PY
