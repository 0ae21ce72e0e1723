"""execd's entry point in a sandbox: `python3 -I -S /opt/sandgym-execd/main.py --socket ...`.

Python compiles the script it is given from source on every start and never reads it from a
`.pyc`; execd is every sandbox's first process, so the script is this stub and server.py is
imported, from its `.pyc` when the host made one for this Python version
(client.ensure_bytecode): about 16 ms less CPU a start, a tenth of a runc sandbox's start
(benchmarks/RESULTS.md). Standard library only, Python >= 3.9."""

import os
import sys

# -I keeps this folder off sys.path; first, so no module of the image shadows execd's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import server  # type: ignore[import-not-found]

server.main()
