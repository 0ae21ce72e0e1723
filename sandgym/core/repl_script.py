"""The persistent Python REPL that PythonEnv runs inside a sandbox, as source text.

One file, two roles. `repl.py serve` is a long-lived server on a unix socket (relative path
under the sandbox's working directory, so it works with network none and on any provider);
`repl.py client TIMEOUT` reads code on stdin, starts the server when none answers, sends the
code, and prints one JSON line: {"status": "ok"|"timeout"|"crashed", "stdout", "stderr",
"restarted"}. On a timeout the client kills the server's process group; the next call
starts a fresh one (variables are lost, and the reply says so).
"""

REPL_DIR = ".sgrepl"
REPL_PATH = f"{REPL_DIR}/repl.py"

REPL_SOURCE = r'''
import ast, contextlib, io, json, os, signal, socket, struct, subprocess, sys, time, traceback

DIR = os.path.dirname(os.path.abspath(__file__))
SOCK = os.path.join(DIR, "sock")
PIDF = os.path.join(DIR, "pid")


def send(conn, obj):
    data = json.dumps(obj).encode()
    conn.sendall(struct.pack(">I", len(data)) + data)


def recvn(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv(conn):
    head = recvn(conn, 4)
    if head is None:
        return None
    body = recvn(conn, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


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


def serve():
    os.chdir(os.path.dirname(DIR))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCK)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(os.path.relpath(SOCK))  # relative: unix socket paths are short
    srv.listen(16)
    with open(PIDF, "w") as f:
        f.write(str(os.getpid()))
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        conn, _ = srv.accept()
        with conn:
            req = recv(conn)
            if req is None:
                continue
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    run_cell(req["code"], ns)
                except SystemExit as exc:
                    print(f"SystemExit: {exc.code}", file=sys.stderr)
                except BaseException:
                    etype, value, tb = sys.exc_info()
                    # Drop this file's frames: show only the user's cell.
                    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                        tb = tb.tb_next
                    traceback.print_exception(etype, value, tb)
            try:
                send(conn, {"stdout": out.getvalue(), "stderr": err.getvalue()})
            except OSError:
                pass


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.relpath(SOCK))
    return s


def kill_server():
    try:
        pid = int(open(PIDF).read().strip())
    except (OSError, ValueError):
        return
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.unlink(PIDF)


def start_server():
    log = open(os.path.join(DIR, "server.log"), "ab")
    subprocess.Popen([sys.executable, __file__, "serve"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                     start_new_session=True, close_fds=True)
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            return connect()
        except OSError:
            time.sleep(0.01)
    raise RuntimeError("the Python REPL did not start: " + open(os.path.join(DIR, "server.log"), errors="replace").read()[-2000:])


def client(timeout):
    os.chdir(os.path.dirname(DIR))
    code = sys.stdin.read()
    restarted = False
    try:
        conn = connect()
    except OSError:
        restarted = os.path.exists(PIDF)  # a server ran before and is gone
        kill_server()
        conn = start_server()
    reply = {"restarted": restarted}
    with conn:
        send(conn, {"code": code})
        conn.settimeout(timeout)
        try:
            resp = recv(conn)
        except (socket.timeout, TimeoutError):
            kill_server()
            reply.update(status="timeout", stdout="", stderr="")
        except OSError as exc:
            kill_server()
            reply.update(status="crashed", stdout="", stderr=str(exc))
        else:
            if resp is None:
                kill_server()
                reply.update(status="crashed", stdout="", stderr="")
            else:
                reply.update(status="ok", **resp)
    print(json.dumps(reply))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        client(float(sys.argv[2]))
'''
