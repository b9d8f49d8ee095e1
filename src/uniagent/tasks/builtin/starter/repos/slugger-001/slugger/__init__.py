"""Turn human-written titles into URL-safe slugs."""

from slugger.core import slugify
from slugger.registry import SlugRegistry

__all__ = ["SlugRegistry", "slugify"]
