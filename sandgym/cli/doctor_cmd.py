"""`sandgym doctor`: is this machine ready? Prints what to do for anything that is not."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # docker's SDK is imported when a check needs it
    from docker import DockerClient


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _docker_checks() -> list[Check]:
    import docker

    try:
        client = docker.from_env()
        client.ping()
        info = client.info()
    except Exception as exc:
        return [Check("docker engine", False, f"not reachable: {exc}",
                      "apt-get install -y docker.io && dockerd --bridge=none --iptables=false &")]
    checks = [Check("docker engine", True, f"{info.get('ServerVersion')} ({info.get('CgroupDriver')}, cgroup v{info.get('CgroupVersion')})")]
    nets = {n.name for n in client.networks.list()}
    checks.append(Check("no default bridge", "bridge" not in nets,
                        "bridge network present" if "bridge" in nets else "engine runs with --bridge=none",
                        "restart dockerd with --bridge=none --iptables=false", required=False))
    from sandgym.sandboxes.providers.docker import images as img

    for r in img.RECIPES:
        ok = img.image_exists(client, r.tag)
        if r.first_use:  # an environment's image: its first sandbox builds it
            checks.append(Check(f"image {r.tag}", ok, "present" if ok else "not built yet: built on first use",
                                f"sandgym images build {r.name}", required=False))
        else:
            checks.append(Check(f"image {r.tag}", ok, "present" if ok else "missing", "sandgym images build --core"))
    return checks + _isolation_checks(client, info)


def _isolation_checks(client: DockerClient, info: dict) -> list[Check]:
    """gVisor (profile vm), per-sandbox disks, the egress proxy."""
    from sandgym.sandboxes.egress.proxy import squid_binary
    from sandgym.sandboxes.providers.docker import runtime as rt
    from sandgym.sandboxes.providers.docker.disk import LoopDisks

    install = "scripts/bootstrap.sh (or: apt-get install runsc && python3 -m sandgym.sandboxes.providers.docker.runtime install)"
    st = rt.status(info)
    detail = (f"runsc {st.runsc_version or 'missing'}, wrapper v{st.wrapper_version} (want v{rt.WANTED_VERSION}), "
              f"engine runtimes: {', '.join(st.engine_runtimes)}")
    checks = [Check("gVisor (profile vm)", st.gvisor, detail, install, required=False)]
    if st.gvisor:
        smoke_ok, smoke = _gvisor_smoke(client, st.shim)
        checks.append(Check("gVisor sandbox runs `ls -la /`", smoke_ok, smoke,
                            "see the wrapper's log in `docker logs`; the statx shim needs gcc at install", required=False))
    checks.append(Check("statx shim (ls/stat under gVisor)", st.shim, str(rt.SHIM_SO) if st.shim else "not built",
                        install, required=False))
    why = LoopDisks().unavailable() or (None if st.runc_sandgym else "the engine lacks the runc-sandgym runtime")
    checks.append(Check("per-sandbox disks (quota, not memory)", why is None,
                        f"ext4 images under {rt.DISK_ROOT}" if why is None else why,
                        install + "; run as root", required=False))
    squid = squid_binary()
    checks.append(Check("egress proxy (squid)", squid is not None, squid or "not installed",
                        "apt-get install squid", required=False))
    return checks


def _gvisor_smoke(client: DockerClient, shim: bool) -> tuple[bool, str]:
    from sandgym.sandboxes.providers.docker import runtime as rt

    binds = {str(rt.SHIM_SO): {"bind": rt.SHIM_IN_SANDBOX, "mode": "ro"},
             str(rt.PRELOAD_FILE): {"bind": "/etc/ld.so.preload", "mode": "ro"}} if shim else {}
    try:
        out = client.containers.run(
            "sandgym/python:latest", ["sh", "-c", "ls -la / >/dev/null && uname -r"], runtime=rt.GVISOR,
            network_mode="none", network_disabled=True,  # as the provider makes sandboxes
            remove=True, volumes=binds, labels={"sandgym.doctor": "1"},
        )
    except Exception as exc:
        return False, " ".join(str(exc).split())[:200]
    return True, f"kernel {out.decode().strip()} (gVisor's)"


def _local_check() -> Check:
    from sandgym.sandboxes.providers.local import LocalProvider

    caps = LocalProvider().capabilities
    return Check("local provider isolation", caps.bwrap is not None, caps.summary(),
                 "apt-get install -y bubblewrap (and allow user namespaces)", required=False)


def _module(name: str, what: str, fix: str) -> Check:
    ok = importlib.util.find_spec(name) is not None
    return Check(what, ok, "installed" if ok else "not installed", fix, required=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor() -> None:
        """Check the Docker engine, images, bubblewrap and optional extras."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        checks = _docker_checks() + [
            _local_check(),
            Check("debootstrap (base image)", shutil.which("debootstrap") is not None,
                  shutil.which("debootstrap") or "not installed", "apt-get install -y debootstrap", required=False),
            _module("prime_sandboxes", "prime-sandboxes SDK", "pip install 'sandgym[prime]'"),
            _module("fastapi", "platform service (fastapi)", "pip install 'sandgym[platform]'"),
            _module("torch", "trainer (torch)", "pip install torch==2.13.0 'sandgym[train]'"),
            _module("vllm", "vLLM generation", "pip install 'sandgym[vllm]' (GPU machines)"),
            _module("swebench", "SWE-bench specs and log parsers (swebench 4.x)", "pip install 'sandgym[swe]'"),
            _module("ray", "fleet on Ray (sandgym ray, eval --ray)", "pip install 'sandgym[ray]'"),
        ]
        table = Table(title="sandgym doctor")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col)
        for c in checks:
            status = "[green]ok[/]" if c.ok else ("[red]FAIL[/]" if c.required else "[yellow]warn[/]")
            table.add_row(c.name, status, escape(c.detail), "" if c.ok else escape(c.fix))
        Console().print(table)
        if any(c.required and not c.ok for c in checks):
            raise typer.Exit(1)
