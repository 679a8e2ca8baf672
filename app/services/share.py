"""Scenarios that leave the app: portable YAML (no server paths) and the scenario in the page's URL.

Pure Python (no Streamlit).  A session's uploads live in a private temporary folder on the server
(:func:`app.services.scenarios.new_upload_dir`); a scenario the user takes away names those files by
their file name instead, so it loads again with ``epdsim simulate`` beside them or through the app's
uploader together with them.  The URL form is the portable dict as compressed JSON in URL-safe
base64; reading one back is as careful as reading an upload (size, decompression and schema limits,
files confined to the shipped data).
"""

from __future__ import annotations

import base64
import copy
import json
import tempfile
import zlib
from pathlib import Path

import yaml

import hwdb
from app.services import scenarios
from app.services.scenarios import InputError
from simulator.inputs import parse_json

URL_PARAM = "scenario"
MAX_URL_CHARS = 16_000  # browsers and proxies cut URLs beyond a few tens of kB
MAX_JSON_BYTES = 256 * 1024  # what a link may expand to (a scenario is about 1 kB)
UPLOAD_PREFIX = "epdsim-uploads-"


def _upload_root(p: Path) -> Path | None:
    """The session upload folder ``p`` lies in (a ``epdsim-uploads-*`` folder in the temp dir), if any."""
    tmp = Path(tempfile.gettempdir()).resolve()
    try:
        rel = p.resolve().relative_to(tmp)
    except (ValueError, OSError, RuntimeError):
        return None
    return tmp / rel.parts[0] if rel.parts and rel.parts[0].startswith(UPLOAD_PREFIX) else None


def uploaded_files(d: dict) -> list[str]:
    """File names of this session's uploads that scenario ``d`` reads (traces, length files, a model)."""
    out = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("path", "model") and isinstance(v, str) and _upload_root(Path(v)) is not None:
                    out.append("config.json" if k == "model" else Path(v).name)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(d)
    return out


def portable(d: dict) -> dict:
    """``d`` without server paths: uploaded files named by their file name (an uploaded model by
    ``config.json``), the app's own hardware folders (the user folder, the shipped data) left out."""
    out = copy.deepcopy(d)

    def walk(node):
        if isinstance(node, dict):
            for k, v in list(node.items()):
                if k == "path" and isinstance(v, str) and _upload_root(Path(v)) is not None:
                    node[k] = Path(v).name
                elif k == "model" and isinstance(v, str) and _upload_root(Path(v)) is not None:
                    node[k] = "config.json"
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    if "hwdb" in out:
        drop = {scenarios.user_hwdb_dir().resolve(), Path(hwdb.db.DATA_DIR).resolve()}
        dirs = out["hwdb"] if isinstance(out["hwdb"], list) else [out["hwdb"]]
        keep = [h for h in dirs if not (isinstance(h, str) and (Path(h).resolve() in drop or _upload_root(Path(h))))]
        if keep:
            out["hwdb"] = keep
        else:
            del out["hwdb"]
    return out


def portable_yaml(d: dict) -> str:
    """:func:`portable` as YAML, with a header naming the uploaded files it needs beside it."""
    files = uploaded_files(d)
    head = ""
    if files:
        head = (
            "# Reads uploaded files by name: keep "
            + ", ".join(dict.fromkeys(files))
            + " beside this file (epdsim simulate), or upload them with it in the app.\n"
        )
    return head + yaml.safe_dump(portable(d), sort_keys=False, allow_unicode=True)


def encode(d: dict) -> str:
    """``d`` (made :func:`portable`) as a URL parameter value: compact JSON, zlib, URL-safe base64."""
    # default=str: YAML may hold dates or other non-JSON scalars; the schema reads them back as text
    raw = json.dumps(portable(d), separators=(",", ":"), ensure_ascii=False, default=str).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def decode(text: str) -> dict:
    """A scenario dict from :func:`encode`'s text, validated; InputError for a damaged or hostile link.

    The scenario may read only the shipped examples and hardware data (no upload folder comes with
    a link), checked before anything is read."""
    what = "the scenario in this page's link"
    if len(text) > MAX_URL_CHARS:
        raise InputError(
            f"{what} is {len(text):,} characters, over the {MAX_URL_CHARS:,} a link may carry; "
            f"load the scenario as a YAML file instead"
        )

    def damaged(why: str) -> InputError:
        return InputError(
            f"{what} is damaged ({why}); it was probably cut when copied. Open the app without "
            f"it (the default scenario) or load a YAML file"
        )

    try:
        packed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        z = zlib.decompressobj()
        raw = z.decompress(packed, MAX_JSON_BYTES)
    except (ValueError, zlib.error) as exc:
        raise damaged(f"{type(exc).__name__}: {exc}") from None
    if z.unconsumed_tail:
        raise InputError(f"{what} expands to over {MAX_JSON_BYTES // 1024} kB; it is not one the app wrote")
    if not z.eof:
        raise damaged("the compressed data ends early")
    try:
        d = parse_json(raw.decode("utf-8"), "link", InputError, "scenario")
    except (InputError, UnicodeDecodeError) as exc:
        raise damaged(str(exc)) from None
    if not isinstance(d, dict):
        raise InputError(f"{what} is not a scenario (a {type(d).__name__}); open the app without it")
    d = scenarios.sandbox(d, None, "link")
    scenarios.to_scenario(d, origin="link")
    return d
