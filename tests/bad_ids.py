"""The ids no store can hold, each with the words its refusal says: shared by the id rule's tests
(``tests/core/test_ids.py``, ``tests/whitebox/test_whitebox_ids.py``)."""

from __future__ import annotations

# The documented limits (README, "Ids").
MAX_TASK_ID, MAX_SCOPE, MAX_OPERATION = 1000, 255, 255

BAD_TASK_IDS: list[tuple[object, str]] = [
    ("", "non-blank"),
    ("   ", "non-blank"),
    ("\t\n", "non-blank"),
    ("a\x00b", "NUL"),
    ("ok\ud800", "lone surrogate"),
    ("x" * (MAX_TASK_ID + 1), "at most 1000"),
    (42, "must be a string, got int"),
    (True, "must be a string, got bool"),
    (4.0, "must be a string, got float"),
    (None, "must be a string, got NoneType"),
    (["t-1"], "must be a string, got list"),
    ({"id": "t-1"}, "must be a string, got dict"),
    (b"t-1", "must be a string, got bytes"),
]
