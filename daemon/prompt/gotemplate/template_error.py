"""The one exception of the Go template engine."""
from __future__ import annotations


class TemplateError(ValueError):
    """A template that cannot be parsed or executed; the message names the construct and position."""
