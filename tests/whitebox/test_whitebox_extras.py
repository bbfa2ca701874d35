"""The helper that names a missing extra's install line, from inside (the lines users see:
``tests/core/test_extras.py``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.storeless  # imports only


def test_whitebox_the_helper() -> None:
    from agentguard._extras import MissingExtraError, install_line, missing, require

    assert install_line("pydantic-ai") == "pip install 'agentguard-idempotency[pydantic-ai]'"
    assert missing("json", "sqlite3") is None
    assert missing("json", "agentguard_no_such_module") == "agentguard_no_such_module"
    with pytest.raises(MissingExtraError) as caught:
        require("json", "agentguard_no_such_module", extra="x", by="this test")
    assert caught.value.name == "agentguard_no_such_module" and caught.value.extra == "x"
    assert isinstance(caught.value, ImportError)
    require("json", extra="x", by="this test")  # present: nothing happens
