"""`vgpu-operator simulate` on any input ends with one line on stderr and a non-zero
status, never a traceback: deeply nested JSON (it died in the YAML reader with
``RecursionError``), a structure that contains itself, a YAML alias bomb, bytes that are
not text, an integer too long to read, and values too long for a line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from vgpu_operator import simulation
from vgpu_operator.cli import main
from vgpu_operator.errors import ScenarioError


def _run(tmp_path: Path, content: str | bytes) -> Result:
    path = tmp_path / "scenario.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return CliRunner().invoke(main, ["simulate", str(path), "--now", "0"])


def _alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param(
            '{"nodes": [], "pods": [], "x": ' + "[" * 5000 + "]" * 5000 + "}",
            "nested deeper than 64 levels",
            id="deep-json",
        ),
        pytest.param(
            "x:\n" + "".join("  " * i + "- \n" for i in range(1, 400)), "nested", id="deep-yaml"
        ),
        pytest.param("a: &a [*a]\n", "contains itself", id="self-reference"),
        pytest.param(_alias_bomb(), "more than 5000000 values", id="alias-bomb"),
        pytest.param(b"\xff\xfe{}", "not UTF-8", id="binary"),
        pytest.param("nodes: []\nx: " + "1" * 5000 + "\n", "cannot be read", id="long-integer"),
    ],
)
def test_malformed_input_is_one_line_and_exit_two(
    tmp_path: Path, content: str | bytes, says: str
) -> None:
    result = _run(tmp_path, content)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert says in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_a_long_message_is_printed_on_one_bounded_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuses(*args: object, **kwargs: object) -> dict[str, object]:
        raise ScenarioError("pods[0]", "quotes\nits value: " + "y" * 5000)

    monkeypatch.setattr(simulation, "build_state", refuses)
    result = _run(tmp_path, '{"nodes": [], "pods": []}')
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1
    assert "quotes its value: yyy" in result.stderr
    assert len(result.stderr) < 700
    assert "more characters" in result.stderr


def test_an_engine_failure_is_one_line_and_a_failure_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise KeyError("something the engine did not expect")

    monkeypatch.setattr(simulation, "build_state", broken)
    result = _run(tmp_path, '{"nodes": [], "pods": []}')
    assert result.exit_code == 3
    assert result.stderr.startswith("error: simulating ")
    assert "KeyError" in result.stderr
    assert result.stderr.count("\n") == 1


def test_shared_values_within_the_bounds_are_read() -> None:
    """Aliases that stay within the bounds are fine (checked once per anchor, not per use)."""
    text = "limits: &l {nvidia.com/gpu: 1}\nnodes: []\npods: []\nmore: [*l, *l, *l]\n"
    assert simulation.parse_scenario(text)["more"][2] == {"nvidia.com/gpu": 1}


def test_nesting_at_the_bound_is_read_and_one_deeper_is_not() -> None:
    def nested(levels: int) -> str:
        # The scenario mapping is the first level.
        return '{"x": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"

    simulation.parse_scenario(nested(simulation.MAX_NESTING))
    with pytest.raises(ScenarioError, match="nested deeper"):
        simulation.parse_scenario(nested(simulation.MAX_NESTING + 1))
