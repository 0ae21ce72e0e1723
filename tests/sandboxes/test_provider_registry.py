"""Providers by name: built-ins imported only when asked for, entry points, dotted paths,
typed options refused by name, and the optional `adopt` capability."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.platform.service import ServerConfig
from sandgym.sandboxes import AdoptingProvider, Provider
from sandgym.sandboxes.options import DockerOptions, LocalOptions, PrimeOptions, RayOptions
from sandgym.sandboxes.registry import (
    BUILTIN,
    OPTIONS,
    PROVIDERS,
    ProviderOptionsError,
    UnknownProviderError,
    get_provider,
    provider_class,
    provider_options,
)
from tests.sandboxes.outside_provider import OutsideProvider

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_registry_imports_no_provider() -> None:
    code = ("import sys, sandgym.sandboxes.registry; "
            "print(sorted(m for m in sys.modules if m.startswith('sandgym.sandboxes.providers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_builtins_resolve_to_their_classes() -> None:
    assert PROVIDERS == ("docker", "local", "prime", "ray")
    for name in PROVIDERS:
        cls = provider_class(name)
        assert cls.name == name and BUILTIN[name].endswith(":" + cls.__name__)


def test_an_unknown_name_lists_the_builtins_and_the_dotted_form() -> None:
    with pytest.raises(UnknownProviderError) as exc:
        get_provider("dokcer")
    msg = str(exc.value)
    assert "unknown provider 'dokcer'" in msg and "docker, local, prime, ray" in msg and "pkg.module:ClassName" in msg
    with pytest.raises(UnknownProviderError, match=r"no module 'no_such_pkg.mod'"):
        provider_class("no_such_pkg.mod:Cls")
    with pytest.raises(UnknownProviderError, match=r"has no 'Nope'"):
        provider_class("tests.sandboxes.outside_provider:Nope")
    with pytest.raises(TypeError, match="does not implement the Provider protocol"):
        get_provider("tests.sandboxes.outside_provider:NotAProvider")


def test_a_dotted_path_makes_a_provider_with_its_own_typed_options() -> None:
    p = get_provider("tests.sandboxes.outside_provider:OutsideProvider", greeting="hi")
    assert isinstance(p, OutsideProvider) and isinstance(p, Provider) and p.greeting == "hi"
    with pytest.raises(ProviderOptionsError, match=r"greting: Extra inputs are not permitted .*its options: greeting"):
        get_provider("tests.sandboxes.outside_provider:OutsideProvider", greting="hi")


def test_an_entry_point_names_a_provider(tmp_path: Path) -> None:
    dist = tmp_path / "outside_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[sandgym.providers]\noutside = tests.sandboxes.outside_provider:OutsideProvider\n")
    code = ("from sandgym.sandboxes.registry import get_provider, UnknownProviderError\n"
            "p = get_provider('outside', greeting='ep')\nprint(type(p).__name__, p.greeting)\n"
            "try:\n    get_provider('outsid')\nexcept UnknownProviderError as e:\n    print(e)\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == "OutsideProvider ep"
    assert "installed: outside" in second


def test_misspelt_builtin_options_are_refused_by_name() -> None:
    with pytest.raises(ProviderOptionsError, match=r"bad option for the docker provider: image_alias: Extra inputs"):
        get_provider("docker", image_alias={"a": "b"})
    with pytest.raises(ProviderOptionsError, match=r"isolation: Input should be 'auto', 'bwrap' or 'none'"):
        get_provider("local", isolation="strong")
    with pytest.raises(ProviderOptionsError, match=r"endpoint: Extra inputs"):
        provider_options("prime", {"endpoint": "http://127.0.0.1:1"})
    # the agent's options are the agent provider's
    with pytest.raises(ProviderOptionsError, match=r"the local provider: isolaton: Extra inputs"):
        provider_options("ray", {"agent_provider": "local", "agent_provider_options": {"isolaton": "none"}})
    # only what was given is passed on: the constructor's defaults stay its own
    assert provider_options("local", {"isolation": "none"}) == {"isolation": "none"}


def test_the_server_config_refuses_a_misspelt_option() -> None:
    with pytest.raises(ProviderOptionsError, match="image_alias"):
        ServerConfig(tokens=["t"], provider="docker", provider_options={"image_alias": {}})
    ok = ServerConfig(tokens=["t"], provider="docker", provider_options={"image_aliases": {"a": "b"}})
    assert ok.provider_options == {"image_aliases": {"a": "b"}}


@pytest.mark.parametrize("name", PROVIDERS)
def test_each_options_model_is_its_constructor(name: str) -> None:
    """The typed options say exactly what the constructor takes, with the same defaults."""
    model = OPTIONS[name]
    params = dict(inspect.signature(provider_class(name).__init__).parameters)
    params.pop("self")
    if name == "ray":  # the rest are the Fleet's
        from sandgym.sandboxes.providers.ray import Fleet

        params.pop("fleet_options")
        params.update({k: v for k, v in inspect.signature(Fleet.__init__).parameters.items() if k not in ("self", "address")})
    assert set(model.model_fields) == set(params), name
    from sandgym.sandboxes.providers.local import provider as local_provider

    for key, param in params.items():
        default = model.model_fields[key].default
        want = param.default
        if name == "local" and key == "uid_base":
            want = local_provider.DEFAULT_UID_BASE
        assert default == want, f"{name}.{key}: model {default!r}, constructor {want!r}"
    assert {DockerOptions, LocalOptions, PrimeOptions, RayOptions} == set(OPTIONS.values())


@pytest.mark.docker
async def test_adopting_is_a_declared_capability() -> None:
    docker, local = get_provider("docker"), get_provider("local")
    try:
        assert isinstance(docker, AdoptingProvider) and not isinstance(local, AdoptingProvider)
    finally:
        await docker.aclose()


def _sandgym(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/local/bin:/usr/bin:/bin", "COLUMNS": "200", "HOME": str(Path.home())}
    return subprocess.run([sys.executable, "-m", "sandgym", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


def test_a_provider_outside_sandgym_passes_the_check_command() -> None:
    """`sandgym sandbox check --provider pkg.mod:Cls`, for real, on a provider sandgym does not know."""
    from sandgym.sandboxes.contract import CHECKS

    out = _sandgym("sandbox", "check", "--provider", "tests.sandboxes.outside_provider:OutsideProvider")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"outside: {len(CHECKS)}/{len(CHECKS)} checks passed" in out.stderr, out.stderr
    assert "FAIL" not in out.stdout and "list_filters_by_labels" in out.stdout


def test_the_check_command_refuses_an_unknown_provider_in_one_line() -> None:
    out = _sandgym("sandbox", "check", "--provider", "tests.sandboxes.outside_provider:Missing")
    assert out.returncode == 2
    assert "unknown provider 'tests.sandboxes.outside_provider:Missing'" in out.stderr
    assert "docker, local, prime, ray" in out.stderr and "pkg.module:ClassName" in out.stderr
