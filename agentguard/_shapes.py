"""Key shapes: the downstream key written so that a provider accepts it (pure functions, no I/O); the
providers' limits and the rules are in :class:`KeyShape`'s docstring, which ``agentguard.downstream`` shows."""

from __future__ import annotations

import base64
import difflib
import re
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

Alphabet: TypeAlias = Literal["hex", "base32", "base64url"]

DIGEST_BITS = 192  # what a key holds: 48 hex digits of SHA-256
MIN_BITS = 160  # what a shaped key keeps at least
_BITS_PER_CHAR: dict[str, int] = {"hex": 4, "base32": 5, "base64url": 6}
_FULL: dict[str, int] = {"hex": 48, "base32": 39, "base64url": 32}  # characters that hold all 192 bits
_KEY = re.compile(r"ag_[0-9a-f]{48}")
_PREFIX = re.compile(r"[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class KeyShape:
    """How the downstream key is written for a provider that caps its length (or its alphabet).

    A downstream key (and every sub-key) is ``ag_`` and 48 hex digits: 192 bits of a SHA-256 digest in 51
    characters. Providers cap the length of an idempotency key, and a key they refuse protects nothing:

    ==========  =====  ======================================================================================
    shape       limit  the key the provider gets, and why that limit
    ==========  =====  ======================================================================================
    ``stripe``  255    the key as it is (51 characters): Stripe takes keys of up to 255 characters
    ``adyen``   64     the key as it is: Adyen's ``Idempotency-Key`` holds at most 64 characters
    ``square``  45     ``ag_`` and the same 192 bits in 39 base32 characters (42): Square's
                       ``idempotency_key`` holds at most 45 characters on CreatePayment and RefundPayment
    an int N    N      the key as it is if N >= 51; else ``ag_`` and base32, cut to N characters, as long as
                       that keeps 160 bits (N >= 35); below that, a KeyShape with ``prefix=""`` (32
                       characters) or ``alphabet="base64url"`` (27, case-sensitive)
    ==========  =====  ======================================================================================

    A shape re-writes the digest the key already holds, never a readable part of it: where the whole digest
    fits (the three providers above), two different keys have different shaped keys, by construction; where
    it must be cut, at least 160 bits are kept, the prefix counting for none. The same key gives the same
    shaped key in every process, on every attempt and on a takeover; a sub-key is shaped from the sub-key, so
    it fits the same limit and stays distinct. Letters are lower case (hex and base32): a provider that
    compares keys without regard to case still tells them apart; only ``base64url``, chosen by name, relies
    on case. The default shape is the key as it is, so no existing record or provider-held key changes.

    ``max_length``: the provider's limit, the prefix counted. ``alphabet``: ``"hex"``, ``"base32"`` (RFC 4648,
    lower case) or ``"base64url"`` (with ``-`` and ``_``); by default hex where the whole key fits, else
    base32. ``prefix``: written before the digest (letters, digits, ``_`` and ``-``); ``""`` for a provider
    that takes letters and digits only. ``name``: for messages. A shape that cannot keep 160 bits of the
    digest is refused here, when it is made. Calling a shape on a key (``SQUARE(key)``) writes it.
    """

    max_length: int
    alphabet: Alphabet | None = None
    prefix: str = "ag_"
    name: str | None = None
    chars: int = field(init=False, repr=False, compare=False)
    """Characters of the digest written after the prefix."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_length, int) or isinstance(self.max_length, bool) or self.max_length < 1:
            raise ValueError(f"a key shape's max_length must be a positive int, got {self.max_length!r}")
        if not isinstance(self.prefix, str) or not _PREFIX.fullmatch(self.prefix):
            raise ValueError(f"a key shape's prefix may hold letters, digits, '_' and '-' only, got {self.prefix!r}")
        alphabet = self.alphabet
        if alphabet is None:
            alphabet = "hex" if len(self.prefix) + _FULL["hex"] <= self.max_length else "base32"
            object.__setattr__(self, "alphabet", alphabet)
        if alphabet not in _BITS_PER_CHAR:
            raise ValueError(f"a key shape's alphabet is 'hex', 'base32' or 'base64url', got {alphabet!r}")
        chars = min(self.max_length - len(self.prefix), _FULL[alphabet])
        object.__setattr__(self, "chars", max(chars, 0))
        if self.bits < MIN_BITS:
            need = -(-MIN_BITS // _BITS_PER_CHAR[alphabet])
            raise ValueError(
                f"a key of at most {self.max_length} characters cannot hold {MIN_BITS} bits of the digest: "
                f"{alphabet} needs {need} characters for them, after the prefix {self.prefix!r} (at least "
                f"{need + len(self.prefix)} in all); shorten the prefix (prefix='') or take a denser alphabet "
                "(alphabet='base64url', if the provider's keys are case-sensitive)"
            )

    @property
    def bits(self) -> int:
        """Bits of the digest the shaped key holds (at most 192; the prefix counts for none)."""
        assert self.alphabet is not None
        return min(self.chars * _BITS_PER_CHAR[self.alphabet], DIGEST_BITS)

    @property
    def length(self) -> int:
        """The length of every key of this shape."""
        return len(self.prefix) + self.chars

    @property
    def keeps_the_key(self) -> bool:
        """Whether a key of this shape is the downstream key itself (``ag_`` and 48 hex digits)."""
        return self.alphabet == "hex" and self.prefix == "ag_" and self.chars == _FULL["hex"]

    def __call__(self, key: str) -> str:
        """``key`` (a downstream key or sub-key) written in this shape."""
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"{key!r} is not a downstream key agentguard derived ('ag_' and 48 hex digits)")
        if self.keeps_the_key:
            return key
        digits = key[3:]
        if self.alphabet == "hex":
            text = digits
        elif self.alphabet == "base32":
            text = base64.b32encode(bytes.fromhex(digits)).decode().rstrip("=").lower()
        else:
            text = base64.urlsafe_b64encode(bytes.fromhex(digits)).decode().rstrip("=")
        return self.prefix + text[: self.chars]


STRIPE = KeyShape(255, "hex", name="stripe")
ADYEN = KeyShape(64, "hex", name="adyen")
SQUARE = KeyShape(45, "base32", name="square")
SHAPES: dict[str, KeyShape] = {s.name: s for s in (STRIPE, ADYEN, SQUARE) if s.name}
"""The providers known by name; any other provider by its limit (an int) or a :class:`KeyShape`."""

SHORTEST = 3 + -(-MIN_BITS // _BITS_PER_CHAR["base32"])
"""The lowest limit a plain maximum length (an int) may give: ``ag_`` and 32 base32 characters, 160 bits."""

Shape: TypeAlias = "KeyShape | str | int | None"
"""A shape as every option takes it: a provider's name, a maximum length, a KeyShape, or None (the key as
it is, which is Stripe's shape)."""


def key_shape(shape: Shape) -> KeyShape:
    """The :class:`KeyShape` that ``shape`` names; a ValueError (TypeError for another type) says why not."""
    if shape is None:
        return STRIPE
    if isinstance(shape, KeyShape):
        return shape
    if isinstance(shape, str):
        found = SHAPES.get(shape)
        if found is None:
            raise ValueError(
                f"{unknown_shape(shape)}; for another provider give its maximum key length (an int) or a KeyShape"
            )
        return found
    if isinstance(shape, int) and not isinstance(shape, bool):
        return KeyShape(shape)
    raise TypeError(
        f"a key shape is a provider's name, a maximum length (int) or a KeyShape, got {type(shape).__name__}"
    )


def unknown_shape(name: str) -> str:
    near = difflib.get_close_matches(name.lower(), SHAPES, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return f"no key shape is named {name!r}: {hint}the named ones are {', '.join(map(repr, SHAPES))}"


def shaping(shape: Shape) -> KeyShape | None:
    """``key_shape(shape)``, or None where it leaves the key as it is (nothing to do on each call)."""
    resolved = key_shape(shape)
    return None if resolved.keeps_the_key else resolved


def shape_key(key: str, shape: Shape) -> str:
    """``key`` (a downstream key or sub-key) written in ``shape`` (see the module docstring)."""
    return key_shape(shape)(key)
