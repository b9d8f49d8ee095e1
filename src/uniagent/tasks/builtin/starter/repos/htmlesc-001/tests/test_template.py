import pytest

from htmlesc import Markup, Template


def test_values_are_escaped():
    t = Template("<p>Hello, {name}!</p>")
    assert t.render(name="<script>") == "<p>Hello, &lt;script&gt;!</p>"


def test_raw_fields_and_markup_are_not_escaped():
    t = Template("<div>{body|raw}{footer}</div>")
    assert t.render(body="<b>x</b>", footer=Markup("<i>y</i>")) == "<div><b>x</b><i>y</i></div>"


def test_missing_values():
    with pytest.raises(KeyError, match="title"):
        Template("{title} {name}").render(name="x")
