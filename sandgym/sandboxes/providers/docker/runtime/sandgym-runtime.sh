#!/bin/sh
# sandgym-runtime-wrapper 2
# Docker runtime wrapper for sandgym. Installed (by `python3 -m
# sandgym.sandboxes.providers.docker.runtime install`) as /usr/local/bin/runsc-sandgym, the
# engine's runtime "runsc", and as the symlink /usr/local/bin/runc-sandgym, the runtime
# "runc-sandgym".
#   runsc-sandgym: gVisor with the ptrace platform (kvm hangs on nested VMs; Debian's 2022
#     build has no systrap), no network beyond loopback, and host unix sockets reachable
#     through bind mounts (execd's socket, the egress socket).
#   runc-sandgym: plain runc with the same disk handling.
# Docker 20.10 cannot pass per-container runtime options, so what is per sandbox comes from
# a directory sandgym prepares, /var/lib/sandgym/sandboxes/<hostname>, before `docker start`:
#   disk/         a per-sandbox ext4 file system (its quota), mounted by sandgym
#   disk/upper/   present for a writable root: on `create` an overlay (lower = Docker's
#                 root file system, upper = disk/upper) is mounted at root/ and the OCI
#                 bundle's root is pointed at it, so every write lands on the quota'd disk
# On `delete` (the container's main process has ended) the overlay and the disk are
# unmounted and the disk image deleted: nothing is left behind even when sandgym died.
ROOT=/var/lib/sandgym/sandboxes
case "${0##*/}" in
  runc-sandgym) RUNTIME=/usr/bin/runc; FLAGS="" ;;
  *) RUNTIME=/usr/bin/runsc; FLAGS="--platform=ptrace --network=none --host-uds=all" ;;
esac
cmd=""; bundle=""; id=""; prev=""
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle=$a ;; esac
  case "$a" in create|delete) [ -z "$cmd" ] && cmd=$a ;; esac
  case "$a" in *[!0-9a-f]*) ;; *) [ ${#a} -eq 64 ] && id=$a ;; esac
  prev=$a
done
if [ "$cmd" = create ] && [ -n "$bundle" ] && [ -n "$id" ] && [ -d "$ROOT" ]; then
  # The hostname from the bundle's config.json (Docker writes it compact) with one sed: a
  # python3 start per container cost ~15 ms of CPU; only a writable root needs python.
  name=$(sed -n 's/.*"hostname": *"\(sandgym-[0-9a-f]\{16\}\)".*/\1/p' "$bundle/config.json")
  D=$ROOT/$name
  if [ -n "$name" ] && [ -d "$D/disk" ]; then
    mkdir -p "$ROOT/.ids" && printf %s "$name" > "$ROOT/.ids/$id" || exit 1
    if [ -d "$D/disk/upper" ]; then
      # /usr/bin/python3 -I -S starts in ~20 ms (a pyenv shim on PATH can take 200+).
      /usr/bin/python3 -I -S - "$bundle/config.json" "$D" <<'PY' || exit 1
import json, os, subprocess, sys
conf, d = sys.argv[1:3]
with open(conf) as f:
    c = json.load(f)
upper = os.path.join(d, "disk", "upper")
lower = c["root"]["path"]
if not lower.startswith("/"):
    lower = os.path.join(os.path.dirname(conf), lower)
merged = os.path.join(d, "root")
os.makedirs(merged, exist_ok=True)
if not os.path.ismount(merged):
    opts = "lowerdir=%s,upperdir=%s,workdir=%s" % (lower, upper, os.path.join(d, "disk", "work"))
    r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, merged])
    if r.returncode != 0:
        sys.stderr.write("sandgym runtime: overlay mount failed for %s\n" % os.path.basename(d))
        sys.exit(1)
c["root"] = {"path": merged, "readonly": False}
with open(conf + ".tmp", "w") as f:
    json.dump(c, f)
os.replace(conf + ".tmp", conf)
PY
    fi
  fi
elif [ "$cmd" = delete ] && [ -n "$id" ] && [ -f "$ROOT/.ids/$id" ]; then
  "$RUNTIME" $FLAGS "$@"; rc=$?
  name=$(cat "$ROOT/.ids/$id"); D=$ROOT/$name
  case "$name" in sandgym-*) ;; *) exit $rc ;; esac
  mountpoint -q "$D/root" && umount "$D/root"
  mountpoint -q "$D/disk" && umount "$D/disk"
  if ! mountpoint -q "$D/disk"; then
    rm -f "$D/disk.img"; rmdir "$D/root" "$D/disk" "$D" 2>/dev/null
    rm -f "$ROOT/.ids/$id"
  fi
  exit $rc
fi
exec "$RUNTIME" $FLAGS "$@"
