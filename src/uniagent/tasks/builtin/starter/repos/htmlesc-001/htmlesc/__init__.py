"""HTML escaping helpers and a minimal auto-escaping template."""

from htmlesc.escape import Markup, escape, unescape
from htmlesc.template import Template

__all__ = ["Markup", "Template", "escape", "unescape"]
