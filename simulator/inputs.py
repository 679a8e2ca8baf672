"""One reading layer for every file the project accepts.

Scenarios, plan requests, regression suites and baselines, traces and length files, Hugging Face
``config.json`` files, hardware-database files, calibration bundles and app uploads all come through
here, so every one of them gets the same checks and the same kind of message:

* the path exists and is a file (a directory is "is a directory", not "no such file");
* the file is no larger than its limit (``MAX_YAML_BYTES`` for YAML: a scenario is a few kB, and
  pure-Python YAML parsing of megabytes takes seconds);
* the text is UTF-8 (a UTF-16 file, a latin-1 file or a binary file is named as such);
* YAML: anchors and aliases may not expand the document by more than ``ALIAS_BUDGET`` nodes (a
  "billion laughs" file fails at once), recursive aliases and duplicate keys are errors (the last
  key would otherwise silently win), nesting deeper than the parser can follow is an error;
* JSON: duplicate keys, ``NaN``/``Infinity`` and numbers that overflow to infinity are errors.

Each failure raises the caller's error class (``ScenarioError``, ``HwdbError``, ...; default
:class:`InputFileError`) with one paragraph naming the file, the line, the value and the fix.  This
module imports nothing from the project, so every package may use it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

MAX_YAML_BYTES = 1 * 2**20  # scenarios, plan requests, suites, hardware files: a few kB each
MAX_JSON_BYTES = 16 * 2**20  # config.json, baselines, bundle manifests
ALIAS_BUDGET = 10_000  # nodes that YAML aliases may add to a document


class InputFileError(ValueError):
    """A file cannot be read as the input it was given as; the message names file, line and fix."""


def check_file(path, error: type[Exception] = InputFileError, what: str = "file") -> Path:
    """``path`` as a Path once it is known to be an existing regular file (else ``error``)."""
    p = Path(path)
    try:
        if p.is_dir():
            raise error(f"{p}: is a directory, not a {what}; give the path of the {what} file itself")
        if not p.exists():
            parent = next((a for a in p.parents if a.exists()), None)
            hint = (
                f"; {parent} is a file, not a folder"
                if parent is not None and parent.is_file()
                else f"; check the path (relative paths start at {Path.cwd()})"
            )
            raise error(f"{p}: no such file{hint}")
        if not p.is_file():
            raise error(f"{p}: not a regular file (a device, pipe or socket); give a {what} file")
    except OSError as exc:  # e.g. a name too long, permission denied on a parent
        raise error(f"{p}: cannot be read ({exc.strerror or exc}); check the path") from None
    return p


def read_bytes(
    path, error: type[Exception] = InputFileError, what: str = "file", limit: int | None = MAX_JSON_BYTES
) -> bytes:
    """The bytes of ``path`` after :func:`check_file` and the size limit."""
    p = check_file(path, error, what)
    try:
        size = p.stat().st_size
        if limit is not None and size > limit:
            raise error(
                f"{p}: the {what} is {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit for "
                f"this kind of file; a {what} is normally a few kB: check that this is the right file"
            )
        return p.read_bytes()
    except OSError as exc:
        raise error(f"{p}: cannot be read ({exc.strerror or exc}); check its permissions") from None


def decode(data: bytes, origin: str, error: type[Exception] = InputFileError, what: str = "file") -> str:
    """``data`` as UTF-8 text, or ``error`` saying what the file seems to be instead."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise error(f"{origin}: the {what} is UTF-16 text; save it as UTF-8")
    if b"\x00" in data[:8192]:
        raise error(f"{origin}: the {what} is a binary file (it holds NUL bytes), not text; give the text {what}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(
            f"{origin} line {line}: the {what} is not UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}; latin-1 or another legacy encoding?); save it as UTF-8"
        ) from None


def read_text(
    path, error: type[Exception] = InputFileError, what: str = "file", limit: int | None = MAX_JSON_BYTES
) -> str:
    """The UTF-8 text of ``path`` after the file, size and encoding checks."""
    return decode(read_bytes(path, error, what, limit), str(path), error, what)


# ---------------------------------------------------------------- YAML


def _at(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


if TYPE_CHECKING:  # the mixin below goes into a yaml loader (Safe or CSafe): checked as one
    from yaml import SafeLoader as _LoaderBase
else:
    _LoaderBase = object


class _NoDuplicateKeys(_LoaderBase):
    """Loader mixin that rejects duplicate keys (the first reported where it repeats)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # unhashable key: the base class reports it
                    continue
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first given at {_at(first.start_mark)}); keep one of them",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


class _StrictLoader(_NoDuplicateKeys, yaml.SafeLoader):
    """The pure-Python loader: its messages are the ones users see for a broken file."""


# libyaml's parser (PyYAML's C extension, when built) reads the hardware database's ~60 files about
# 5x faster.  It builds the same nodes for a valid file; for an invalid one its wording differs, so
# a file it rejects is parsed again by the pure-Python loader, whose message is reported.
_FastLoader = type("_FastLoader", (_NoDuplicateKeys, yaml.CSafeLoader), {}) if hasattr(yaml, "CSafeLoader") else None


def _expanded_size(root, budget: int) -> int:
    """Nodes of the document once aliases are expanded, stopping once over ``budget``; a node that
    contains itself raises ValueError."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ValueError(node)
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > budget:
                break
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _count_nodes(root) -> int:
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            stack.extend(x for pair in n.value for x in pair)
    return len(seen)


TOO_DEEP = "nested too deeply to read"


def yaml_error(origin, exc) -> str:
    """``FILE: not valid YAML at line L, column C: problem``, with the line of the enclosing construct."""
    mark, ctx = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at {_at(mark)}" if mark else ""
    if ctx is not None and getattr(exc, "context", None):
        where += f" ({exc.context} started at {_at(ctx)})"
    return f"{origin}: not valid YAML{where}: {what}; fix the syntax there"


def parse_yaml(text: str, origin: str, error: type[Exception] = InputFileError):
    """YAML ``text`` as Python data with the checks of this module; ``origin`` names it in messages."""
    if _FastLoader is not None:
        try:
            return _parse_with(_FastLoader, text, origin, error)
        except Exception as exc:  # any other failure: the pure-Python loader words the message
            if isinstance(exc, error) and TOO_DEEP in str(exc):
                raise  # the pure-Python loader would take seconds (quadratic) to reach the same refusal
    return _parse_with(_StrictLoader, text, origin, error)


def _parse_with(loader_cls, text: str, origin: str, error: type[Exception]):
    loader = loader_cls(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        try:
            extra = _expanded_size(root, ALIAS_BUDGET + _count_nodes(root)) - _count_nodes(root)
        except ValueError as exc:
            node = exc.args[0]
            raise error(
                f"{origin} {_at(node.start_mark)}: an alias refers to the mapping or list that "
                f"contains it (a recursive anchor); write the value out instead"
            ) from None
        if extra > ALIAS_BUDGET:
            raise error(
                f"{origin}: anchors and aliases (*name) expand this document by more than "
                f"{ALIAS_BUDGET:,} values (a 'billion laughs' file?); write the values out or "
                f"use fewer aliases"
            )
        return loader.construct_document(root)
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(getattr(exc, "problem", "")):  # libyaml's limit of 1,000 levels
            raise error(
                f"{origin}: {TOO_DEEP} (thousands of levels of lists or mappings); a valid file is a few levels deep"
            ) from None
        raise error(yaml_error(origin, exc)) from None
    except error:
        raise
    except (ValueError, OverflowError) as exc:  # e.g. an integer of 5,000 digits
        what = (
            "a number has more than 4,300 digits"
            if "digits" in str(exc)
            else f"a value cannot be read ({str(exc)[:200]})"
        )
        raise error(f"{origin}: {what}; write numbers of ordinary size (in SI units)") from None
    except RecursionError:
        raise error(
            f"{origin}: {TOO_DEEP} (thousands of levels of lists or mappings); a valid file is a few levels deep"
        ) from None
    finally:
        loader.dispose()


def read_yaml(
    path, error: type[Exception] = InputFileError, what: str = "YAML file", limit: int | None = MAX_YAML_BYTES
):
    """Read and parse a YAML file with every check of this module."""
    return parse_yaml(read_text(path, error, what, limit), str(path), error)


# ---------------------------------------------------------------- JSON


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows; give a finite number")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{text} overflows a 64-bit float; give a number below 1.8e308")
    return x


def _unique_pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}; keep one of them")
        out[k] = v
    return out


def parse_json(text: str, origin: str, error: type[Exception] = InputFileError, what: str = "JSON file"):
    """JSON ``text`` as Python data; duplicate keys, NaN, Infinity and overflowing numbers are errors."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as exc:
        raise error(
            f"{origin} line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg}); fix the {what} there"
        ) from None
    except ValueError as exc:
        raise error(f"{origin}: {exc} (in the {what})") from None
    except RecursionError:
        raise error(f"{origin}: nested too deeply to read; a valid {what} is a few levels deep") from None


def read_json(
    path, error: type[Exception] = InputFileError, what: str = "JSON file", limit: int | None = MAX_JSON_BYTES
):
    """Read and parse a JSON file with every check of this module."""
    return parse_json(read_text(path, error, what, limit), str(path), error, what)


# ---------------------------------------------------------------- command-line numbers


def int_arg(lo: int, hi: int | None = None):
    """An argparse ``type``: a whole number in [lo, hi]; anything else is argparse's usage error (exit 2)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(
                f"{v} is out of range: give {lo} .. {hi}"
                if hi is not None
                else f"{v} is out of range: give at least {lo}"
            )
        return v

    return parse


def float_arg(lo: float, hi: float, lo_open: bool = False):
    """An argparse ``type``: a finite number in [lo, hi] (or (lo, hi] with ``lo_open``)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: give a finite number "
                f"{'above' if lo_open else 'from'} {lo:g} "
                f"{'up to' if lo_open else 'to'} {hi:g}"
            )
        return v

    return parse
