"""The platform service behind `sandgym serve`: Prime's sandbox REST contract (as the
unmodified prime-sandboxes 0.5.1 SDK speaks it) over a local SandboxManager. Operator guide,
state and the reaper's label contract: docs/platform.md.

- app.py       FastAPI app: control plane under /api/v1, health, metrics, docs at /docs
- gateway.py   per-sandbox gateway: Connect `command_session.CommandSession` (a table of
               method handlers), upload, download, read-file
- connect.py   the Connect protocol framing and error codes
- sessions.py  live-process sessions (re-attach, idempotent input/signals); the processes
               come from `Sandbox.start_live` (sandgym/sandboxes/live.py)
- service.py   records <-> manager: fair admission, background creation, deletion, TTL and
               idle reaping, deaths, restarts (re-adoption)
- store.py     records per tenant, idempotency keys, quotas, written through to db.py
- db.py        the SQLite state of one state directory
- egress.py    Prime's network lists <-> the sandbox layer's EgressPolicy
- limits.py    request-body limits (413)
- auth.py      bearer tokens (one tenant per token)
- models.py    wire models
- runner.py    the server process: drain on SIGTERM, re-exec in place on SIGHUP
- sockets.py   the listening socket that outlives a process: socket activation (LISTEN_FDS),
               handing it (and the kept-alive connections) over across a re-exec
- testing.py   a live server in a thread and a PrimeProvider on it, for tests and benchmarks
"""
