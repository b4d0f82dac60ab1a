"""STAND-IN for the Hugging Face Hub, for tests only: the real Hub cannot be reached from the test machines.

It answers the few endpoints that huggingface_hub (pinned in requirements.txt) and model_sync's transfer use,
with the shapes and headers huggingface_hub's own code reads at that version (hf_api.py: ModelInfo, RepoFile;
file_download.py: get_hf_file_metadata; utils/_http.py: hf_raise_for_status):

  GET  /api/models/{repo}/revision/{rev}        model info: id, sha (the commit), siblings ...
  POST /api/models/{repo}/paths-info/{rev}      form paths=...: [{type, path, size, oid, lfs: {oid, size, pointerSize}}]
  GET  /api/models/{repo}/tree/{rev}[/{dir}]    ?recursive=true: the same entries for a directory
  HEAD|GET /{repo}/resolve/{rev}/{path}         an LFS file: 302 to the storage host with X-Linked-Size,
                                                X-Linked-Etag ("sha256"), X-Repo-Commit; a git file: 200 with
                                                ETag (the git blob id), X-Repo-Commit, Range support
  GET  (storage host) /{repo}/{sha256}?X-Amz-... a signed URL: the bytes, Range support (sendfile); refuses a request
                                                that carries an Authorization header, as S3 presigned URLs do

Errors as the Hub answers them: an unknown repository or a private one without a token: 401 with
X-Error-Code RepoNotFound; a wrong token: 401 "Invalid credentials in Authorization header"; a token without
access: 403 X-Error-Code GatedRepo; an unknown revision: 404 RevisionNotFound; an unknown path: 404 EntryNotFound.

Repositories come from a directory: REPOS/<org>/<name>/refs.json ({"main": "<commit>"}) and
REPOS/<org>/<name>/<commit>/<files>. Files named *.gguf, *.safetensors or larger than 10 MiB are LFS files (as a
.gitattributes would make them). Counts of what it served go to --stats (JSON: api calls, resolve/ requests by
client, storage bytes per blob); --control (JSON, read at every request) can corrupt what the storage serves:
{"corrupt": ["<sha256>", ...]} flips one byte in the middle.

  hub_standin.py --repos DIR --port 18581 --storage-port 18582 [--token T --forbidden-token F]
                 --stats stats.json [--control control.json] [--daemon --pidfile P --log L] [--lifetime 3600]
"""
import argparse
import hashlib
import hmac
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 1 << 20
LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")
LFS_MIN_SIZE = 10 << 20
POINTER_SIZE = 134  # what the Hub reports for a git-lfs pointer of a sha256 oid and a size of this order
LOCK = threading.Lock()
REPO_RE = r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)"


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def git_blob_id(path):
    """git's object id of a file: sha1 over "blob <size>\\0" and the content."""
    digest = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def lfs_pointer(sha256, size):
    return ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha256, size)).encode()


def load_repos(root):
    """{repo: {"refs": {...}, "commits": {commit: {path: entry}}}} with each file's metadata computed once."""
    repos = {}
    for org in sorted(os.listdir(root)):
        for name in sorted(os.listdir(os.path.join(root, org))):
            base = os.path.join(root, org, name)
            with open(os.path.join(base, "refs.json")) as handle:
                refs = json.load(handle)
            commits = {}
            for commit in os.listdir(base):
                if not re.match(r"^[0-9a-f]{40}$", commit):
                    continue
                files = {}
                top = os.path.join(base, commit)
                for directory, _unused, names in os.walk(top):
                    for file_name in names:
                        full = os.path.join(directory, file_name)
                        rel = os.path.relpath(full, top)
                        size = os.path.getsize(full)
                        entry = {"full": full, "size": size}
                        if file_name.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE:
                            entry["sha256"] = sha256_of(full)
                            # the git tree holds the pointer: its blob id is what the tree API calls the oid
                            pointer = lfs_pointer(entry["sha256"], size)
                            entry["oid"] = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
                        else:
                            entry["oid"] = git_blob_id(full)
                        files[rel] = entry
                commits[commit] = files
            repos["%s/%s" % (org, name)] = {"refs": refs, "commits": commits}
    return repos


def tree_entry(path, entry):
    item = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
    if "sha256" in entry:
        item["lfs"] = {"oid": entry["sha256"], "size": entry["size"], "pointerSize": POINTER_SIZE}
    return item


def folder_entry(path, files):
    oid = hashlib.sha1("\n".join(sorted(p for p in files if p.startswith(path + "/"))).encode()).hexdigest()
    return {"type": "directory", "oid": oid, "size": 0, "path": path}


class Hub:
    """What both hosts share: the repositories, the token rules, the signing key and the counters."""

    def __init__(self, repos, token, forbidden_token, stats, control, storage_url):
        self.repos, self.token, self.forbidden_token = repos, token, forbidden_token
        self.stats_path, self.control_path, self.storage_url = stats, control, storage_url
        self.key = os.urandom(16)
        self.stats = {"api": {}, "resolve": {}, "storage": {}, "refused": {}}
        self.save()

    def count(self, kind, key, **add):
        with LOCK:
            entry = self.stats[kind].setdefault(key, {"requests": 0, "bytes": 0, "ranges": []})
            entry["requests"] += 1
            entry["bytes"] += add.get("sent", 0)
            if "range" in add:
                entry["ranges"].append(add["range"])
            self.save()

    def save(self):
        if not self.stats_path:
            return
        temporary = "%s.%d.tmp" % (self.stats_path, os.getpid())
        with open(temporary, "w") as handle:
            json.dump(self.stats, handle, indent=1, sort_keys=True)
        os.replace(temporary, self.stats_path)

    def corrupted(self, sha256):
        try:
            with open(self.control_path) as handle:
                return sha256 in json.load(handle).get("corrupt", [])
        except (OSError, ValueError, TypeError):
            return False

    def sign(self, path):
        return hmac.new(self.key, path.encode(), hashlib.sha256).hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hmk-hub-standin/1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s %s\n" % (time.strftime("%H:%M:%S"), self.server.role, fmt % args))

    @property
    def hub(self):
        return self.server.hub

    def reply(self, status, body=b"", headers=None, content_type="application/json"):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, message, code=None):
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self.hub.count("refused", "%d %s" % (status, code or message))
        self.reply(status, json.dumps({"error": message}).encode(), headers)
        return status

    def send_range(self, full, size, corrupt, headers=None):
        """200 or 206 for the Range header, sendfile for the body; returns the bytes sent and the range served."""
        start, end, status = 0, size - 1, 200
        wanted = self.headers.get("Range")
        if wanted:
            match = re.match(r"^bytes=(\d+)-(\d*)$", wanted.strip())
            if not match or int(match.group(1)) >= size:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return 0, "416"
            start, status = int(match.group(1)), 206
            if match.group(2):
                end = min(int(match.group(2)), size - 1)
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        return self._body(full, start, length, size // 2 if corrupt else None), "%d-" % start

    def _body(self, full, start, length, flip_at):
        self.end_headers()
        if self.command == "HEAD":
            return 0
        self.wfile.flush()
        sent = 0
        try:
            with open(full, "rb") as handle:
                while sent < length:
                    offset = start + sent
                    if flip_at is not None and offset <= flip_at < offset + CHUNK:
                        handle.seek(offset)
                        block = bytearray(handle.read(min(CHUNK, length - sent)))
                        if flip_at - offset < len(block):
                            block[flip_at - offset] ^= 0xFF
                        self.wfile.write(bytes(block))
                        done = len(block)
                    else:
                        done = os.sendfile(self.connection.fileno(), handle.fileno(), offset, min(CHUNK, length - sent))
                    if not done:
                        break
                    sent += done
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent

    def client(self):
        """Who asked, by User-Agent: a node (model_sync's own HTTP client, for the HEAD before the first byte and the
        GET) or huggingface_hub (the control machine)."""
        agent = self.headers.get("User-Agent", "")
        if agent.startswith("hybrid-moe-kit"):
            return "node"
        return "huggingface_hub" if "huggingface_hub" in agent else "other"

    # ---------------------------------------------------------------------------------------- the Hub host

    def authorize(self, repo):
        """None when the request may read `repo`, else the status of the error sent (as the Hub answers)."""
        if repo not in self.hub.repos:
            return self.error(401, "Repository not found", "RepoNotFound")
        if not self.hub.token:
            return None
        sent = self.headers.get("Authorization", "")
        if sent == "Bearer " + self.hub.token:
            return None
        if not sent:
            return self.error(401, "Repository not found", "RepoNotFound")
        if self.hub.forbidden_token and sent == "Bearer " + self.hub.forbidden_token:
            return self.error(403, "Access to model %s is restricted and you are not in the authorized list. "
                                   "Visit https://huggingface.co/%s to ask for access." % (repo, repo), "GatedRepo")
        return self.error(401, "Invalid credentials in Authorization header")

    def commit_of(self, repo, revision):
        info = self.hub.repos[repo]
        commit = info["refs"].get(revision, revision)
        if commit not in info["commits"]:
            self.error(404, "Invalid rev id: %s" % revision, "RevisionNotFound")
            return None
        return commit

    def do_GET(self):
        if self.server.role == "storage":
            return self.storage()
        url = urlsplit(self.path)
        path = unquote(url.path)
        match = re.match(r"^/api/models/%s(/revision/(?P<rev>[^/]+))?$" % REPO_RE, path)
        if match:
            return self.model_info(match.group("repo"), match.group("rev") or "main")
        match = re.match(r"^/api/models/%s/tree/(?P<rev>[^/]+)(?P<dir>/.*)?$" % REPO_RE, path)
        if match:
            recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
            return self.tree(match.group("repo"), match.group("rev"), (match.group("dir") or "").strip("/"), recursive)
        match = re.match(r"^/%s/resolve/(?P<rev>[^/]+)/(?P<file>.+)$" % REPO_RE, path)
        if match:
            return self.resolve(match.group("repo"), match.group("rev"), match.group("file"))
        return self.error(404, "Not found")

    def do_HEAD(self):
        self.do_GET()

    def do_POST(self):
        if self.server.role == "storage":
            return self.error(405, "Method not allowed")
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode(), keep_blank_values=True)
        match = re.match(r"^/api/models/%s/paths-info/(?P<rev>[^/]+)$" % REPO_RE, unquote(urlsplit(self.path).path))
        if not match:
            return self.error(404, "Not found")
        repo, revision = match.group("repo"), match.group("rev")
        self.hub.count("api", "paths-info %s@%s" % (repo, revision))
        if self.authorize(repo) is None and (commit := self.commit_of(repo, revision)):
            files = self.hub.repos[repo]["commits"][commit]
            found = []
            for wanted in form.get("paths", []):
                wanted = wanted.strip("/")
                if wanted in files:
                    found.append(tree_entry(wanted, files[wanted]))
                elif any(p.startswith(wanted + "/") for p in files):
                    found.append(folder_entry(wanted, files))
            self.reply(200, json.dumps(found).encode())

    def model_info(self, repo, revision):
        self.hub.count("api", "revision %s@%s" % (repo, revision))
        if self.authorize(repo) is not None:
            return
        commit = self.commit_of(repo, revision)
        if commit is None:
            return
        author = repo.split("/")[0]
        body = {"_id": hashlib.sha1(repo.encode()).hexdigest()[:24], "id": repo, "modelId": repo, "author": author,
                "sha": commit, "lastModified": "2026-11-30T12:00:00.000Z", "createdAt": "2026-11-30T12:00:00.000Z",
                "private": bool(self.hub.token), "gated": False, "disabled": False, "downloads": 0, "likes": 0,
                "library_name": "gguf", "tags": ["gguf", "stand-in"],
                "siblings": [{"rfilename": p} for p in sorted(self.hub.repos[repo]["commits"][commit])]}
        self.reply(200, json.dumps(body).encode())

    def tree(self, repo, revision, directory, recursive):
        self.hub.count("api", "tree %s@%s/%s" % (repo, revision, directory))
        if self.authorize(repo) is not None:
            return
        commit = self.commit_of(repo, revision)
        if commit is None:
            return
        files = self.hub.repos[repo]["commits"][commit]
        prefix = directory + "/" if directory else ""
        if directory and not any(p.startswith(prefix) for p in files):
            return self.error(404, "Entry not found", "EntryNotFound")
        entries, folders = [], set()
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                folders.add(prefix + "/".join(rest[:depth]))
            if recursive or len(rest) == 1:
                entries.append(tree_entry(path, files[path]))
        entries += [folder_entry(f, files) for f in sorted(folders) if recursive or "/" not in f[len(prefix):]]
        self.reply(200, json.dumps(entries).encode())

    def resolve(self, repo, revision, path):
        if self.authorize(repo) is not None:
            return
        commit = self.commit_of(repo, revision)
        if commit is None:
            return
        entry = self.hub.repos[repo]["commits"][commit].get(path)
        if entry is None:
            return self.error(404, "Entry not found", "EntryNotFound")
        self.hub.count("resolve", "%s %s/%s@%s by %s" % (self.command, repo, path, commit, self.client()))
        headers = {"X-Repo-Commit": commit, "Vary": "Origin, Accept-Encoding", "Access-Control-Expose-Headers":
                   "X-Repo-Commit,X-Request-Id,X-Error-Code,X-Error-Message,X-Total-Count,ETag,Link,Accept-Ranges,"
                   "Content-Range,X-Linked-Size,X-Linked-ETag,X-Xet-Hash"}
        if "sha256" in entry:
            blob = "/%s/%s" % (repo, entry["sha256"])
            location = "%s%s?X-Amz-Expires=3600&X-Amz-Signature=%s" % (self.hub.storage_url, quote(blob),
                                                                       self.hub.sign(blob))
            headers.update({"Location": location, "X-Linked-Size": str(entry["size"]),
                            "X-Linked-ETag": '"%s"' % entry["sha256"], "ETag": '"%s"' % entry["oid"]})
            return self.reply(302, b"Found. Redirecting to " + location.encode(), headers, "text/plain; charset=utf-8")
        sent, served = self.send_range(entry["full"], entry["size"], corrupt=False,
                                       headers=dict(headers, ETag='"%s"' % entry["oid"]))
        if self.command == "GET":
            self.hub.count("resolve", "bytes %s/%s@%s by %s" % (repo, path, commit, self.client()), sent=sent,
                           range=served)

    # ---------------------------------------------------------------------------------------- the storage host

    def storage(self):
        url = urlsplit(self.path)
        blob = unquote(url.path)
        if self.headers.get("Authorization"):
            return self.error(400, "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
                                   "Signature query string parameter or the Authorization header should be specified",
                              "InvalidArgument")
        signature = parse_qs(url.query).get("X-Amz-Signature", [""])[0]
        if not hmac.compare_digest(signature, self.hub.sign(blob)):
            return self.error(403, "Request has expired or the signature does not match", "AccessDenied")
        match = re.match(r"^/%s/(?P<sha>[0-9a-f]{64})$" % REPO_RE, blob)
        entry = None
        if match:
            for commit in self.hub.repos.get(match.group("repo"), {}).get("commits", {}).values():
                entry = next((e for e in commit.values() if e.get("sha256") == match.group("sha")), entry)
        if entry is None:
            return self.error(404, "The specified key does not exist.", "NoSuchKey")
        sha = match.group("sha")
        sent, served = self.send_range(entry["full"], entry["size"], corrupt=self.hub.corrupted(sha))
        if self.command == "GET":
            self.hub.count("storage", sha, sent=sent, range=served)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repos", required=True)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--storage-port", type=int, required=True)
    ap.add_argument("--token", default="")
    ap.add_argument("--forbidden-token", default="", help="a valid token without access to the repositories (403)")
    ap.add_argument("--stats", default="")
    ap.add_argument("--control", default="")
    ap.add_argument("--daemon", action="store_true")
    ap.add_argument("--pidfile", default="")
    ap.add_argument("--log", default=os.devnull)
    ap.add_argument("--lifetime", type=int, default=3600, help="exit after this many seconds (a stray stand-in ends)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    hub = Hub(load_repos(args.repos), args.token, args.forbidden_token, args.stats, args.control,
              "http://%s:%d" % (args.bind, args.storage_port))
    servers = []
    for role, port in (("hub", args.port), ("storage", args.storage_port)):
        server = ThreadingHTTPServer((args.bind, port), Handler)
        server.daemon_threads, server.role, server.hub = True, role, hub
        servers.append(server)
    if args.daemon:
        child = os.fork()
        if child:
            os.waitpid(child, 0)  # the grandchild's pid is in the pidfile once this returns; both sockets listen
            return 0
        os.setsid()
        grandchild = os.fork()
        if grandchild:
            if args.pidfile:
                with open(args.pidfile, "w") as handle:
                    handle.write("%d\n" % grandchild)
            os._exit(0)
        log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
    elif args.pidfile:
        with open(args.pidfile, "w") as handle:
            handle.write("%d\n" % os.getpid())
    storage = threading.Thread(target=servers[1].serve_forever, daemon=True)
    storage.start()
    timer = threading.Timer(args.lifetime, servers[0].shutdown)
    timer.daemon = True
    timer.start()
    try:
        servers[0].serve_forever()
    finally:
        servers[1].shutdown()
        if args.pidfile and os.path.exists(args.pidfile):
            os.unlink(args.pidfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
