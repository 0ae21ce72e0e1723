"""The built-in providers, one module or folder each: `docker/` (containers on the local
Docker engine), `local/` (subprocesses under bubblewrap) and `prime.py` (Prime's sandbox
API, or `sandgym serve`), `ray/` (the sandgym nodes of a Ray cluster: a node agent per
machine wrapping its docker provider). registry.py maps names to them.

A new provider implements `Provider` and `Sandbox` (base.py) and passes the provider
contract: `sandgym sandbox check --provider NAME`, or `contract.run_contract(provider)`.
"""
