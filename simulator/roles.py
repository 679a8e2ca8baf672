"""Pool roles: what an instance of a pool does with a request, as one registry of small records.

A role is read where behaviour differs, never compared as a string: the step loop reads
``hands_off`` once per instance (hot aggregates stay local to the loop), the PD proxy gives each
instance the fabric side of its role, crashes drop the queues a role keeps, the FP8 hazard strikes
the roles that decode, and the autoscaler's capacity counts the work a role does.  The scenario's
``pools[].role`` names one of :data:`ROLES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.registry import Registry


@dataclass(frozen=True)
class Role:
    """One pool role.  ``prefills``: runs prompts; ``decodes``: generates the output after the first
    token; ``hands_off``: after the prompt the instance holds its KV for a decode instance (PD prefill);
    ``pulls_kv``: prompts arrive as KV over the fabric (PD decode); ``fabric_side``: the side of the KV
    path the instance owns ("out", "in", or "" without one); ``encodes``: an image encoder (EPD), not a
    language-model instance."""

    name: str
    prefills: bool
    decodes: bool
    hands_off: bool = False
    pulls_kv: bool = False
    fabric_side: str = ""
    encodes: bool = False


ROLES: Registry[Role] = Registry(
    "pool role",
    (
        Role("colocated", prefills=True, decodes=True),
        Role("prefill", prefills=True, decodes=False, hands_off=True, fabric_side="out"),
        Role("decode", prefills=False, decodes=True, pulls_kv=True, fabric_side="in"),
        Role("encoder", prefills=False, decodes=False, encodes=True),
    ),
)
