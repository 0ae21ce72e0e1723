#!/usr/bin/env python3
"""execd's entry point in a sandbox: `python3 -I -S /opt/sandgym-execd/server.py --socket ...`
(daemon.py has the code and documents the options and the wire format).

Python compiles the script it is given from source on every start and never reads it from a
`.pyc`; execd is every sandbox's first process, so the script is this stub and daemon.py is
imported, from its `.pyc` when the host made one for this Python version
(client.ensure_bytecode): about 12 ms less CPU a start, a tenth of a runc sandbox's start
(benchmarks/RESULTS.md). Standard library only, Python >= 3.9."""

import os
import sys

if __name__ == "__main__":
    # -I keeps this folder off sys.path; first, so no module of the image shadows execd's.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import daemon  # type: ignore[import-not-found]

    daemon.main()
else:  # imported on the host as sandgym.sandboxes.execd.server: the daemon's names, as before
    from .daemon import *  # noqa: F403
