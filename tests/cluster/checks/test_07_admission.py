"""7. Admission by the real API server: an invalid Network is refused with the chart's
ValidatingAdmissionPolicy message, a CRD schema violation with the server's own message."""

from conftest import CheckFailed


def refused(cluster, manifest):
    p = cluster.run([cluster.kubectl, "apply", "-f", "-"], check=False, input=manifest)
    if p.returncode == 0:
        raise CheckFailed(f"expected the API server to refuse:\n{manifest}\nit accepted it: {p.stdout}")
    return p.stderr


def test_validating_admission_policy_refuses_an_invalid_network(cluster):
    err = refused(cluster, """apiVersion: lace.io/v1alpha1
kind: Network
metadata: {name: lace-check-bad}
spec:
  subnets: [{cidr: 10.250.0.1/16, blockPrefix: 24}]
""")
    assert "ValidatingAdmissionPolicy" in err and "spec.subnets[].cidr: host bits are set" in err, (
        f"expected the chart's ValidatingAdmissionPolicy message 'spec.subnets[].cidr: host bits are set', saw: {err}")


def test_schema_violation_is_refused_by_the_api_server(cluster):
    err = refused(cluster, """apiVersion: lace.io/v1alpha1
kind: NetworkRoutingPolicy
metadata: {name: lace-check-bad}
spec: {from: 5, to: system}
""")
    assert "spec.from" in err and "Invalid value" in err, (
        f"expected the API server's schema error naming spec.from, saw: {err}")
