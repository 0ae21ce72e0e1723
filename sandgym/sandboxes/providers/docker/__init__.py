"""The `docker` provider: one hardened container per sandbox on the local Docker engine.

Everything that knows about Docker lives in this folder:

- provider.py   DockerProvider and DockerSandbox: container config, lifecycle, OOM attribution
- transport.py  the `Transport` protocol: how commands and files reach a container
- execd.py      the execd transport (unix socket, the default) and the host socket dirs
- exec.py       the Docker exec API transport (images without python3)
- demux.py      Docker's attach stream: the one frame parser and socket reader
- images.py     building the sandbox images with no container registry
- pull.py       images from registries: pull policy, credentials, progress
- disk.py       per-sandbox ext4 disks (quota without memory)
- runtime/      the gVisor / runc-sandgym runtime wrapper, the statx shim, their installer
- events.py     why a container died, from the engine's event stream
"""

from .provider import DockerProvider, DockerSandbox

__all__ = ["DockerProvider", "DockerSandbox"]
