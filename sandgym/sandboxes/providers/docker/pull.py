"""Images from registries: pull policy missing|never|always, credentials, progress.

With policy missing, an image the provider can build itself (`build`: sandgym's own images,
images.build_missing) is built instead of pulled; nothing else changes (`never` still
refuses a missing image, `always` still pulls).

Credentials come from the Docker client configuration, read again before every pull so a
`docker login` made after the provider started counts: `$DOCKER_CONFIG/config.json`, else
`~/.docker/config.json` (`auths`, `credsStore`, `credHelpers`), as the docker CLI reads them.
Progress events go to a callback (the CLI draws a bar) or, without one, to log lines every
few seconds. Concurrent creates of one image pull it once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import docker
import docker.errors
from docker.utils import parse_repository_tag

from ...errors import ImagePullError, SpecError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PullProgress:
    """One pull progress event, with the totals over every layer seen so far."""

    image: str
    status: str  # the engine's words: "Downloading", "Pull complete", "Digest: ...", ...
    layer: str | None = None
    current: int | None = None  # this layer's bytes done, when the engine says
    total: int | None = None
    done_bytes: int = 0  # all layers
    total_bytes: int = 0


ProgressFn = Callable[[PullProgress], None]
_DONE = ("Download complete", "Pull complete", "Already exists")


class _Totals:
    def __init__(self) -> None:
        self.layers: dict[str, tuple[int, int]] = {}

    def feed(self, ev: dict) -> tuple[int, int]:
        lid, status = ev.get("id"), ev.get("status", "")
        detail = ev.get("progressDetail") or {}
        if lid and status == "Downloading" and detail.get("total"):
            self.layers[lid] = (int(detail.get("current") or 0), int(detail["total"]))
        elif lid and status in _DONE and lid in self.layers:
            total = self.layers[lid][1]
            self.layers[lid] = (total, total)
        done = sum(c for c, _ in self.layers.values())
        return done, sum(t for _, t in self.layers.values())


class Puller:
    """Pulls for one provider; one pull per image at a time."""

    def __init__(
        self,
        api: Callable[[], docker.APIClient],
        progress: ProgressFn | None = None,
        build: Callable[[str], bool] | None = None,
    ) -> None:
        """`build(image)`: make a missing image locally; False when it cannot (then pull)."""
        self._api = api
        self.progress = progress
        self.build = build
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _lock(self, image: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(image, threading.Lock())

    def present(self, image: str) -> str | None:
        try:
            return str(self._api().inspect_image(image)["Id"])
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as e:
            raise SpecError(f"image: {image!r} cannot be inspected: {e.explanation}") from e

    def ensure(self, image: str, policy: str, shown: str | None = None) -> str:
        """The local id of `image`, pulled first as `policy` says. `shown` is the name the
        caller asked for (before an alias), for messages."""
        shown = shown or image
        if policy == "never":
            found = self.present(image)
            if found is None:
                raise SpecError(
                    f"image: {shown!r} is not present locally and image_pull='never'; build it "
                    "(`sandgym images build`), pull it, or allow pulls (image_pull='missing')"
                )
            return found
        with self._lock(image):
            if policy == "missing":
                found = self.present(image)
                if found is not None:
                    return found
                if self.build is not None and self._built(image, shown):
                    found = self.present(image)
                    if found is None:
                        raise ImagePullError(f"image: {shown!r} was built but is not present afterwards")
                    return found
            self.pull(image, shown)
            found = self.present(image)
            if found is None:  # the engine said it pulled, yet it is not there
                raise ImagePullError(f"image: {shown!r} was pulled but is not present afterwards")
            return found

    def _built(self, image: str, shown: str) -> bool:
        assert self.build is not None
        try:
            return self.build(image)
        except Exception as exc:
            raise ImagePullError(
                f"image: {shown!r} is not present locally and building it failed: {exc}. "
                "Run `sandgym images build` to see the whole build"
            ) from exc

    def pull(self, image: str, shown: str | None = None) -> None:
        shown = shown or image
        api = self._api()
        try:
            api.reload_config()  # a `docker login` since we started counts
        except Exception as exc:  # a broken config must not stop a pull that needs none
            log.warning("cannot read the docker client config: %r", exc)
        repo, tag = parse_repository_tag(image)
        if tag and tag.startswith("sha256:"):  # repo@sha256:...
            repo, tag = image.split("@", 1)[0], image.split("@", 1)[1]
        totals = _Totals()
        last_log = 0.0
        started = time.monotonic()
        log.info("pulling %s", image)
        try:
            for ev in api.pull(repo, tag=tag or "latest", stream=True, decode=True):
                if "error" in ev:
                    msg = (ev.get("errorDetail") or {}).get("message") or ev["error"]
                    raise ImagePullError(_failed(shown, image, str(msg)))
                done, total = totals.feed(ev)
                detail = ev.get("progressDetail") or {}
                event = PullProgress(
                    image=shown, status=str(ev.get("status", "")), layer=ev.get("id"),
                    current=detail.get("current"), total=detail.get("total"),
                    done_bytes=done, total_bytes=total,
                )
                if self.progress is not None:
                    self.progress(event)
                elif time.monotonic() - last_log >= 5.0 or not event.layer:
                    last_log = time.monotonic()
                    log.info("pull %s: %s %s", shown, event.status,
                             f"({done >> 20}/{total >> 20} MiB)" if total else "")
        except docker.errors.APIError as e:
            raise ImagePullError(_failed(shown, image, str(e.explanation or e))) from e
        except docker.errors.DockerException as e:
            raise ImagePullError(_failed(shown, image, str(e))) from e
        log.info("pulled %s in %.1fs", image, time.monotonic() - started)


def _failed(shown: str, image: str, why: str) -> str:
    alias = f" (alias of {shown!r})" if shown != image else ""
    return (
        f"image: {image!r}{alias} is not present locally and pulling it failed: {why}. "
        "Build it (`sandgym images build`), make its registry reachable (credentials: "
        "DOCKER_CONFIG or ~/.docker/config.json), or map it to a local image (image aliases)"
    )
