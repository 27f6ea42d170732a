"""The /locks page of one answer in one format, JSON or HTML, made once for all its requests."""

from __future__ import annotations

from dataclasses import dataclass

from . import page_html, page_json
from .answers import Answer

# Every value on the page comes from the server, and clients choose their own
# application_name and query text: each is escaped, and the page may run no script at all.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'"


@dataclass(frozen=True)
class Page:
    """One answer's page in one format, as bytes. The age of the answer, the one part that
    changes from one request to the next, goes between `parts` (an error has no age)."""

    status: str
    content_type: str
    parts: tuple[bytes, ...]

    @property
    def as_json(self) -> bool:
        return self.content_type == _JSON

    def body(self, age: float) -> list[bytes]:
        """The chunks to send: the parts themselves, never a copy of them per request."""
        if len(self.parts) == 1:
            return list(self.parts)
        before, after = self.parts
        written = page_json.age(age) if self.as_json else page_html.age(age)
        return [before, written.encode(), after]


def render(target: str, answer: Answer, as_json: bool) -> Page:
    """The page of `answer`; `target` names it where the answer is an error."""
    forensics = answer.forensics
    if forensics is None:
        if as_json:
            error = page_json.error(target, answer.error)
            return Page(_UNAVAILABLE, _JSON, (error.encode(),))
        page = page_html.error(target, answer.error or "")
        return Page(_UNAVAILABLE, _HTML, (page.encode(),))
    if as_json:
        parts, content_type = page_json.parts(forensics), _JSON
    else:
        parts, content_type = page_html.parts(forensics), _HTML
    return Page("200 OK", content_type, tuple(part.encode() for part in parts))


_UNAVAILABLE = "503 Service Unavailable"
_HTML = "text/html; charset=utf-8"
_JSON = "application/json"
