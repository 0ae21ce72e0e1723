"""The persistent Python REPL that SandboxRepl runs inside a sandbox, as source text.

One file, two roles. `repl.py serve` is the long-lived server on a unix socket (a relative
path under the sandbox's working directory, so it works with network none). It runs as one
long `exec` that SandboxRepl holds open (PythonEnv's, for the rollout): that works on every
provider, even where an exec's stray background processes die with it (the local
provider's pid namespaces). A cell goes to it through a short client (`client_argv`, the cell on its
stdin) that prints the server's one JSON line: {"status": "ok"|"timeout"|
"crashed"|"unavailable", "stdout", "stderr"}. On anything but "ok" SandboxRepl cancels the
server's exec (which kills it) and starts a fresh one.
"""


def repl_argv(*args: str) -> list[str]:
    """argv running the server with `python3 -c` from the sandbox's working directory: no
    file to upload first (one exec less per rollout)."""
    return ["python3", "-c", REPL_SOURCE, *args]


def client_argv(timeout: float, instance: str) -> list[str]:
    """argv of the client of server `instance`: it sends the cell on its stdin and prints the
    reply line. An interpreter without site (-I -S) that imports nothing more but `_socket`:
    a cell's cost is mostly the client's start (p50 per cell, strict: 75-77 ms when the client
    was the server's script with its imports, 28-31 ms now; vm 204-228 -> 89-111 ms)."""
    return ["python3", "-I", "-S", "-c", f"{CLIENT_SOURCE}\nclient({instance!r}, {float(timeout)!r})\n"]


CLIENT_SOURCE = r'''
import os, sys, time

DIR = ".sgrepl"  # under the working directory (every exec starts there)


def sock_path(instance):
    # Each server instance has its own socket, so a client never reaches one being killed.
    return os.path.join(DIR, instance + ".sock")


def reply(status, stderr=""):
    import json  # only on failures: the server writes an "ok" reply's line itself

    print(json.dumps({"status": status, "stdout": "", "stderr": stderr}))


def recvn(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def client(instance, timeout):
    import _socket

    body = sys.stdin.buffer.read()
    deadline = time.time() + 20  # the server may still be starting
    while True:
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            conn.connect(sock_path(instance))
            break
        except OSError as exc:
            conn.close()
            if time.time() > deadline:
                return reply("unavailable", str(exc))
            time.sleep(0.01)
    try:
        conn.sendall(len(body).to_bytes(4, "big") + body)
        conn.settimeout(timeout)
        try:
            head = recvn(conn, 4)
            line = None if head is None else recvn(conn, int.from_bytes(head, "big"))
        except _socket.timeout:  # TimeoutError from Python 3.10; its own OSError before
            return reply("timeout")
        except OSError as exc:
            return reply("crashed", str(exc))
        if line is None:
            return reply("crashed")
        sys.stdout.buffer.write(line + b"\n")
    finally:
        conn.close()
'''


# The server: the client's helpers (socket path, framing), then its own.
REPL_SOURCE = CLIENT_SOURCE + r'''
import ast, contextlib, io, json, socket, traceback


def send(conn, obj):
    data = json.dumps(obj).encode()
    conn.sendall(len(data).to_bytes(4, "big") + data)


def recv(conn):
    """The cell a client sent (its source, UTF-8), or None."""
    head = recvn(conn, 4)
    if head is None:
        return None
    body = recvn(conn, int.from_bytes(head, "big"))
    return None if body is None else body.decode("utf-8", "surrogatepass")


def run_cell(code, ns):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), ns)
        if value is not None:
            print(repr(value))


def serve(instance):
    sock = sock_path(instance)
    os.makedirs(DIR, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock)  # relative: unix socket paths are short
    srv.listen(16)
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        conn, _ = srv.accept()
        with conn:
            code = recv(conn)
            if code is None:
                continue
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    run_cell(code, ns)
                except SystemExit as exc:
                    print(f"SystemExit: {exc.code}", file=sys.stderr)
                except BaseException:
                    etype, value, tb = sys.exc_info()
                    # Drop this file's frames: show only the user's cell.
                    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
                        tb = tb.tb_next
                    traceback.print_exception(etype, value, tb)
            try:
                send(conn, {"status": "ok", "stdout": out.getvalue(), "stderr": err.getvalue()})
            except OSError:
                pass


if __name__ == "__main__":
    serve(sys.argv[2])
'''
