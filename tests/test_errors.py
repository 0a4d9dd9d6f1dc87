"""The error tree (worker/errors.py): one class per exit code, the same classes for the worker and the gateway."""

from __future__ import annotations

from worker import errors
from worker.envelope import ToolResult


def test_unknown_tool_keeps_the_name_asked_for() -> None:
    """UnknownTool is exit 64 with the name kept; the worker adds advice for the model, the gateway does not."""
    plain = errors.UnknownTool("tiket_lookup")
    advised = errors.UnknownTool("tiket_lookup", "Use one of the tools you were given.")
    assert plain.name == advised.name == "tiket_lookup"
    assert plain.message == "There is no tool named 'tiket_lookup'."
    assert advised.message == "There is no tool named 'tiket_lookup'. Use one of the tools you were given."
    envelope = ToolResult.failure("c-1", "tiket_lookup", plain)
    assert envelope.exit_code == 64 and envelope.error == {"type": "unknown_tool", "message": plain.message}


def test_every_error_class_has_its_own_exit_code() -> None:
    """Each exit code of the SPEC's table but 0 and 22 has exactly one family (a class and the refinements
    below it, which keep its code), and every class has a type of its own."""
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ToolError)]
    heads = [c for c in classes if c.__bases__[0] in (errors.RequestError, errors.TransportError)]
    assert all(c.exit_code == head.exit_code for head in heads for c in classes if issubclass(c, head))
    codes = {c.exit_code for c in heads}
    assert len(codes) == len(heads)
    # SPEC §4's table, but 0 and 22 (an answer, not an exception), and §14's 67 (the user must connect)
    assert codes == {3, 6, 7, 28, 35, 47, 52, 56, 63, 64, 65, 67, 69, 70, 75, 77, 78}
    concrete = [c for c in classes if c not in (errors.ToolError, errors.RequestError, errors.TransportError)]
    assert len({c.type for c in concrete}) == len(concrete)
