"""One way to register anything: a named ``Registry`` table, one lazy ``"module:name"`` importer
and the loading of plug-in modules.

Sources, algorithms, measurements, architectures, experiments, scales, protocol switches and
model presets are each one ``Registry``: a table name -> entry in registration order, whose
``register`` refuses a name taken (unless ``replace=True``) and whose ``lookup`` of an unknown
name is a ``ValueError`` that lists the known names and says how to add one. Every hand-kept
list of names elsewhere is read from the table, so an entry registered later (a plug-in) is in
it.

>>> colours = Registry("colour", key="paint.colour", how_to_add="register_colour(name, rgb)")
>>> colours.register("red", (255, 0, 0))
(255, 0, 0)
>>> colours.lookup("blue")
Traceback (most recent call last):
...
ValueError: paint.colour='blue': use one of red (add one with register_colour(name, rgb))
>>> colours.register("red", (250, 0, 0))
Traceback (most recent call last):
...
ValueError: colour 'red' is registered already; choose another name, or pass replace=True

A function an entry refers to may be given as ``"module:name"`` (``load_ref``), imported when
first used, so that a table stays cheap to import (the built-in algorithms' updates need torch,
their config check must not).

A plug-in is a module that registers entries when imported. ``load_plugins`` imports the modules
named (by ``--plugin``, by ``FLATLM_PLUGINS``, by the ``flatlm.plugins`` entry-point group of an
installed package); the command lines call it before they build their parsers, and the sweeps
carry the list into every Ray worker, which calls it before it builds its trial. This module
reads no environment variable: the entry points pass ``FLATLM_PLUGINS``'s value in.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from pathlib import PurePath
from typing import Any, Generic, TypeVar

T = TypeVar("T")

PLUGINS_ENV = "FLATLM_PLUGINS"  # comma-separated modules to import, in every flatlm process
ENTRY_POINT_GROUP = "flatlm.plugins"  # an installed package's modules to import, likewise

# A function, or "module:name" for one imported when first used
Ref = Callable | str


def load_ref(ref: Ref) -> Any:
    """The object ``ref`` is, or names as ``"module:name"`` (the module imported now)."""
    if not isinstance(ref, str):
        return ref
    module, name = _split(ref)
    # an imported module from sys.modules: torch.compile traces that lookup, but breaks the graph
    # at import_module (word_logits asks the architecture registry inside the compiled loss)
    loaded = sys.modules.get(module)
    try:
        return getattr(loaded if loaded is not None else importlib.import_module(module), name)
    except AttributeError:
        raise ValueError(f"{ref!r}: module {module} has no {name!r}") from None


def check_ref(ref: Any) -> bool:
    """Whether ``ref`` is a callable or of the form ``"module:name"``."""
    if callable(ref):
        return True
    module, colon, name = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    return bool(module and colon and name and ":" not in name)


def _split(ref: str) -> tuple[str, str]:
    module, _, name = ref.partition(":")
    if not module or not name or ":" in name:
        raise ValueError(f"{ref!r}: write 'module:name', e.g. 'mypackage.steps:sign_step'")
    return module, name


class LazyRef:
    """A callable standing for the function at ``"module:name"``, imported on its first call;
    equal to another for the same place (an entry's hooks compare by where they point)."""

    __slots__ = ("where",)

    def __init__(self, where: str):
        _split(where)
        self.where = where

    def resolve(self) -> Callable:
        return load_ref(self.where)

    def __call__(self, *args, **kwargs) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"hook({self.where!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, LazyRef) and other.where == self.where

    def __hash__(self) -> int:
        return hash(self.where)

    def __reduce__(self):
        return (LazyRef, (self.where,))


class Registry(MutableMapping, Generic[T]):
    """name -> entry, in registration order. ``register`` and ``lookup`` are the checked verbs;
    the mapping methods are the plain table (``registry[name] = entry`` sets without checks, as
    a test's ``monkeypatch.setitem`` does)."""

    def __init__(self, what: str, *, key: str, how_to_add: str,
                 check: Callable[[str, T], None] | None = None):
        self.what = what  # what an entry is, for messages: "algorithm"
        self.key = key  # the config key or option naming an entry: "train.algorithm"
        self.how_to_add = how_to_add  # the verb that adds one, for the unknown-name message
        self._check = check  # (name, entry) -> None, raising ValueError on a bad entry
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Adds ``entry`` as ``name`` (after those registered) and returns it. A name taken by
        another entry is a ValueError unless ``replace``, which puts the new entry in the old
        one's place; the same entry again is a no-op."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.what} name {name!r}: use a non-empty string")
        if name in self._entries and not replace and self._entries[name] is not entry:
            raise ValueError(f"{self.what} {name!r} is registered already; choose another name, "
                             "or pass replace=True")
        if self._check is not None:
            self._check(name, entry)
        self._entries[name] = entry
        return entry

    def add(self, entry: T, kind: type, verb: str, *, replace: bool = False) -> T:
        """``register`` of an entry that carries its name (``entry.name``), after checking it is
        a ``kind``: what each ``register_<what>`` verb of a named entry is (``verb`` names it in
        the TypeError)."""
        if not isinstance(entry, kind):
            article = "an" if kind.__name__[0] in "AEIOU" else "a"
            raise TypeError(f"{verb}: expected {article} {kind.__name__}, got {entry!r}")
        return self.register(entry.name, entry, replace=replace)

    def lookup(self, name: str) -> T:
        """The entry ``name``; a ValueError listing the known names and how to add one."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(self.unknown_message(name)) from None

    def unknown_message(self, name: Any) -> str:
        return (f"{self.key}={name!r}: use one of {', '.join(self._entries)} (add one with "
                f"{self.how_to_add})")

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __setitem__(self, name: str, entry: T) -> None:
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what}: {', '.join(self._entries)})"


# ------------------------------------------------------------------------------ plug-ins

def plugin_modules(given: Iterable[str] = (), env_value: str | None = None) -> tuple[str, ...]:
    """The plug-in modules a process imports, each once in order: those of the ``flatlm.plugins``
    entry points of installed packages, then ``env_value`` (``FLATLM_PLUGINS``: comma-separated),
    then ``given`` (``--plugin``)."""
    return tuple(plugin_origins(given, env_value))


def plugin_origins(given: Iterable[str] = (), env_value: str | None = None) -> dict[str, str]:
    """``plugin_modules``, each with where it was named (``--plugin``, ``FLATLM_PLUGINS``, an
    entry point), for the message of one that does not import; the first naming counts."""
    named = [(ep.value.partition(":")[0], f"the {ENTRY_POINT_GROUP!r} entry point {ep.value!r}")
             for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    named += [(m, PLUGINS_ENV) for m in (env_value or "").split(",")]
    named += [(m, "--plugin") for m in given]
    origins: dict[str, str] = {}
    for module, origin in named:
        if module and module.strip():
            origins.setdefault(module.strip(), origin)
    return origins


_LOADED: list[str] = []  # the plug-in modules this process loaded, in order (loaded_plugins)


def load_plugins(modules: Iterable[str],
                 origins: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Imports each plug-in module (its import registers its entries) and returns their names;
    a module imported before is not imported again. One that cannot be imported (absent, given
    as a file path, importing a missing module, or raising) is a one-line ValueError naming it,
    where it was named (``origins[module]``: ``--plugin``, ``FLATLM_PLUGINS``; default both) and
    the fix. Every module loaded is kept in ``loaded_plugins()``, which the processes this one
    starts (data-parallel ranks, Ray workers) load in turn."""
    modules = tuple(modules)
    for module in modules:
        if module not in sys.modules:
            _import_plugin(module, (origins or {}).get(module, f"--plugin or {PLUGINS_ENV}"))
        if module not in _LOADED:
            _LOADED.append(module)
    return modules


def _import_plugin(module: str, origin: str) -> None:
    """Imports one plug-in; any failure a ValueError saying what went wrong and the fix (a
    plug-in's own exception would end the command in a traceback through this module)."""
    named = f"plug-in {module!r} ({origin})"
    if module.endswith(".py") or "/" in module or "\\" in module:
        path = PurePath(module)
        raise ValueError(f"{named} is a file path: give its module name ({path.stem}), with its "
                         f"directory ({path.parent}) on PYTHONPATH")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module + ".").startswith(e.name + "."):  # it, or its package
            raise ValueError(f"{named}: cannot import it ({e}); give an importable module "
                             "(installed, or on PYTHONPATH in every process of a sweep)") from None
        raise ValueError(f"{named} imports {e.name!r}, which is not installed: install it (in "
                         f"every process of a sweep), or leave the plug-in out") from None
    except Exception as e:  # whatever the plug-in's code raises
        raise ValueError(f"{named}: importing it raised {_what(e)} (at {_where(e)}): fix the "
                         "module, or leave it out") from None


def _what(e: BaseException) -> str:
    """``Type: message``, on one line (a syntax error's message without its place)."""
    text = e.msg if isinstance(e, SyntaxError) else str(e)
    first = text.strip().splitlines()[0] if text and text.strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _where(e: BaseException) -> str:
    """``file:line`` where ``e`` was raised (a syntax error: where its text is)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    frames = traceback.extract_tb(e.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "unknown"


def loaded_plugins() -> tuple[str, ...]:
    """The plug-in modules ``load_plugins`` imported in this process, in order."""
    return tuple(_LOADED)


def plugins_in(argv: Iterable[str]) -> list[str]:
    """The modules of every ``--plugin MODULE`` / ``--plugin=MODULE`` in a command line, read
    before its parser is built (a plug-in may add choices to it: a scale, an experiment)."""
    argv, found = list(argv), []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--plugin" and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith("--plugin="):
            found.append(arg.partition("=")[2])
    return found


def load_command_plugins(argv: Iterable[str], environ: MutableMapping[str, str]
                         ) -> tuple[str, ...]:
    """What an entry point (``flatlm``, a sweep script) calls before it builds its parser: loads
    the plug-ins of the installed entry points, of ``environ[FLATLM_PLUGINS]`` and of ``argv``'s
    ``--plugin`` options, and writes them all to ``environ[FLATLM_PLUGINS]`` (``environ``: the
    process's ``os.environ``), so that the processes it starts load them too."""
    origins = plugin_origins(plugins_in(argv), environ.get(PLUGINS_ENV))
    loaded = load_plugins(origins, origins)
    if loaded:
        environ[PLUGINS_ENV] = ",".join(loaded)
    return loaded


PLUGIN_HELP = ("a module to import first, which registers sources, algorithms, measurements, "
               "architectures, experiments or scales of its own (repeatable; also "
               f"{PLUGINS_ENV}=A,B and the {ENTRY_POINT_GROUP!r} entry-point group); every "
               "process of the run imports it")
