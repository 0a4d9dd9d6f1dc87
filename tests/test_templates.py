"""Template parsing: `${arg}`, `${env:NAME}`, `${env:NAME:-default}`, the `$${` escape and syntax errors."""

from __future__ import annotations

import pytest

from worker.definitions.templates import Arg, Env, MissingEnv, Template, TemplateSyntaxError, resolve_env


def test_plain_text_is_one_literal() -> None:
    """Text without placeholders parses to a single literal part."""
    template = Template.parse("/tickets/open")
    assert template.parts == ("/tickets/open",)
    assert template.arg_names == () and template.env_names == ()
    assert template.source == "/tickets/open"


def test_empty_text_has_no_parts() -> None:
    """An empty template has no parts at all."""
    assert Template.parse("").parts == ()
    assert Template.literal("").parts == ()


def test_argument_placeholder() -> None:
    """`${name}` between literals is an argument part."""
    template = Template.parse("/tickets/${ticket_id}/comments")
    assert template.parts == ("/tickets/", Arg("ticket_id"), "/comments")
    assert template.arg_names == ("ticket_id",)


def test_several_arguments_in_order() -> None:
    """Every placeholder is found, in the order written, adjacent ones included."""
    template = Template.parse("${a}${b}-${c}")
    assert template.parts == (Arg("a"), Arg("b"), "-", Arg("c"))
    assert template.arg_names == ("a", "b", "c")


def test_env_placeholder() -> None:
    """`${env:NAME}` is an environment part without a default."""
    template = Template.parse("Bearer ${env:SUPPORT_TOKEN}")
    assert template.parts == ("Bearer ", Env("SUPPORT_TOKEN"))
    assert template.env_names == ("SUPPORT_TOKEN",)
    assert template.arg_names == ()


def test_env_placeholder_with_default() -> None:
    """`${env:NAME:-default}` keeps the default text, which may itself contain colons."""
    template = Template.parse("${env:BASE_URL:-http://127.0.0.1:8765}")
    assert template.parts == (Env("BASE_URL", "http://127.0.0.1:8765"),)


def test_env_placeholder_with_empty_default() -> None:
    """`${env:NAME:-}` has an empty default, which differs from no default."""
    assert Template.parse("${env:OPTIONAL:-}").parts == (Env("OPTIONAL", ""),)
    assert Template.parse("${env:REQUIRED}").parts == (Env("REQUIRED", None),)


def test_escape_is_a_literal_placeholder() -> None:
    """`$${` renders as a literal `${` and the text after it is not a placeholder."""
    template = Template.parse("cost: $${price} for ${item}")
    assert template.parts == ("cost: ${price} for ", Arg("item"))
    assert template.arg_names == ("item",)


def test_escape_of_an_env_placeholder() -> None:
    """`$${env:X}` is literal text, not an environment lookup."""
    template = Template.parse("$${env:HOME}")
    assert template.parts == ("${env:HOME}",)
    assert template.env_names == ()


def test_lone_dollar_is_literal() -> None:
    """A `$` not followed by `{` is ordinary text."""
    assert Template.parse("price $5 and $x").parts == ("price $5 and $x",)


def test_whitespace_inside_placeholder_is_ignored() -> None:
    """`${ name }` names the argument `name`."""
    assert Template.parse("${ ticket_id }").arg_names == ("ticket_id",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${ticket_id}", "ticket_id"),
        ("${ ticket_id }", "ticket_id"),
        ("/t/${ticket_id}", None),
        ("${ticket_id}!", None),
        ("${a}${b}", None),
        ("${env:TOKEN}", None),
        ("$${ticket_id}", None),
        ("ticket_id", None),
        ("", None),
    ],
)
def test_single_arg_detection(text: str, expected: str | None) -> None:
    """`single_arg` is the argument name only when the template is exactly one `${name}`."""
    assert Template.parse(text).single_arg == expected


def test_literal_is_never_parsed() -> None:
    """`Template.literal` keeps `${...}` as text."""
    template = Template.literal("${not_an_arg}")
    assert template.parts == ("${not_an_arg}",)
    assert template.arg_names == ()


@pytest.mark.parametrize(
    "text",
    [
        "${}",
        "/t/${ }",
        "${env:}",
        "${env:1BAD}",
        "${env:BAD-NAME}",
        "${env:has space}",
    ],
)
def test_syntax_errors(text: str) -> None:
    """Empty placeholders and bad environment variable names are syntax errors."""
    with pytest.raises(TemplateSyntaxError):
        Template.parse(text)


@pytest.mark.parametrize("text", ["/tickets/${ticket_id", "Bearer ${env:TOKEN", "a ${b"])
def test_unterminated_placeholder_is_a_syntax_error(text: str) -> None:
    """An unterminated `${` is a syntax error (a literal `${` is written `$${`)."""
    with pytest.raises(TemplateSyntaxError):
        Template.parse(text)


def test_syntax_error_is_a_value_error() -> None:
    """TemplateSyntaxError is a ValueError naming the offending template."""
    with pytest.raises(ValueError, match="1BAD"):
        Template.parse("x ${env:1BAD}")


def test_resolve_env_prefers_the_environment() -> None:
    """A set variable wins over the default."""
    assert resolve_env(Env("TOKEN", "fallback"), {"TOKEN": "real"}) == "real"


def test_resolve_env_uses_the_default_when_unset() -> None:
    """An unset variable with a default resolves to the default, an empty default included."""
    assert resolve_env(Env("TOKEN", "fallback"), {}) == "fallback"
    assert resolve_env(Env("TOKEN", ""), {}) == ""


def test_resolve_env_uses_the_default_when_empty() -> None:
    """Like the shell's `${X:-d}`, a variable set to the empty string takes the default."""
    assert resolve_env(Env("TOKEN", "fallback"), {"TOKEN": ""}) == "fallback"


def test_resolve_env_missing_without_default() -> None:
    """An unset variable without a default raises MissingEnv naming it."""
    with pytest.raises(MissingEnv) as info:
        resolve_env(Env("SUPPORT_TOKEN"), {"OTHER": "x"})
    assert info.value.args == ("SUPPORT_TOKEN",)
