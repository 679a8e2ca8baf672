"""Pydantic validation errors as one paragraph a user can act on, and the input errors several
modules raise (:class:`WorkloadError`).

Every validated input (scenario, plan request) reports each error as ``location: message (got
value)``, where the location is written as the user wrote it (``pools[0].engine.max_num_seqs``,
discriminated-union tags left out) and an unknown key lists the keys valid at that place.
"""

from __future__ import annotations

import re
from textwrap import shorten
from typing import get_args

from pydantic import BaseModel, ValidationError


class WorkloadError(ValueError):
    """A valid-looking workload config cannot produce requests; the message says what to change.

    Here, below both the workload generator and the load shapes that raise it, so that neither
    has to import the other's module for it."""


def models_in(ann) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (through Optional, tuple, Union, Annotated)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in get_args(ann) for m in models_in(a)]


def location(loc: tuple, data) -> str:
    """``pools[0].engine.max_num_seqs`` from a pydantic location, without union tags."""
    out, node = "", data
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        if loc[i + 1 : i + 2] == ("[key]",):  # a mapping's key, not a value under it
            out += f" key {part!r}"
            node = None
            continue
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, (list, tuple)) and -len(node) <= part < len(node) else None
            continue
        part = str(part)
        if part.startswith("function-after"):
            continue
        if isinstance(node, dict) and part not in node and node.get("kind") == part:
            continue  # discriminated-union tag (e.g. arrival 'poisson'), not a key the user wrote
        out += f".{part}" if out else part
        node = node.get(part) if isinstance(node, dict) else None
    return out or "(top level)"


def known_keys(root: type[BaseModel], loc: tuple) -> list[str]:
    """The keys allowed in the mapping at pydantic location ``loc`` under ``root``, or [] if unsure."""
    models: list[type[BaseModel]] = [root]
    for part in loc:
        if isinstance(part, int) or str(part).startswith("function-after"):
            continue
        tagged = [
            m for m in models if m.model_fields.get("kind") is not None and m.model_fields["kind"].default == part
        ]
        if tagged:  # discriminated-union tag: pick that member
            models = tagged
            continue
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        models = [m for f in fields for m in models_in(f.annotation)]
        if not models:
            return []
    return sorted({k for m in models for k in m.model_fields}) if len(models) == 1 else []


def format_validation_error(
    err: ValidationError, data, *, root: type[BaseModel], origin: str, what: str, docs: str, locate=None, known=None
) -> str:
    """``origin: invalid WHAT:`` and one line per distinct error; ``docs`` is where every field is listed.

    ``locate(loc) -> str`` and ``known(loc) -> list[str]`` replace :func:`location` and
    :func:`known_keys` for inputs whose shape they don't follow (e.g. a regression suite's entries)."""
    locate = locate or (lambda loc: location(loc, data))
    known = known or (lambda loc: known_keys(root, loc))
    errors = err.errors()
    lines = []
    for e in errors:
        loc_ = e["loc"]
        if e["type"] == "too_short" and any(
            o["loc"][: len(loc_)] == loc_ and len(o["loc"]) > len(loc_) for o in errors
        ):
            continue  # a tuple whose items failed also reports "too short": noise next to the real error
        inp = e.get("input")
        got = "" if isinstance(inp, (dict, list)) or e["type"] == "missing" else f" (got {inp!r})"
        if isinstance(inp, (dict, list)) and e["type"].endswith("_type"):
            # a mapping or list where a scalar belongs: the errors are not under it, so show it (shortened)
            got = f" (got {shorten(repr(inp), 80, placeholder=' ...')})"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            msg = "required, but absent; add this key with a value"
        if e["type"] == "extra_forbidden":
            keys = known(loc_[:-1])
            msg = "unknown key; " + (
                f"valid keys here: {', '.join(keys)}" if keys else f"check the spelling against {docs}"
            )
        line = f"  {locate(loc_)}: {msg}{got}"
        if line not in lines:
            lines.append(line)
    return f"{origin}: invalid {what}:\n" + "\n".join(lines)


def os_error_message(exc: OSError) -> str:
    """``PATH: what went wrong; fix`` for an OSError met while reading or writing a user's path."""
    if exc.filename is None or exc.strerror is None:
        return str(exc)  # raised with a message of its own
    where, what = exc.filename, exc.strerror
    hint = {
        NotADirectoryError: "a part of the path is a file, not a folder: choose another path",
        IsADirectoryError: "it is a folder: give a file path",
        FileExistsError: "a file is in the way: choose another path or remove it",
        PermissionError: "check its permissions or choose another path",
        FileNotFoundError: "check the path",
    }.get(type(exc), "check the path")
    return f"{where}: {what}; {hint}"


def validation_message(err: ValidationError) -> str:
    """A pydantic error raised outside a file's validation (e.g. a command's options) as
    ``location: message (got value)`` lines, without pydantic's dump and documentation URL."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
        got = "" if isinstance(e.get("input"), (dict, list)) or e["type"] == "missing" else f" (got {e['input']!r})"
        msg = "required, but absent; give it" if e["type"] == "missing" else e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc + ': ' if loc else ''}{msg}{got}")
    return "invalid option: " + "; ".join(lines)


# Control characters but tab and newline (C0, DEL, C1): a message quoting what the user typed
# (``--gpu $'H\x1b[2J'``, a file name) would otherwise clear, retitle or rewrite the terminal.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with each control character but tab and newline written as its escape (``\\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def print_user_error(exc: BaseException, label: str = "error") -> int:
    """Print a user error on stderr as one paragraph and return the CLI's user-error exit code, 2.

    The message is printed as plain text: never rich markup (``pools[main]``) nor emoji codes
    (``:x:``) nor control characters (escaped, :func:`escape_controls`); ``soft_wrap``: no line breaks
    inserted, so the message pastes as one paragraph."""
    from rich.console import Console  # noqa: PLC0415 - rich (~30 ms) loads only when an error is printed
    from rich.text import Text  # noqa: PLC0415 - rich (~30 ms) loads only when an error is printed

    text = Text(f"{label}: ", style="red")
    text.append(
        escape_controls(
            os_error_message(exc)
            if isinstance(exc, OSError)
            else validation_message(exc)
            if isinstance(exc, ValidationError)
            else str(exc)
        )
    )
    Console(stderr=True, emoji=False, markup=False, highlight=False).print(text, soft_wrap=True)
    return 2
