"""The one shape of every extension table (engines, sandboxes, tools, parsers, agents, task
families, context policies, wire protocols): a `Registry` of named entries.

An entry names where its object lives as a string, `"package.module:attr"`, imported only on the
first lookup, so a table costs no imports and an optional dependency loads only when its entry is
chosen (an entry above the table's layer may be named by string where an import may not be). An
entry may carry a one-line description (CLI help is made from it), a doctor check
(`"module:func"`, an `async def () -> list[(name, ok, detail)]` that `uniagent doctor` runs) and
an install hint shown when its import fails. A plugin may also register a ready object instead of
a string. Every lookup failure is one error (a `ConfigError` unless the table says otherwise)
naming the unknown name and the known ones, so the eight tables no longer each write their own.

This module imports nothing of the project but `errors`, so every layer can hold a table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from uniagent.errors import ConfigError, UniAgentError


@dataclass(frozen=True)
class Entry:
    """One line of a table. `target`: `"module:attr"` (or `"module"` where the table has a default
    attribute), or the object itself; `doctor`: `"module:func"` (`"module"` alone: its
    `doctor_check`); `install`: how to get the optional dependency, e.g. `pip install
    'uniagent[modal]'`."""

    target: Any
    help: str = ""
    doctor: str | None = None
    install: str | None = None

    @property
    def module(self) -> str:
        """The module the entry lives in ("" for a registered object)."""
        return self.target.partition(":")[0] if isinstance(self.target, str) else ""


def resolve(ref: str, default_attr: str | None = None) -> Any:
    """Import `"module:attr"` (`"module"` with `default_attr`) and return the attribute; a missing
    module propagates as `ModuleNotFoundError` for the caller to explain."""
    module, _, attr = ref.partition(":")
    attr = attr or default_attr or ""
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


class Registry(MutableMapping[str, Entry]):
    """Named entries of one extension point. Lines are `name: "module:attr"` or `name: Entry(...)`
    (assigning a plain string, as a test or a plugin may, makes an `Entry` of it).

    `what` names the kind of thing in messages ("sandbox type"); `error` is the error class a lookup
    raises; `key` normalises a name before lookup (the parsers ignore case and `-`/`_`);
    `default_attr` is the attribute of a target given as a bare module (engines: `KIND`)."""

    def __init__(
        self,
        what: str,
        entries: dict[str, str | Entry],
        *,
        error: type[UniAgentError] = ConfigError,
        key: Callable[[str], str] | None = None,
        default_attr: str | None = None,
    ) -> None:
        self.what = what
        self.error = error
        self.key = key or (lambda name: name)
        self.default_attr = default_attr
        self._entries: dict[str, Entry] = {}
        for name, entry in entries.items():
            self[name] = entry

    # -- the mapping (so a test can monkeypatch.setitem a line in and out) --------------------
    def __getitem__(self, name: str) -> Entry:
        return self._entries[self.key(name)]

    def __setitem__(self, name: str, entry: str | Entry) -> None:  # type: ignore[override]
        self._entries[self.key(name)] = entry if isinstance(entry, Entry) else Entry(entry)

    def __delitem__(self, name: str) -> None:
        del self._entries[self.key(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.key(name) in self._entries

    def copy(self) -> Registry:
        """A table with the same lines (to register into for a test and throw away)."""
        return Registry(
            self.what, dict(self._entries), error=self.error, key=self.key, default_attr=self.default_attr
        )

    # -- lookups --------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._entries)

    def unknown(self, name: str, known: str | None = None) -> UniAgentError:
        """The one error for a name the table does not hold: it names it and the known ones."""
        listing = known if known is not None else ", ".join(self._entries)
        return self.error(f"unknown {self.what} {name!r}; known: {listing}")

    def entry(self, name: str) -> Entry:
        """The line registered as `name`; an unknown name is the table's error (nothing imported)."""
        found = self._entries.get(self.key(name))
        if found is None:
            raise self.unknown(name)
        return found

    def load(self, name: str) -> Any:
        """Import and return the object of `name`. An unknown name, or an optional dependency that
        is not installed, is the table's error; the latter says how to install it. A line naming
        an attribute its module lacks is a defect of the table (AttributeError; a test resolves
        every line)."""
        entry = self.entry(name)
        if not isinstance(entry.target, str):
            return entry.target
        return self.resolve(name, entry.target)

    def resolve(self, name: str, ref: str) -> Any:
        """Import `ref` (`"module:attr"`) on behalf of entry `name` with `load`'s error mapping: a
        module not in this installation, or an optional dependency that is not installed, is the
        table's error naming `name` (with the entry's install hint). For an entry that names more
        than one object (a sandbox backend's class and its config class)."""
        entry = self._entries.get(self.key(name))
        try:
            return resolve(ref, self.default_attr)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            module = ref.partition(":")[0]
            if module == missing or module.startswith(missing + "."):
                raise self.error(
                    f"{self.what} {name!r} is registered as {module}, which is not in this installation"
                ) from None
            hint = (entry.install if entry else None) or f"pip install {missing}"
            raise self.error(
                f"{self.what} {name!r} needs the Python package {missing!r}: install it ({hint})"
            ) from None

    # -- what doctor and --help are made of ------------------------------------------------------
    def doctor_checks(self) -> list[tuple[str, str]]:
        """(name, `"module:func"`) of every entry that carries a doctor check, in table order."""
        out = []
        for name, entry in self._entries.items():
            if entry.doctor:
                ref = entry.doctor if ":" in entry.doctor else f"{entry.doctor}:doctor_check"
                out.append((name, ref))
        return out

    def field_type(self, check: Callable[[str], Any] | None = None) -> Any:
        """A config field's type naming a line of this table: `Annotated[str, AfterValidator]`,
        checked when the config is built, so a wrong name is an error at its key (`agent.kind: ...
        unknown agent kind ...; known: ...`). `check` (default: `entry`) raises the table's error
        for a bad value; one place turns it into the `ValueError` pydantic reports."""
        test = check or self.entry

        def validate(value: Any) -> Any:
            if isinstance(value, str):
                try:
                    test(value)
                except UniAgentError as exc:
                    raise ValueError(str(exc)) from None
            return value

        return Annotated[str, AfterValidator(validate)]

    def choices(self, sep: str = " | ") -> str:
        """The names with their one-line descriptions, for a CLI option's help."""
        return sep.join(f"{n} ({e.help})" if e.help else n for n, e in self._entries.items())
