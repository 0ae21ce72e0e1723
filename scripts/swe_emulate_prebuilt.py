#!/usr/bin/env python3
"""Emulated SWE-bench prebuilt instance images, made from task images built here.

    SANDGYM_SWE_MIRRORS=mirrors python scripts/swe_emulate_prebuilt.py rows.jsonl --namespace sgemu
    sandgym swe validate rows.jsonl --image-source prebuilt --image-namespace sgemu

For machines that cannot pull SWE-bench's own images (`swebench/sweb.eval.x86_64.<id>`):
each row's task image (built or reused) becomes `<namespace>/sweb.eval.x86_64.<id>:latest`
(swebench's name, `__` as `_1776_`) with the layout of SWE-bench's images that sandgym's
prebuilt path relies on: the repository at /testbed (root-owned, installed), the env at
/opt/miniconda3/envs/testbed (the task venv), and an /opt/miniconda3/bin/activate that
makes `conda activate testbed` work. sandgym then runs them as it runs SWE-bench's (the
`vm` profile, root, no repository, no build).
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile

import anyio

from sandgym.swe.images import VENV, TaskImageBuilder
from sandgym.swe.prebuilt import CONDA, CONDA_ENV, instance_image_key
from sandgym.swe.tasks import TESTBED, load_tasks

# conda's activate, emulated: `source activate` then `conda activate ENV` (bash, set -u).
ACTIVATE = f"""export CONDA_PREFIX={CONDA} CONDA_DEFAULT_ENV=base
conda() {{
  if [ "${{1:-}}" = activate ] && [ -d "{CONDA}/envs/${{2:-}}" ]; then
    export CONDA_PREFIX="{CONDA}/envs/$2" CONDA_DEFAULT_ENV="$2" PATH="{CONDA}/envs/$2/bin:$PATH"
  else
    echo "conda (emulated): cannot $*" >&2
    return 1
  fi
}}
"""


def dockerfile(built: str) -> str:
    return f"""FROM {built}
USER root
COPY activate {CONDA}/bin/activate
RUN mkdir -p {CONDA}/envs && ln -s {VENV} {CONDA}/envs/{CONDA_ENV} && chown -R root:root {TESTBED}
ENV PATH={CONDA}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR {TESTBED}
"""


def context(built: str) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in (("Dockerfile", dockerfile(built)), ("activate", ACTIVATE)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", help="rows (JSONL/JSON file, dataset directory or name)")
    ap.add_argument("--namespace", default="sgemu", help="image namespace (give the same --image-namespace to sandgym)")
    ap.add_argument("-i", "--instance", action="append", help="only these instance ids")
    args = ap.parse_args(argv)
    import docker

    client = docker.from_env(timeout=3600)
    builder = TaskImageBuilder(log=lambda line: None)
    for task in load_tasks(args.rows, instance_ids=args.instance):
        built = await builder.ensure(task)
        ref = instance_image_key(task.instance_id, args.namespace)
        client.images.build(fileobj=context(built.tag), custom_context=True, tag=ref, rm=True, forcerm=True,
                            network_mode="none", labels={"sandgym.swe.emulates": "swebench-prebuilt"})
        print(f"{task.instance_id}: {ref} (from {built.tag}{', reused' if built.reused else ', built'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
