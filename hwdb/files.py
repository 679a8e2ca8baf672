"""One hardware-database file read and validated, every error naming the file, the field and the expected form."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ValidationError

from simulator.inputs import read_yaml


class HwdbError(ValueError):
    """A hardware-database file is malformed or a name is unknown."""


def _fmt_validation(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = e.get("input")
        msg = e["msg"].removeprefix("Value error, ")
        got_s = "" if isinstance(got, dict) or "(got " in msg else f" (got {got!r})"
        lines.append(f"  field '{loc}': {msg}{got_s}")
    return f"{path}: invalid hardware file:\n" + "\n".join(lines)


def read_data_yaml(path: Path) -> dict:
    data = read_yaml(path, HwdbError, "hardware file")
    if not isinstance(data, dict):
        raise HwdbError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def parse_file(path: Path, schema: type[BaseModel]):
    try:
        return schema.model_validate(read_data_yaml(path))
    except ValidationError as err:
        raise HwdbError(_fmt_validation(path, err)) from None
