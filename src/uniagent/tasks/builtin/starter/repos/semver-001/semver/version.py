"""The :class:`Version` type.

Precedence follows the Semantic Versioning 2.0.0 specification:

* ``MAJOR.MINOR.PATCH`` are compared numerically;
* a pre-release version has lower precedence than the associated normal
  version (``1.0.0-rc.1 < 1.0.0``);
* pre-release identifiers are compared one by one: identifiers consisting of
  only digits are compared numerically, others lexically in ASCII order, and
  numeric identifiers have lower precedence than alphanumeric ones; a larger
  set of identifiers wins if all preceding ones are equal;
* build metadata (``+...``) is ignored for precedence.
"""

from __future__ import annotations

import functools
import re

_VERSION = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@functools.total_ordering
class Version:
    __slots__ = ("build", "major", "minor", "patch", "prerelease")

    def __init__(self, major: int, minor: int = 0, patch: int = 0,
                 prerelease: tuple[str, ...] = (), build: tuple[str, ...] = ()) -> None:
        if min(major, minor, patch) < 0:
            raise ValueError("version numbers must be non-negative")
        self.major, self.minor, self.patch = major, minor, patch
        self.prerelease = tuple(prerelease)
        self.build = tuple(build)

    @classmethod
    def parse(cls, text: str) -> Version:
        m = _VERSION.match(text.strip())
        if not m:
            raise ValueError(f"invalid semantic version: {text!r}")
        major, minor, patch, pre, build = m.groups()
        return cls(int(major), int(minor), int(patch),
                   tuple(pre.split(".")) if pre else (),
                   tuple(build.split(".")) if build else ())

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    def _key(self) -> tuple:
        return (self.major, self.minor, self.patch, self.prerelease)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: Version) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"Version.parse({str(self)!r})"

    def bump(self, part: str) -> Version:
        """Next ``major``, ``minor`` or ``patch`` release (drops pre-release/build)."""
        if part == "major":
            return Version(self.major + 1)
        if part == "minor":
            return Version(self.major, self.minor + 1)
        if part == "patch":
            return Version(self.major, self.minor, self.patch + 1)
        raise ValueError(f"unknown part {part!r}")
