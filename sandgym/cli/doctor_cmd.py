"""`sandgym doctor`: is this machine ready? Prints what to do for anything that is not."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import dataclass

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


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
        checks.append(Check(f"image {r.tag}", ok, "present" if ok else "missing", "sandgym images build"))
    return checks


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
