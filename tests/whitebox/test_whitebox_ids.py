"""The one id rule, from inside: every entry point (the context, an adapter's resolution) applies the same
function (what users see of it: ``tests/core/test_ids.py``)."""

from __future__ import annotations

import enum

import pytest

from agentguard import MissingTaskError, task

from bad_ids import BAD_TASK_IDS, MAX_TASK_ID


@pytest.mark.parametrize(("value", "why"), BAD_TASK_IDS)
def test_whitebox_every_entry_point_applies_the_same_rule(value: object, why: str) -> None:
    from agentguard._context import check_task_id, id_problem
    from agentguard.integrations._common import resolve_task

    problem = id_problem(value, "the task id", MAX_TASK_ID)
    assert problem is not None and why in problem
    with pytest.raises(MissingTaskError, match=why) as info:
        check_task_id(value, source="the argument", tool="charge")
    assert "the tool was not run" in str(info.value)
    # an adapter's explicit callable and framework id go through the same function (None there means
    # "this framework has no id here", which is refused as a missing task id)
    with pytest.raises(MissingTaskError, match=why):
        resolve_task("charge", explicit=lambda v: v, context=value, fallback=None, scope=None, hint="-")
    with pytest.raises(MissingTaskError, match=why if value is not None else "no task id"):
        resolve_task("charge", explicit=None, context=value, fallback=lambda v: v, scope=None, hint="-")


class Kind(enum.StrEnum):
    ORDER = "order-7"


def test_whitebox_a_str_subclass_is_the_plain_string() -> None:
    from agentguard._context import check_task_id

    with task(Kind.ORDER) as t:
        assert type(t.task_id) is str and t.task_id == "order-7"
    assert type(check_task_id(Kind.ORDER, source="x", tool=None)) is str
