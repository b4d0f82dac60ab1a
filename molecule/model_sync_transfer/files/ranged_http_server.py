"""A model store for tests: serves a directory over HTTP on 127.0.0.1 with Range support, counts the
bytes it sends per file into a JSON file, and can cut one response after N bytes (a transfer killed
half-way). Standard library only.

  ranged_http_server.py --root DIR --port 18431 --stats stats.json [--control control.json]
                        [--token SECRET] [--daemon --pidfile server.pid --log server.log] [--lifetime 3600]

control.json (read at every request): {"die_after": {"/model/file.gguf": 4000000}} cuts the next
response for that path after 4000000 bytes; the entry is then removed, so the retry gets the rest.
stats.json: {"/model/file.gguf": {"bytes": n, "requests": n, "ranges": ["0-", "4000000-"]}, ...}
"""
import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20
LOCK = threading.Lock()


def load_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def save_json(path, data):
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
    os.replace(temporary, path)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hmk-test-store/1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (time.strftime("%H:%M:%S"), fmt % args))

    def _count(self, path, sent, byte_range):
        if not self.server.stats:
            return
        with LOCK:
            stats = load_json(self.server.stats)
            entry = stats.setdefault(path, {"bytes": 0, "requests": 0, "ranges": []})
            entry["bytes"] += sent
            entry["requests"] += 1
            entry["ranges"].append(byte_range)
            save_json(self.server.stats, stats)

    def _die_after(self, path):
        if not self.server.control:
            return None
        with LOCK:
            control = load_json(self.server.control)
            limit = control.get("die_after", {}).pop(path, None)
            if limit is not None:
                save_json(self.server.control, control)
        return limit

    def do_HEAD(self):
        self.do_GET(body=False)

    def do_GET(self, body=True):
        if self.server.token and self.headers.get("Authorization") != "Bearer " + self.server.token:
            self.send_error(401, "bearer token required")
            return
        path = unquote(urlsplit(self.path).path)
        full = os.path.realpath(os.path.join(self.server.root, path.lstrip("/")))
        if not full.startswith(self.server.root + os.sep) or not os.path.isfile(full):
            self.send_error(404)
            return
        size = os.path.getsize(full)
        start, end, status = 0, size - 1, 200
        wanted = self.headers.get("Range")
        if wanted:
            match = re.match(r"^bytes=(\d+)-(\d*)$", wanted.strip())
            if not match or int(match.group(1)) >= size:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, status = int(match.group(1)), 206
            if match.group(2):
                end = min(int(match.group(2)), size - 1)
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        if not body:
            return
        limit = self._die_after(path)
        sent = 0
        try:
            # sendfile, as a real mirror (nginx, Apache) serves: the loopback benchmark then measures the
            # client's cost, not this server's Python copy loop.
            self.wfile.flush()
            with open(full, "rb") as handle:
                while sent < length:
                    count = min(CHUNK, length - sent)
                    if limit is not None:
                        count = min(count, limit - sent)
                    done = os.sendfile(self.connection.fileno(), handle.fileno(), start + sent, count)
                    if not done:
                        break
                    sent += done
                    if limit is not None and sent >= limit:
                        self.close_connection = True
                        self.connection.shutdown(2)
                        break
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            self._count(path, sent, "%d-" % start)


def write_pidfile(path, pid):
    if path:
        with open(path, "w") as handle:
            handle.write("%d\n" % pid)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--stats", default="")
    ap.add_argument("--control", default="")
    ap.add_argument("--token", default="")
    ap.add_argument("--daemon", action="store_true")
    ap.add_argument("--pidfile", default="")
    ap.add_argument("--log", default=os.devnull)
    ap.add_argument("--lifetime", type=int, default=3600, help="exit after this many seconds (a stray server ends)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    server = ThreadingHTTPServer((args.bind, args.port), Handler)
    server.daemon_threads = True
    server.root = os.path.realpath(args.root)
    server.stats, server.control, server.token = args.stats, args.control, args.token
    if args.daemon:
        child = os.fork()
        if child:
            os.waitpid(child, 0)  # the child writes the pidfile before it exits; the socket already listens
            return 0
        os.setsid()
        grandchild = os.fork()
        if grandchild:
            write_pidfile(args.pidfile, grandchild)
            os._exit(0)
        log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
    else:
        write_pidfile(args.pidfile, os.getpid())
    timer = threading.Timer(args.lifetime, server.shutdown)
    timer.daemon = True
    timer.start()
    try:
        server.serve_forever()
    finally:
        if args.pidfile and os.path.exists(args.pidfile):
            os.unlink(args.pidfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
