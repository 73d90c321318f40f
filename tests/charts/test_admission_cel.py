"""The chart's ValidatingAdmissionPolicies evaluated by a real CEL implementation (cel-python
from PyPI, with the Kubernetes CEL library functions the rules use, tests/charts/k8s_cel.py)
on the admission corpus (tests/admission/corpus.yaml). Lace's Rust validator judges the same
corpus in tests/admission_corpus.rs against the same expected fields, and here the real
`lace-agent validate` binary judges every CREATE case too: every verdict agrees, every rule
both passes and fails somewhere, and no rule errors on any case (an evaluation error would
reject the request with an unhelpful message)."""

import collections
import os
import pathlib
import subprocess

import jsonschema
import pytest
import yaml

import k8s_cel
from test_charts import ROOT, by_kind, render

CORPUS = yaml.safe_load((ROOT / "tests/admission/corpus.yaml").read_text())
API_VERSION = "lace.io/v1alpha1"


def with_api_version(obj):
    return {"apiVersion": API_VERSION, **obj}


@pytest.fixture(scope="module")
def chart():
    docs = render("helm3", "chart", "--set", "controller.srv6LocatorPrefix=2001:db8:100::/48")
    crds = {c["spec"]["names"]["kind"]: c for c in by_kind(docs, "CustomResourceDefinition")}
    policies = by_kind(docs, "ValidatingAdmissionPolicy")
    bound = {b["spec"]["policyName"] for b in by_kind(docs, "ValidatingAdmissionPolicyBinding")
             if b["spec"]["validationActions"] == ["Deny"]}
    assert {p["metadata"]["name"] for p in policies} == bound, "every policy is bound to Deny"
    return crds, [(p["metadata"]["name"], p["spec"], k8s_cel.CompiledPolicy(p["spec"]))
                  for p in policies]


def matching(policies, crd, operation):
    plural = crd["spec"]["names"]["plural"]
    for name, spec, compiled in policies:
        for rule in spec["matchConstraints"]["resourceRules"]:
            if (crd["spec"]["group"] in rule["apiGroups"] and plural in rule["resources"]
                    and operation in rule["operations"]):
                yield name, compiled
                break


def field(message):
    return message.split(": ", 1)[0]


def test_every_verdict_agrees_and_every_rule_is_exercised(chart):
    crds, policies = chart
    outcomes = collections.defaultdict(set)  # (policy, expression) -> {True, False}
    wrong = []
    for case in CORPUS["cases"]:
        obj = with_api_version(case["object"])
        old = with_api_version(case["oldObject"]) if "oldObject" in case else None
        fields = set()
        for name, compiled in matching(policies, crds[obj["kind"]],
                                       "UPDATE" if old else "CREATE"):
            for expression, passed, message in compiled.evaluate(obj, old):
                outcomes[(name, expression)].add(passed)
                if not passed:
                    fields.add(field(message))
        if fields != set(case["invalid"]):
            wrong.append(f"{case['name']}: CEL says {sorted(fields)}, corpus {case['invalid']}")
    assert not wrong, "\n".join(wrong)
    every_rule = {(name, v["expression"]) for name, spec, _ in policies
                  for v in spec["validations"]}
    assert set(outcomes) == every_rule, f"rules never evaluated: {every_rule - set(outcomes)}"
    one_sided = [f"{name}: {expr} was only ever {outcomes[(name, expr)]}"
                 for name, expr in sorted(every_rule) if outcomes[(name, expr)] != {True, False}]
    assert not one_sided, "\n".join(one_sided)


def test_corpus_objects_pass_the_crd_schemas(chart):
    # What the CEL rules see must be what the API server lets through its structural schema.
    crds, _ = chart
    for case in CORPUS["cases"]:
        for key in ("object", "oldObject"):
            if key in case:
                crd = crds[case[key]["kind"]]
                schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                jsonschema.validate(with_api_version(case[key]), schema)


def test_the_agent_binary_agrees_on_every_create_case(tmp_path):
    # `lace-agent validate` (load + validate_cluster) on the case's object with the context.
    binary = os.environ.get("LACE_AGENT", str(ROOT / "target" / "debug" / "lace-agent"))
    creates = [c for c in CORPUS["cases"] if "oldObject" not in c]
    assert len(creates) > 30
    wrong = []
    for i, case in enumerate(creates):
        d = tmp_path / str(i)
        d.mkdir()
        docs = [*CORPUS["context"], with_api_version(case["object"])]
        (d / "objects.yaml").write_text(yaml.safe_dump_all(docs))
        res = subprocess.run([binary, "validate", "--manifests", str(d)],
                             capture_output=True, text=True)
        if (res.returncode == 0) != (not case["invalid"]):
            wrong.append(f"{case['name']}: exit {res.returncode}, corpus {case['invalid']}: "
                         f"{res.stderr.strip().splitlines()[-1:] }")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("text,ok", [
    ("10.0.0.0/8", True), ("fd00::/64", True), ("10.0.0.1/8", True),  # host bits parse
    ("10.0.0.0/08", False), ("010.0.0.0/8", False), ("10.0.0.0/33", False),
    ("fe80::%eth0/64", False), ("::ffff:10.0.0.0/104", False), ("10.0.0.0", False),
])
def test_the_cidr_library_parses_like_the_api_server(text, ok):
    # The library's parsing decides verdicts: pin the Go netip semantics it mirrors.
    assert bool(k8s_cel.compile_expr(f"isCIDR('{text}')").evaluate({})) is ok
