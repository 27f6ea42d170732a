"""A registered key as the configuration gives it (`KeyConfig`): its one form, checked whole."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pg_advisory_exporter.durations import Duration
from pg_advisory_exporter.validation import KEY_NAME_PATTERN, Strict

from .derive import DIGESTS, HASHES, SERVER_HASHES, ByteOrder, Form, Hash, forms_of, template_error
from .key import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Level = Literal["session", "transaction"]


class KeyConfig(Strict):
    """One registered key: its name and exactly one of key, pair, namespace or text."""

    name: str = Field(pattern=KEY_NAME_PATTERN)
    key: Int64 | None = None
    pair: tuple[Int32, Int32] | None = None
    namespace: Int32 | None = None
    text: str | None = None
    hash: Hash | None = None
    seed: Int64 = 0
    form: Form = "bigint"
    byte_order: ByteOrder = "big"
    per_database: bool = False
    databases: tuple[str, ...] = ()
    level: Level | None = None
    long_lived: bool = False
    expect_held: bool = False
    max_hold: Duration | None = None

    @model_validator(mode="after")
    def _one_form(self) -> KeyConfig:
        forms = [f for f in ("key", "pair", "namespace", "text") if getattr(self, f) is not None]
        if len(forms) != 1:
            raise ValueError(
                "give exactly one of key, pair, namespace or text"
                + (f" (got {', '.join(forms)})" if forms else "")
            )
        if (self.text is None) != (self.hash is None):
            raise ValueError(f"text and hash go together: hash is one of {', '.join(HASHES)}")
        if self.seed and self.hash != "hashtextextended":
            raise ValueError("seed only applies to hash: hashtextextended")
        if self.hash is None:
            if self.form != "bigint" or self.byte_order != "big" or self.per_database:
                raise ValueError("form, byte_order and per_database only apply to text")
            return self
        if self.form not in forms_of(self.hash):
            raise ValueError(
                f"form {self.form} does not fit hash {self.hash}: "
                f"it can be {' or '.join(forms_of(self.hash))}"
            )
        if self.byte_order != "big" and self.hash not in DIGESTS:
            raise ValueError(
                f"byte_order only applies to a digest ({', '.join(sorted(DIGESTS))}), "
                f"not to {self.hash}"
            )
        if self.per_database:
            assert self.text is not None
            problem = template_error(self.text)
            if problem is not None:
                raise ValueError(f"text {self.text!r} per database: {problem}")
        return self

    @property
    def server_side(self) -> bool:
        """Whether only the server can compute it (hashtext, hashtextextended)."""
        return self.hash in SERVER_HASHES

    def describe(self) -> str:
        """The key as its entry wrote it, for messages."""
        if self.key is not None:
            return f"key {self.key}"
        if self.pair is not None:
            return f"pair ({self.pair[0]}, {self.pair[1]})"
        if self.namespace is not None:
            return f"namespace {self.namespace}"
        seed = f", {self.seed}" if self.hash == "hashtextextended" else ""
        how = [f"{self.hash}({self.text!r}{seed})"]
        if self.form != "bigint":
            how.append(f"as {'an' if self.form == 'int' else 'a'} {self.form}")
        if self.byte_order != "big":
            how.append(f"read {self.byte_order}-endian")
        if self.per_database:
            how.append("per database")
        return " ".join(how)
