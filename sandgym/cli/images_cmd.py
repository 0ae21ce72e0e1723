"""`sandgym images`: build the sandbox images offline (no registry)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from sandgym.cli.consoles import LazyConsole

console = LazyConsole(stderr=True)


def register(app: typer.Typer) -> None:
    images = typer.Typer(help="Build and list the sandbox images (no registry needed).", no_args_is_help=True)
    app.add_typer(images, name="images")

    @images.command("build")
    def build_cmd(
        names: Annotated[Optional[list[str]], typer.Argument(help="Images to build (default: all).")] = None,
        core: Annotated[bool, typer.Option("--core", help="Only the images every default sandbox needs (base, python); environments' own images are built on first use.")] = False,
        base: Annotated[Optional[str], typer.Option(help="Start from this public image instead of debootstrap.")] = None,
        force: Annotated[bool, typer.Option(help="Rebuild even when present.")] = False,
        python: Annotated[Optional[str], typer.Option(
            "--python", help="Build sandgym/python:X.Y from the Debian release that ships it (3.9 bullseye, 3.11 bookworm, 3.13 trixie).")] = None,
    ) -> None:
        """Build the images that are missing (base via debootstrap + docker import, then Dockerfiles)."""
        from sandgym.sandboxes.providers.docker import images as img

        if core:
            if names:
                console.print("[red]give image names or --core, not both[/]")
                raise typer.Exit(2)
            names = img.core_names()
        with console.status("checking images...") as status:
            def step(recipe: img.ImageRecipe) -> None:
                status.update(f"building [bold]{recipe.tag}[/]: {recipe.description}")
                console.print(f"[cyan]building[/] {recipe.tag}")

            def log(line: str) -> None:
                status.update(f"[dim]{line[:110]}[/]")

            try:
                built = img.build(names, base=base, force=force, log=log, step=step, python=python)
            except Exception as exc:
                console.print(f"[red]image build failed:[/] {exc}")
                raise typer.Exit(1) from None
        console.print(f"[green]built:[/] {', '.join(built)}" if built else "[green]all images present[/]")

    @images.command("ls")
    def ls_cmd() -> None:
        """List the sandgym images and whether they are present."""
        import docker

        from sandgym.sandboxes.providers.docker import images as img

        client = docker.from_env()
        extra = [r for v in img.PYTHON_SUITES for r in img.python_recipes(v) if r.name == "python"]
        for r in [*img.RECIPES, *extra]:
            if img.image_exists(client, r.tag):
                mark = "[green]present[/]"
            else:
                mark = "[yellow]first use[/]" if r.first_use or r not in img.RECIPES else "[red]missing[/]"
            console.print(f"{r.tag:28} {mark}  {r.description}")
