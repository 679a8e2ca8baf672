"""The one Registry class behind every named strategy kind (issue 36): its contract, and the five
registries built on it holding the same names, in the same order, as the plain dicts they replaced."""

from __future__ import annotations

import pytest

from simulator.ops.autoscale import POLICIES, KVUtilisation, QueueLength, SLOPredictive
from simulator.pd.flows import FLOWS, SGLangFlow, VLLMFlow
from simulator.plan.families import FAMILIES, Colocated, EncoderPrefillDecode, PrefillDecode
from simulator.registry import Registry, UnknownNameError
from simulator.roles import ROLES, Role
from simulator.routing import ROUTERS, LeastKV, LeastOutstanding, PrefixAware, RoundRobin, make_router


class Alpha:
    name = "alpha"


class Beta:
    name = "beta"


def test_decorator_returns_the_class_unchanged_and_keys_it_by_name():
    reg: Registry[type] = Registry("widget")

    @reg.register
    class Gamma:
        name = "gamma"

    assert reg.register(Alpha) is Alpha and reg["gamma"] is Gamma and reg.get("alpha") is Alpha
    assert Gamma.__name__ == "Gamma" and Gamma.name == "gamma"

    @reg.register(name="delta")  # an explicit name, not the declared one
    class Delta(Beta):
        """Beta's declared name, registered under another."""

    assert reg.get("delta") is Delta and "beta" not in reg and Delta.name == "beta"


def test_a_duplicate_name_is_refused_and_the_first_entry_kept():
    reg = Registry("widget", (Alpha,))

    class Other:
        name = "alpha"

    with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
        reg.register(Other)
    with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
        reg.register(Beta, name="alpha")
    assert reg["alpha"] is Alpha and reg.names() == ("alpha",)


def test_an_entry_without_a_usable_name_is_refused():
    reg = Registry("widget")
    with pytest.raises(TypeError, match="no 'name' attribute"):
        reg.register(object())
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register(Alpha, name="")
    with pytest.raises(TypeError, match="name="):
        reg.register()
    assert len(reg) == 0


def test_an_unknown_name_lists_the_known_ones():
    reg = Registry("widget", (Beta, Alpha))
    msg = "unknown widget 'zeta'; known widgets: ['alpha', 'beta']"
    for lookup in (reg.get, reg.__getitem__):
        with pytest.raises(UnknownNameError) as exc:
            lookup("zeta")
        assert str(exc.value) == msg
        assert isinstance(exc.value, KeyError) and isinstance(exc.value, ValueError)
    with pytest.raises(UnknownNameError, match="known widgets"):
        reg.get(["unhashable"])
    assert ["unhashable"] not in reg
    assert "policies" in str(pytest.raises(KeyError, POLICIES.__getitem__, "magic").value)


def test_mapping_style_reads_follow_registration_order():
    reg = Registry("widget", (Beta, Alpha))
    assert list(reg) == ["beta", "alpha"] and reg.names() == ("beta", "alpha") == tuple(reg.keys())
    assert sorted(reg) == ["alpha", "beta"] and ", ".join(reg) == "beta, alpha"
    assert reg.items() == (("beta", Beta), ("alpha", Alpha)) and reg.values() == (Beta, Alpha)
    assert "alpha" in reg and "gamma" not in reg and len(reg) == 2
    assert dict(reg.items()) == {"beta": Beta, "alpha": Alpha}
    assert not hasattr(reg, "__setitem__") and not hasattr(reg, "__delitem__")


# The five registries' entries as the plain dicts held them before the Registry class, in order.
EXPECTED = {
    "ROUTERS": (
        ROUTERS,
        {
            "round_robin": RoundRobin,
            "least_outstanding": LeastOutstanding,
            "least_kv": LeastKV,
            "prefix_aware": PrefixAware,
        },
    ),
    "POLICIES": (POLICIES, {"queue": QueueLength, "kv": KVUtilisation, "slo": SLOPredictive}),
    "ROLES": (ROLES, {"colocated": Role, "prefill": Role, "decode": Role, "encoder": Role}),
    "FLOWS": (FLOWS, {"vllm": VLLMFlow, "sglang": SGLangFlow}),
    "FAMILIES": (FAMILIES, {"colocated": Colocated, "pd": PrefillDecode, "epd": EncoderPrefillDecode}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_registry_is_a_registry_with_the_same_keys_and_entries(name):
    reg, expected = EXPECTED[name]
    assert isinstance(reg, Registry)
    assert reg.names() == tuple(expected)  # same keys, same order
    for key, want in expected.items():
        got = reg[key]
        # class registries hold the classes; the others one object (or record) of that class each
        assert got is want if name in ("ROUTERS", "POLICIES") else type(got) is want
        assert got.name == key


def test_roles_keep_their_fields():
    assert ROLES["prefill"] == Role("prefill", prefills=True, decodes=False, hands_off=True, fabric_side="out")
    assert ROLES["decode"] == Role("decode", prefills=False, decodes=True, pulls_kv=True, fabric_side="in")
    assert ROLES["encoder"].encodes and ROLES["colocated"].prefills and ROLES["colocated"].decodes


def test_make_router_keeps_its_value_error():
    with pytest.raises(
        ValueError,
        match=r"unknown router 'magic'; known routers: \['least_kv', 'least_outstanding', "
        r"'prefix_aware', 'round_robin'\]",
    ):
        make_router("magic", [])
    assert isinstance(make_router("round_robin", [object()]), RoundRobin)
