"""A compiled-code cache for Python modules imported from zip files, installed in the twin's image only.

scripts/build-image.sh puts this file in the twin's /usr/local/lib/python3.X/dist-packages as hmk_twin_pyc.py, with
a hmk-twin-pyc.pth beside it that imports it when Python starts. It is part of the test bed, never of a node the kit
manages.

Why: every Ansible task runs its module from a zip of Python sources (AnsiballZ) that no .pyc comes with, so Python's
zipimport compiles ansible.module_utils again for each task. Measured on this bed (2026-12-04, host load ~4): 7.0 s
per `command` task on a VM twin under software emulation without the cache, 4.2 s with it; 0.60 s and 0.25 s on a
container twin.

What: zipimport._compile_source (the one place zipimport turns a source file into code) is wrapped. The code object
compile() makes of a module is kept in $HMK_TWIN_PYC_DIR (default /var/cache/hmk-twin-pyc), under a SHA-256 of the
interpreter's version and optimisation level, the module's path inside its zip and its source bytes, so a changed
source is a new key and never gets the old code. A hit is the same code with the path of the zip it came from this
time (tracebacks name the real file). Anything that goes wrong here (an unreadable or damaged entry, a directory that
cannot be written) falls back to compile() as before.
"""
import zipimport

_compile = zipimport._compile_source


def _with_filename(code, filename):
    consts = tuple(_with_filename(c, filename) if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _key(pathname, source):
    import hashlib
    import os
    import sys
    inner = pathname.split(".zip" + os.sep, 1)[-1]
    head = "%s\0%d\0%s\0" % (sys.version, sys.flags.optimize, inner)
    return hashlib.sha256(head.encode("utf-8", "surrogateescape") + source).hexdigest()


def cached_compile_source(pathname, source):
    """zipimport._compile_source, with the compiled code kept by content hash."""
    try:
        import marshal
        import os
        if isinstance(source, str):
            source = source.encode("utf-8")
        key = _key(pathname, source)
        entry = os.path.join(os.environ.get("HMK_TWIN_PYC_DIR", "/var/cache/hmk-twin-pyc"), key[:2], key)
        try:
            with open(entry, "rb") as f:
                return _with_filename(marshal.loads(f.read()), pathname)
        except (OSError, EOFError, ValueError, TypeError):
            pass
        code = _compile(pathname, source)
        try:
            os.makedirs(os.path.dirname(entry), mode=0o755, exist_ok=True)
            partial = "%s.%d.partial" % (entry, os.getpid())
            with open(partial, "wb") as f:
                f.write(marshal.dumps(code))
            os.replace(partial, entry)
        except OSError:
            pass
        return code
    except Exception:  # pylint: disable=broad-except
        return _compile(pathname, source)


zipimport._compile_source = cached_compile_source
