"""Griffe extensions for the documentation build (configured in ``mkdocs.yml``); not part of the package.

- :class:`SphinxRoles`: the docstrings cross-reference in Sphinx style (``:class:`~a.B```, a
  paragraph ending in ``::`` before a literal block). Markdown has neither, so they are rewritten
  to Markdown code spans (``B``) and a plain colon before the rendering. Code spans, not links: a
  link to an object the reference does not render would be a broken link.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

#: ``:role:`target``` or ``:role:`~dotted.target``` (``~``: show the last component only)
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|ivar|cvar):`(~?)([^`]+)`")
#: a line ending in ``::`` (a Sphinx literal-block marker); a line that is only ``::`` disappears
_LITERAL_MARKER = re.compile(r"(?m)^([ \t]*)::[ \t]*$\n?|(?<=\S)::[ \t]*$")


def _role(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def markdown_docstring(text: str) -> str:
    """``text`` with Sphinx roles as Markdown code spans and ``::`` literal-block markers as ``:``."""
    text = _ROLE.sub(_role, text)
    return _LITERAL_MARKER.sub(lambda m: "" if m.group(1) is not None else ":", text)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring with :func:`markdown_docstring` before it is parsed."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Called by griffe for every loaded object."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
