"""A stand-in engine as a process of its own, for tests/integration/test_door_haproxy.py: it answers 200 with
{"engine_saw": path} on 127.0.0.1:<port> (argument 1) until it is killed, which is how the test crashes a node's
engine behind its door."""
import http.server
import json
import sys


def engine_class(seen=None):
    """The stand-in's request handler; with a list as `seen`, each request's (path, Authorization, X-Api-Key) is
    appended to it (the in-process engines of test_door_haproxy.py)."""
    class Engine(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if seen is not None:
                seen.append((self.path, self.headers.get("Authorization"), self.headers.get("X-Api-Key")))
            body = json.dumps({"engine_saw": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass
    return Engine


if __name__ == "__main__":
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), engine_class())
    print("listening", flush=True)
    server.serve_forever()
