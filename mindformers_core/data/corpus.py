"""Built-in default corpus: docstrings of the Python standard library.

Why: ``make demo`` and the tests must train a tokenizer and a model without any download. Every machine
that runs this package has a Python installation, and its standard library carries a few megabytes of
English prose (docstrings). We walk a fixed, sorted list of modules so the text is byte-identical on every
run with the same Python version (different Python versions give slightly different text).

Format: one document per line (each docstring with its whitespace collapsed), UTF-8, ``\\n`` endings,
which is the plain-text format :mod:`mindformers_core.data.dataset` reads.
"""
import importlib
import inspect
import os
import warnings

# Fixed and sorted, so the order never depends on the file system or sys.modules. Modules with import side
# effects (this, antigravity, turtle, tkinter, idlelib) or platform-only modules are left out on purpose.
DEFAULT_MODULES = tuple(sorted((
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "cmd", "codecs", "collections",
    "concurrent.futures", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal",
    "difflib", "doctest", "email", "enum", "fileinput", "fnmatch", "fractions", "ftplib", "functools",
    "getopt", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "http.server",
    "imaplib", "inspect", "io", "ipaddress", "itertools", "json", "logging", "lzma", "mailbox", "math",
    "mimetypes", "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pkgutil", "platform",
    "plistlib", "poplib", "pprint", "queue", "quopri", "random", "re", "sched", "secrets", "selectors",
    "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "socketserver", "statistics", "string",
    "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace",
    "traceback", "types", "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings",
    "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "zipfile", "zoneinfo",
)))


def _normalise(doc):
    """Collapse all whitespace runs to one space: line breaks inside a docstring are layout, not content."""
    return " ".join(doc.split()) if isinstance(doc, str) else ""


def _import(name):
    """Import a module, or return None: a module missing on this build must not break the corpus."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure just drops the module
        return None


def _module_docs(module):
    """Yield the module docstring, then its own classes/functions (sorted by name) and their methods."""
    yield module.__doc__
    for name in sorted(vars(module)):
        obj = vars(module)[name]
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue  # skip private names and re-exports (they would appear under another module too)
        if inspect.isclass(obj):
            yield obj.__doc__
            for attr in sorted(vars(obj)):
                member = vars(obj)[attr]
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
                    yield member.__doc__
        elif inspect.isfunction(obj):
            yield obj.__doc__


def iter_documents(modules=DEFAULT_MODULES):
    """Yield normalised, de-duplicated docstrings of ``modules`` in a deterministic order."""
    seen = set()
    for name in modules:
        module = _import(name)
        if module is None:
            continue
        for doc in _module_docs(module):
            doc = _normalise(doc)
            if len(doc) >= 20 and doc not in seen:  # very short docstrings ("Return x.") add little text
                seen.add(doc)
                yield doc


def build_corpus(path, modules=DEFAULT_MODULES, max_bytes=None):
    """Write the docstring corpus to ``path`` (one document per line) and return ``path``.

    ``max_bytes`` caps the file size; only whole documents are written, so the file may be a little
    smaller than the cap. The file is written to a temporary name and renamed, so a reader never sees a
    partial corpus (several ranks may build it at once).
    """
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive or None, got {max_bytes!r}")
    parts, size = [], 0
    for doc in iter_documents(modules):
        line = (doc + "\n").encode("utf-8", "replace")
        if max_bytes is not None and size + len(line) > max_bytes:
            break
        parts.append(line)
        size += len(line)
    if not parts:
        raise ValueError(f"corpus is empty (modules={list(modules)!r}, max_bytes={max_bytes!r})")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
    os.replace(tmp, path)
    return path
