"""The per-episode prefix store of `LocalEngine`: the keys/values of exact token ids, kept per sticky
request id under a byte budget, plus one shared prompt start (why: models/kv.py's docstring)."""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch


@dataclass(eq=False)
class Prefix:
    """The keys/values of exactly `ids` (one per token, in order), per layer."""

    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


MIN_SHARED = 32
"""Common prompt tokens below which sharing a prompt start is not worth it: a separate forward for
fewer costs more than it saves, and the shared entry serves no shorter match."""


class PrefixStore:
    """Per-request-id prefixes under a byte budget, least recently used evicted first, plus one shared
    prefix (see the module docstring).

    Only the engine's worker thread touches it. `take` removes the request's own entry: the running
    request owns its prefix until it finishes and `put`s the longer one back. The shared entry is
    never taken (rows copy it into their cache), only replaced, evicted last, or cleared.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: collections.OrderedDict[str, Prefix] = collections.OrderedDict()
        self.shared: Prefix | None = None
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _matches(self, request_id: str, prompt_ids: list[int]) -> tuple[int, int]:
        """(own, shared): how many leading prompt tokens each entry covers, the last token excluded."""
        cap = len(prompt_ids) - 1
        entry = self._entries.get(request_id)
        own = min(common_prefix(entry.ids, prompt_ids), cap) if entry is not None else 0
        shared = min(common_prefix(self.shared.ids, prompt_ids), cap) if self.shared is not None else 0
        return own, shared if shared >= MIN_SHARED else 0

    def match(self, request_id: str, prompt_ids: list[int]) -> int:
        """How many leading prompt tokens can be reused: the entry for `request_id` or the shared one
        (if it covers `MIN_SHARED` or more), whichever agrees with the prompt longer (zero when neither
        does), and the last prompt token is always run, for its logits."""
        return max(self._matches(request_id, prompt_ids))

    def take(self, request_id: str, prompt_ids: list[int]) -> Prefix | None:
        """Remove and return the request's own entry (the running request owns it now), or the shared
        entry where that covers more of `prompt_ids` (the own one is dropped)."""
        own, shared = self._matches(request_id, prompt_ids)
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
        return self.shared if shared > own else entry

    def put(self, request_id: str, prefix: Prefix) -> None:
        size = prefix.nbytes
        if size > self.budget_bytes:
            return
        old = self._entries.pop(request_id, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._make_room(size)
        self._entries[request_id] = prefix
        self.nbytes += size

    def share(self, prefix: Prefix) -> None:
        """Make `prefix` the shared entry (the old one goes)."""
        if self.shared is not None:
            self.nbytes -= self.shared.nbytes
            self.shared = None
        size = prefix.nbytes
        if size > self.budget_bytes:
            return
        self._make_room(size)
        self.shared = prefix
        self.nbytes += size

    def fit(self, limit: int) -> None:
        """Evict until at most `limit` bytes are kept (the memory budget's room for prefixes)."""
        limit = max(0, min(limit, self.budget_bytes))
        self._make_room(0, limit)

    def _make_room(self, size: int, limit: int | None = None) -> None:
        """Evict per-request entries, oldest first, then the shared one, until `size` more bytes fit
        under `limit` (default: the store's own cap)."""
        limit = self.budget_bytes if limit is None else limit
        while self._entries and self.nbytes + size > limit:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.nbytes
        if self.shared is not None and self.nbytes + size > limit:
            self.nbytes -= self.shared.nbytes
            self.shared = None

    def clear(self) -> None:
        self._entries.clear()
        self.shared = None
        self.nbytes = 0
