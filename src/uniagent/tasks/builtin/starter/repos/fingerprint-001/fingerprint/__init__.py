"""Stable fingerprints of JSON-like values and a cache keyed by them."""

from fingerprint.cache import ResultCache
from fingerprint.keys import canonical_json, fingerprint

__all__ = ["ResultCache", "canonical_json", "fingerprint"]
